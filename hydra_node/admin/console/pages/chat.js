// Chat: a playground that streams from any model the mesh serves (`mesh` too, when listed),
// through this port's /v1/chat/completions, showing time to first token and tokens per second.
import { h, clear, num, notice } from '../dom.js';
import { request, getJson, readSse } from '../api.js';

const history = [];   // kept while the tab lives: {role, content}

export function mount(root, live) {
  const modelSel = h('select', { id: 'chat-model', 'aria-label': 'Model' });
  const maxTok = h('input', { id: 'chat-max', type: 'number', min: 1, max: 4096, value: 256, 'aria-label': 'Max tokens' });
  const temp = h('input', { id: 'chat-temp', type: 'number', min: 0, max: 2, step: 0.1, value: 0.7, 'aria-label': 'Temperature' });
  const system = h('input', { id: 'chat-system', type: 'text', placeholder: 'System prompt (optional)', 'aria-label': 'System prompt' });
  const log = h('div', { id: 'chat-log', class: 'chat-log', 'aria-live': 'polite' });
  const input = h('textarea', { id: 'chat-input', rows: 3, placeholder: 'Say something… (Ctrl+Enter sends)', 'aria-label': 'Message' });
  const send = h('button', { type: 'submit', id: 'chat-send' }, 'Send');
  const stop = h('button', { type: 'button', id: 'chat-stop', class: 'secondary', disabled: true }, 'Stop');
  const reset = h('button', { type: 'button', class: 'secondary', onclick: () => { history.length = 0; draw(); } }, 'New chat');
  const stats = h('p', { id: 'chat-stats', class: 'small muted', role: 'status' });
  const msg = h('div');
  let controller = null;

  root.append(h('h1', {}, 'Chat'),
    h('section', { class: 'card chat' },
      h('div', { class: 'inline' }, h('label', {}, 'Model ', modelSel), h('label', {}, 'Max tokens ', maxTok), h('label', {}, 'Temperature ', temp)),
      system, log, stats, msg,
      h('form', { class: 'chat-form', onsubmit: (ev) => { ev.preventDefault(); go(); } }, input, h('div', { class: 'actions' }, send, stop, reset))));
  input.addEventListener('keydown', (ev) => { if (ev.key === 'Enter' && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); go(); } });
  stop.addEventListener('click', () => controller && controller.abort());

  function bubble(m) { return h('div', { class: 'msg ' + m.role }, h('span', { class: 'who' }, m.role === 'user' ? 'You' : m.served ? `${m.model} · ${m.served}` : m.model || 'assistant'), h('div', { class: 'text' }, m.content)); }
  function draw() { clear(log, history.map(bubble)); log.scrollTop = log.scrollHeight; }

  async function loadModels() {
    try {
      const body = await getJson('/v1/models');
      const ids = (body.data || []).map((m) => m.id);
      const prev = modelSel.value;
      clear(modelSel, ids.map((id) => h('option', { value: id, selected: id === prev }, id === 'mesh' ? 'mesh (several models answer, one arbiter)' : id)));
      if (!ids.length) notice(msg, 'No model is served in the mesh yet.', 'error'); else notice(msg, '');
    } catch (e) { notice(msg, 'Cannot list models: ' + e.message, 'error'); }
  }

  async function go() {
    const text = input.value.trim();
    if (!text || controller) return;
    if (!modelSel.value) { notice(msg, 'Pick a model first.', 'error'); return; }
    notice(msg, '');
    history.push({ role: 'user', content: text });
    const answer = { role: 'assistant', content: '', model: modelSel.value };
    history.push(answer);
    input.value = '';
    draw();
    const textEl = log.lastChild.querySelector('.text');
    const whoEl = log.lastChild.querySelector('.who');
    const messages = [...(system.value.trim() ? [{ role: 'system', content: system.value.trim() }] : []),
      ...history.slice(0, -1).map(({ role, content }) => ({ role, content }))];
    controller = new AbortController();
    send.disabled = true; stop.disabled = false;
    const t0 = performance.now();
    let tFirst = null, pieces = 0, usage = null;
    try {
      const resp = await request('POST', '/v1/chat/completions', { model: modelSel.value, messages, stream: true,
        stream_options: { include_usage: true }, max_tokens: Number(maxTok.value) || 256, temperature: Number(temp.value) }, { signal: controller.signal });
      answer.served = resp.headers.get('x-hydra-served-by') || '';
      if (answer.served) whoEl.textContent = `${answer.model} · ${answer.served.split(',').map((id) => live.name(id.trim())).join(', ')}`;
      await readSse(resp, (rec) => {
        if (rec.data === '[DONE]') return;
        const chunk = JSON.parse(rec.data);
        if (chunk.error) throw new Error(chunk.error.message || 'stream error');
        if (chunk.usage) usage = chunk.usage;
        const delta = ((chunk.choices || [])[0] || {}).delta || {};
        if (delta.content) {
          if (tFirst === null) tFirst = performance.now();
          pieces++;
          answer.content += delta.content;
          textEl.textContent = answer.content;
          log.scrollTop = log.scrollHeight;
        }
      });
    } catch (e) {
      if (e.name !== 'AbortError') notice(msg, 'Chat failed: ' + e.message, 'error');
    }
    const t1 = performance.now();
    const tokens = usage ? usage.completion_tokens : pieces;
    const rate = tFirst !== null && t1 > tFirst && tokens > 1 ? (tokens - 1) / ((t1 - tFirst) / 1000) : null;
    stats.textContent = tFirst === null ? 'no tokens' : `TTFT ${num(tFirst - t0, 0)} ms · ${num(rate, 1)} tok/s · ${tokens} tokens${usage ? '' : ' (chunks)'}`;
    stats.dataset.ttft = tFirst === null ? '' : String(tFirst - t0);
    controller = null;
    send.disabled = false; stop.disabled = true;
  }

  loadModels();
  draw();
  return { update(what) { if (what === 'status' && !modelSel.options.length) loadModels(); } };
}
