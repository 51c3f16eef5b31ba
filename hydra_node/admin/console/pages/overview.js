// Overview: who this node is, its mesh, an invite button, and the load charts.
import { h, clear, section, duration, badge, notice } from '../dom.js';
import { postJson } from '../api.js';
import { lineChart } from '../chart.js';

export function loadCharts(live) {
  const pts = live.history;
  const series = (key) => pts.map((p) => [p.ts, p[key] === undefined ? null : p[key]]);
  return [
    lineChart('Tokens per second', [{ name: 'tok/s', points: series('tok_s') }]),
    lineChart('Time to first token', [{ name: 'p50', points: series('ttft_p50_ms') }, { name: 'p95', points: series('ttft_p95_ms') }], { unit: 'ms' }),
    lineChart('Queue depth', [{ name: 'queued', points: series('queue_depth') }]),
  ];
}

export function mount(root, live) {
  const facts = h('dl', { class: 'facts' });
  const peersBox = h('div');
  const charts = h('div', { class: 'charts' });
  const inviteOut = h('div', { class: 'invite-out' });
  const inviteBtn = h('button', { type: 'button', id: 'invite-btn', onclick: invite }, 'Create invite token');
  const source = h('p', { class: 'muted small' });
  root.append(h('h1', {}, 'Overview'),
    h('div', { class: 'grid' },
      section('This node', facts),
      section('Mesh', peersBox, h('div', { class: 'actions' }, inviteBtn), inviteOut)),
    section('Load', charts, source));

  async function invite() {
    inviteBtn.disabled = true;
    try {
      const r = await postJson('/api/invite', {});
      const box = h('textarea', { id: 'invite-token', readonly: true, rows: 4, 'aria-label': 'Invite token' }, r.token);
      const copy = h('button', { type: 'button', class: 'secondary', onclick: () => { box.select(); navigator.clipboard && navigator.clipboard.writeText(r.token).catch(() => {}); } }, 'Copy');
      clear(inviteOut, h('p', {}, `Valid until ${new Date(r.expires_at * 1000).toLocaleString()}; joins through ${r.addresses.join(', ')}.`),
        box, copy, h('p', { class: 'muted small' }, 'Start another node with: hydra-node serve --join <token>'));
    } catch (e) { notice(inviteOut, 'Invite failed: ' + e.message, 'error'); }
    inviteBtn.disabled = false;
  }

  let uptimeAt = 0;
  function update(what) {
    const st = live.status;
    if (st && (what === 'status' || what === undefined)) {
      uptimeAt = Date.now() / 1000 - (st.uptime_s || 0);
      const mesh = st.mesh || {};
      const rows = [
        ['Name', st.name || '–'], ['Node id', h('code', { class: 'wrap' }, st.node_id)], ['Version', st.version],
        ['State', badge(st.node_state)], ['Role', st.role], ['Uptime', h('span', { id: 'uptime' }, duration(st.uptime_s))],
        ['Models served', (st.serving_models || []).join(', ') || 'none'],
        ['In flight', String(st.inflight_requests || 0)],
      ];
      clear(facts, rows.flatMap(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
      const counts = {};
      for (const p of live.peers.values()) counts[p.state] = (counts[p.state] || 0) + 1;
      clear(peersBox, h('dl', { class: 'facts' },
        h('dt', {}, 'Mesh id'), h('dd', {}, h('code', { id: 'mesh-id' }, mesh.mesh_id || 'not in a mesh')),
        h('dt', {}, 'Listening'), h('dd', {}, (mesh.addresses || []).join(', ') || '–'),
        h('dt', {}, 'Peers'), h('dd', { id: 'peer-counts' }, Object.keys(counts).length
          ? Object.entries(counts).map(([s, n]) => h('span', { class: 'count' }, badge(s), ' ', n)) : 'none'),
        h('dt', {}, 'Links'), h('dd', {}, String(mesh.links || 0))));
      inviteBtn.disabled = !mesh.mesh_id;
    }
    if (what === 'history' || what === undefined || (what === 'status' && live.historySource !== 'node')) {
      clear(charts, loadCharts(live));
      source.textContent = live.historySource === 'node' ? 'From /api/history (5 s points).' : 'Sampled from /api/status by this page.';
    }
  }
  const tick = setInterval(() => { const el = document.getElementById('uptime'); if (el && uptimeAt) el.textContent = duration(Date.now() / 1000 - uptimeAt); }, 1000);
  update();
  return { update, unmount() { clearInterval(tick); } };
}
