// Mesh: a topology graph (this node in the middle, peers on rings, a line per link with its RTT)
// beside a searchable table; readable at 100+ peers (labels give way to tooltips and the table).
import { h, clear, section, table, row, badge, num, short } from '../dom.js';
import { lineChart } from '../chart.js';

const NS = 'http://www.w3.org/2000/svg';
const LABEL_MAX = 40, RTT_LABEL_MAX = 16;
const RANK = { alive: 0, suspect: 1, dead: 2, left: 3 };   // table and rings: the living first

function s(tag, attrs, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// Ring layout: as many rings as needed, each holding peers spaced at least `gap` apart.
export function ringLayout(n, size) {
  const c = size / 2, out = [];
  const nodeR = n > 60 ? 5 : n > 20 ? 8 : 14;
  const gap = nodeR * 2.6;
  let placed = 0, ring = 1;
  const rings = [];
  while (placed < n) {
    const radius = Math.min(c - nodeR - 24, 120 + (ring - 1) * (gap + 6));
    const cap = Math.max(6, Math.floor((2 * Math.PI * radius) / gap));
    const take = Math.min(cap, n - placed);
    rings.push({ radius, take });
    placed += take;
    ring++;
    if (rings.length > 12) { rings[rings.length - 1].take += n - placed; placed = n; }
  }
  for (const { radius, take } of rings) {
    for (let i = 0; i < take; i++) {
      const a = -Math.PI / 2 + (2 * Math.PI * i) / take + (rings.length > 1 ? radius / 97 : 0);
      out.push({ x: c + radius * Math.cos(a), y: c + radius * Math.sin(a), r: nodeR });
    }
  }
  return out;
}

function peerLabel(live, p) { return live.name(p.id); }

function modelsOf(p) {
  const st = p.model_states || {};
  return (p.models || []).map((m) => `${m}${st[m] && st[m] !== 'ready' ? ' (' + st[m] + ')' : ''}`).join(', ');
}

export function mount(root, live) {
  const SIZE = 520;
  const svg = s('svg', { viewBox: `0 0 ${SIZE} ${SIZE}`, class: 'topology', role: 'group', 'aria-label': 'Mesh topology' });
  const search = h('input', { type: 'search', id: 'peer-search', placeholder: 'Filter by name, id, state, model…', 'aria-label': 'Filter peers' });
  const tableBox = h('div', { id: 'peer-table' });
  const summary = h('p', { class: 'muted small', id: 'mesh-summary' });
  const rttBox = h('div', { class: 'charts' });
  let selected = null;
  search.addEventListener('input', () => update('filter'));
  root.append(h('h1', {}, 'Mesh'),
    h('div', { class: 'split' },
      section('Topology', h('div', { class: 'topo-wrap' }, svg), summary,
        h('p', { class: 'legend-row small' }, badge('alive'), badge('suspect'), badge('dead'), badge('left'),
          ' line: link (dashed: known, no direct link); label: RTT')),
      section('Peers', search, tableBox)),
    section('Round-trip time per peer', rttBox));

  function select(id) { selected = selected === id ? null : id; search.value = selected ? selected : ''; update('filter'); }

  function drawGraph(self, peers) {
    const nodes = ringLayout(peers.length, SIZE);
    const c = SIZE / 2;
    const edges = s('g', { class: 'edges' }), dots = s('g', { class: 'nodes' });
    peers.forEach((p, i) => {
      const pos = nodes[i];
      const cls = 'edge st-' + p.state + (p.linked ? '' : ' unlinked');
      edges.append(s('line', { x1: c, y1: c, x2: pos.x, y2: pos.y, class: cls }));
      if (peers.length <= RTT_LABEL_MAX && p.rtt_ms !== null && p.rtt_ms !== undefined && p.linked) {
        edges.append(s('text', { x: (c + pos.x) / 2, y: (c + pos.y) / 2 - 3, class: 'rtt', 'text-anchor': 'middle' }, num(p.rtt_ms, 1) + ' ms'));
      }
      const g = s('g', { class: 'peer st-' + p.state + (selected === p.id ? ' selected' : ''), tabindex: 0, role: 'button',
        'data-id': p.id, 'aria-label': `${peerLabel(live, p)}: ${p.state}` });
      const load = p.queue_depth || 0;
      g.append(s('circle', { cx: pos.x, cy: pos.y, r: pos.r }));
      if (load > 0) g.append(s('circle', { cx: pos.x, cy: pos.y, r: pos.r + 3, class: 'load', 'stroke-width': Math.min(6, 1 + load) }));
      if ((p.models || []).length && pos.r >= 8) g.append(s('text', { x: pos.x, y: pos.y + 4, 'text-anchor': 'middle', class: 'count' }, String(p.models.length)));
      g.append(s('title', {}, `${peerLabel(live, p)} (${short(p.id)})\nstate: ${p.state}\nmodels: ${modelsOf(p) || 'none'}\nqueue: ${p.queue_depth ?? '–'}\nrtt: ${p.rtt_ms ?? '–'} ms`));
      if (peers.length <= LABEL_MAX) {
        const below = pos.y > c;
        g.append(s('text', { x: pos.x, y: pos.y + (below ? pos.r + 13 : -pos.r - 5), 'text-anchor': 'middle', class: 'label' }, peerLabel(live, p)));
      }
      g.addEventListener('click', () => select(p.id));
      g.addEventListener('keydown', (ev) => { if (ev.key === 'Enter' || ev.key === ' ') { ev.preventDefault(); select(p.id); } });
      dots.append(g);
    });
    const me = s('g', { class: 'peer self', 'aria-label': 'this node' });
    me.append(s('circle', { cx: c, cy: c, r: 20 }), s('text', { x: c, y: c + 4, 'text-anchor': 'middle', class: 'label self' }, self ? (self.name || short(self.node_id)) : 'this node'),
      s('title', {}, 'this node' + (self ? ` ${self.node_id}` : '')));
    clear(svg, edges, dots, me);
  }

  function update(what) {
    if (!['status', 'peer', 'filter', 'history', undefined].includes(what)) return;
    const st = live.status;
    const peers = [...live.peers.values()].sort((a, b) => (RANK[a.state] ?? 9) - (RANK[b.state] ?? 9)
      || peerLabel(live, a).localeCompare(peerLabel(live, b), undefined, { numeric: true }) || a.id.localeCompare(b.id));
    if (what !== 'history') drawGraph(st, peers);
    const q = search.value.trim().toLowerCase();
    const shown = q ? peers.filter((p) => [p.id, peerLabel(live, p), p.state, p.role, modelsOf(p), (p.addresses || []).join(' ')].join(' ').toLowerCase().includes(q)) : peers;
    const counts = {};
    for (const p of peers) counts[p.state] = (counts[p.state] || 0) + 1;
    summary.textContent = `${peers.length} peer${peers.length === 1 ? '' : 's'}: ` + Object.entries(counts).map(([k, v]) => `${v} ${k}`).join(', ');
    clear(tableBox, table(['Name', 'Id', 'State', 'Role', 'Models', 'Queue', 'RTT ms', 'Addresses'],
      shown.map((p) => row([peerLabel(live, p), h('code', { class: 'nowrap', title: p.id }, short(p.id)), badge(p.state), p.role || '–', modelsOf(p) || '–',
        p.queue_depth ?? '–', num(p.rtt_ms, 1), (p.addresses || []).join(', ')], { 'data-peer': p.id, 'data-state': p.state })),
      { empty: q ? 'no peer matches' : 'no peers yet: invite one from the overview', class: 'peers' }));
    if (what === 'history' || what === 'status' || what === undefined) {
      const ids = new Set();
      for (const pt of live.history) for (const id of Object.keys(pt.rtt_ms || {})) ids.add(id);
      const series = [...ids].slice(0, 8).map((id) => ({ name: live.name(id), points: live.history.map((pt) => [pt.ts, (pt.rtt_ms || {})[id] ?? null]) }));
      clear(rttBox, lineChart('RTT', series, { unit: 'ms' }), ids.size > 8 ? h('p', { class: 'muted small' }, `first 8 of ${ids.size} peers`) : null);
    }
  }
  update();
  return { update };
}
