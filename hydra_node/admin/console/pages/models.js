// Models: where each model is hosted and in what state, this node's runners (slots, queue,
// tok/s), split plans with their workers, speculative figures; load / unload / swap with confirmation
// through /api/runtime/models.
import { h, clear, section, table, row, badge, num, bytes, short, confirmAction, notice } from '../dom.js';
import { request } from '../api.js';

function placements(live) {
  // model -> [{host, id, state, local}]
  const out = new Map();
  const add = (model, host) => { if (!out.has(model)) out.set(model, []); out.get(model).push(host); };
  const st = live.status;
  if (st) for (const m of st.models || []) add(m.id, { id: st.node_id, name: st.name || short(st.node_id), state: m.state, local: true });
  for (const p of live.peers.values()) {
    for (const m of p.models || []) add(m, { id: p.id, name: live.name(p.id), state: p.state === 'alive' ? (p.model_states || {})[m] || 'announced' : `peer ${p.state}`, local: false });
  }
  return out;
}

export function mount(root, live) {
  const where = h('div'), local = h('div'), splits = h('div'), spec = h('div'), msg = h('div', { id: 'models-msg' });
  const loadInput = h('input', { id: 'load-model', type: 'text', placeholder: 'GGUF path, ID=PATH or bundled id', 'aria-label': 'Model to load', autocomplete: 'off' });
  const splitBox = h('input', { id: 'load-split', type: 'checkbox' });
  const loadBtn = h('button', { type: 'submit', id: 'load-btn' }, 'Load');
  const swapFrom = h('select', { id: 'swap-from', 'aria-label': 'Model to replace' });
  const swapTo = h('input', { id: 'swap-to', type: 'text', placeholder: 'new model', 'aria-label': 'Model to load instead', autocomplete: 'off' });
  const loadForm = h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); load(); } },
    loadInput, h('label', { class: 'check' }, splitBox, ' split over workers'), loadBtn);
  const swapForm = h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); swap(); } },
    swapFrom, h('span', {}, '→'), swapTo, h('button', { type: 'submit', id: 'swap-btn', class: 'secondary' }, 'Swap'));
  root.append(h('h1', {}, 'Models'),
    section('Where each model lives', where),
    section('On this node', local, h('h3', {}, 'Load a model here'), loadForm,
      h('h3', {}, 'Swap'), h('p', { class: 'muted small' }, 'Loads the new model, waits until it is ready, then unloads the old one.'), swapForm, msg),
    h('div', { class: 'grid' }, section('Split plans', splits), section('Speculative decoding', spec)));

  async function act(fn, okText) {
    try { const r = await fn(); notice(msg, okText(r)); } catch (e) { notice(msg, e.message, 'error'); }
    live.refreshSoon();
  }

  async function load() {
    const model = loadInput.value.trim();
    if (!model) { notice(msg, 'Name a model to load.', 'error'); return; }
    const body = { model };
    if (splitBox.checked) body.split = true;
    if (!await confirmAction(`Load ${model} on this node${body.split ? ', split over RPC workers' : ''}?`, 'Load')) return;
    await act(async () => (await request('POST', '/api/runtime/models', body)).json(), (r) => `Loading ${r.model || model}: ${r.state || 'started'}.`);
  }

  async function unload(id) {
    if (!await confirmAction(`Unload ${id}? Requests in flight on it end with an error.`, 'Unload')) return;
    await act(async () => (await request('DELETE', '/api/runtime/models/' + encodeURIComponent(id))).json(), () => `Unloaded ${id}.`);
  }

  async function swap() {
    const from = swapFrom.value, to = swapTo.value.trim();
    if (!from || !to) { notice(msg, 'Pick the model to replace and name the new one.', 'error'); return; }
    if (!await confirmAction(`Swap ${from} for ${to}? ${to} loads first; ${from} is unloaded once it is ready.`, 'Swap')) return;
    notice(msg, `Loading ${to}…`);
    await act(async () => {
      await request('POST', '/api/runtime/models', { model: to, wait: true, timeout_s: 600 });
      await request('DELETE', '/api/runtime/models/' + encodeURIComponent(from));
    }, () => `Swapped ${from} for ${to}.`);
  }

  function update(what) {
    if (what !== undefined && what !== 'status') return;   // events bring a status read soon after
    const st = live.status;
    const pl = placements(live);
    clear(where, table(['Model', 'Hosts'], [...pl.entries()].sort().map(([m, hosts]) => row([h('code', {}, m),
      h('ul', { class: 'hosts' }, hosts.map((x) => h('li', {}, x.local ? h('strong', {}, x.name) : x.name, ' ', badge(x.state))))], { 'data-model': m })),
      { empty: 'no model hosted anywhere in the mesh' }));
    const models = st ? st.models || [] : [];
    clear(local, table(['Model', 'State', 'Slots', 'Queue', 'tok/s', 'TTFT ms', 'Done / failed', 'Restarts', ''],
      models.map((m) => {
        const r = m.requests || {}, eng = m.engine || {};
        return row([h('code', {}, m.id), badge(m.state), `${m.in_flight ?? 0} / ${eng.parallel ?? '–'}`, `${m.queue_depth ?? 0} / ${m.queue_capacity ?? '–'}`,
          num(r.tokens_per_s), num(r.ttft_ms, 0), `${r.completed ?? 0} / ${r.failed ?? 0}`, String(m.restarts ?? 0),
          h('button', { type: 'button', class: 'danger small', 'data-unload': m.id, onclick: () => unload(m.id) }, 'Unload')],
          { 'data-local-model': m.id, 'data-state': m.state });
      }), { empty: 'this node hosts no model' }));
    const prev = swapFrom.value;
    clear(swapFrom, models.map((m) => h('option', { value: m.id, selected: m.id === prev }, m.id)));
    const plans = Object.values((st && st.splits) || {});
    clear(splits, plans.length ? plans.map((p) => h('div', { class: 'plan' },
      h('p', {}, h('code', {}, p.model), ' ', badge(p.state), ' ', p.split ? 'split' : `whole (${(p.plan || {}).reason || 'local'})`, ', ', bytes(p.size_bytes), `, ${p.n_layers ?? '–'} layers`,
        p.placement_error ? h('span', { class: 'bad' }, ' ' + p.placement_error) : null),
      table(['Device', 'Kind', 'Peer', 'Layers', 'Share', 'Memory'], ((p.plan || {}).devices || []).map((d) => row([d.name, d.kind,
        d.peer ? live.name(d.peer) : '–', (d.layers || []).join('–'), num((d.proportion || 0) * 100, 0) + ' %', bytes(d.bytes_estimate)]))))) : h('p', { class: 'muted' }, 'no hosted model'));
    const sp = (st && st.speculation) || {};
    const specRows = models.filter((m) => m.speculative).map((m) => {
      const x = m.speculative;
      return row([h('code', {}, m.id), x.draft || '–', x.speculating ? 'yes' : 'no', num(x.acceptance_rate, 2), String(x.k ?? '–'),
        `${x.accepted_tokens ?? 0} / ${x.draft_tokens ?? 0}`, `×${num(x.predicted_speedup, 2)} / ×${num(x.measured_speedup, 2)}`]);
    });
    clear(spec, h('p', {}, `strategy ${sp.strategy || 'off'}, mode ${sp.mode || 'off'}`, sp.draft_endpoint ? `, draft at ${sp.draft_endpoint}` : '',
      (sp.draft_peers || []).length ? `, draft peers: ${sp.draft_peers.map((p) => live.name(p.id || p)).join(', ')}` : ''),
      table(['Model', 'Draft', 'Speculating', 'Acceptance', 'k', 'Accepted / drafted', 'Speed-up predicted / measured'], specRows, { empty: 'no speculative decoding on this node' }));
  }
  update();
  return { update };
}
