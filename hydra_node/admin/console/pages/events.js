// Events: the node's live event stream, filterable by type group and text, pausable.
import { h, clear, clock } from '../dom.js';

const GROUPS = ['peer', 'model', 'runner', 'route', 'request', 'placement', 'events'];
const SHOWN = 300;

function summary(ev) {
  const skip = new Set(['id', 'ts', 'type']);
  return Object.entries(ev).filter(([k]) => !skip.has(k)).map(([k, v]) => `${k}=${typeof v === 'object' ? JSON.stringify(v) : v}`).join(' ');
}

export function mount(root, live) {
  const checks = GROUPS.map((g) => h('label', { class: 'check' }, h('input', { type: 'checkbox', checked: true, value: g, 'data-group': g }), ' ' + g));
  const text = h('input', { type: 'search', id: 'event-filter', placeholder: 'Filter text (node, model…)', 'aria-label': 'Filter events' });
  const pause = h('button', { type: 'button', class: 'secondary', id: 'event-pause', 'aria-pressed': 'false' }, 'Pause');
  const list = h('ol', { id: 'event-list', class: 'events', reversed: true });
  const info = h('p', { class: 'small muted', role: 'status' });
  let paused = false;
  pause.addEventListener('click', () => { paused = !paused; pause.textContent = paused ? 'Resume' : 'Pause'; pause.setAttribute('aria-pressed', String(paused)); if (!paused) update(); });
  for (const c of checks) c.firstChild.addEventListener('change', () => update());
  text.addEventListener('input', () => update());
  root.append(h('h1', {}, 'Events'), h('section', { class: 'card' }, h('fieldset', { class: 'inline' }, h('legend', {}, 'Types'), checks),
    h('div', { class: 'inline' }, text, pause), info, list));

  function update(what) {
    if (paused || ['status', 'history', 'error', 'peer'].includes(what)) return;
    const on = new Set(checks.filter((c) => c.firstChild.checked).map((c) => c.firstChild.value));
    const q = text.value.trim().toLowerCase();
    const rows = [];
    for (let i = live.events.length - 1; i >= 0 && rows.length < SHOWN; i--) {
      const ev = live.events[i];
      if (!on.has(String(ev.type).split('.')[0])) continue;
      const line = summary(ev);
      if (q && !(ev.type + ' ' + line).toLowerCase().includes(q)) continue;
      rows.push(h('li', { 'data-type': ev.type }, h('time', {}, clock(ev.ts)), ' ', h('span', { class: 'etype t-' + String(ev.type).split('.')[0] }, ev.type), ' ', h('span', { class: 'edata' }, line)));
    }
    info.textContent = live.stream === 'live' ? `${live.events.length} events received (newest first, ${SHOWN} shown at most)`
      : 'The event stream is not available; showing what arrived before. Status is polled meanwhile.';
    clear(list, rows.length ? rows : h('li', { class: 'muted' }, 'no event yet'));
  }
  update();
  return { update };
}
