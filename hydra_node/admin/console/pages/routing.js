// Routing: the scheduler's mode and counters, recent decisions with their score breakdown
// (live `route.decision` events, and the node's own recent log), shadow disagreements, network costs.
import { h, clear, section, table, row, num, clock, short } from '../dom.js';
import { lineChart } from '../chart.js';

const TERMS = ['queue_ms', 'network_ms', 'prefill_ms', 'decode_ms', 'cold_start_ms', 'kv_transfer_ms', 'failure_ms', 'cooldown_ms', 'unknown_ms', 'affinity_credit_ms'];

// One decision shape for both sources: {ts, model, target, mode, candidates: [{target, score, terms}], disagreement, baseline}
export function fromStatus(d) {
  return { ts: d.at, model: d.model || '', target: d.target, mode: d.mode, baseline: d.baseline, scheduled: d.scheduled,
    disagreement: d.disagreement, reason: d.reason,
    candidates: (d.scores || []).map((sc) => ({ target: sc.target, score: sc.total_ms, terms: Object.fromEntries(TERMS.filter((k) => k in sc).map((k) => [k, sc[k]])) })) };
}

function label(live, target) {
  if (!target) return '–';
  const [node, ...rest] = String(target).split(/[/:@]/);
  return live.peers.has(node) || (live.status && live.status.node_id === node) ? live.name(node) + (rest.length ? ' ' + rest.join(':') : '') : short(target) + (String(target).length > 8 ? '…' : '');
}

function breakdown(live, d) {
  const cands = d.candidates || [];
  if (!cands.length) return h('p', { class: 'muted small' }, 'no candidate scores');
  const keys = [...new Set(cands.flatMap((c) => Object.keys(c.terms || {})))];
  return table(['Candidate', 'Score ms', ...keys.map((k) => k.replace(/_ms$/, ''))],
    cands.map((c) => row([label(live, c.target), num(c.score, 1), ...keys.map((k) => num((c.terms || {})[k], 1))])), { class: 'compact' });
}

const opened = new Set();   // decisions whose breakdown the operator opened survive re-renders

function decisionList(live, list, empty) {
  if (!list.length) return h('p', { class: 'muted' }, empty);
  const key = (d) => `${d.ts}|${d.target}|${d.model}`;
  return h('ul', { class: 'decisions' }, list.map((d) => h('li', {}, h('details', { open: opened.has(key(d)),
    ontoggle: (ev) => { if (ev.target.open) opened.add(key(d)); else opened.delete(key(d)); } },
    h('summary', {}, `${clock(d.ts)} `, d.model ? h('code', {}, d.model) : null, ' → ', h('strong', {}, label(live, d.target)),
      ` (${d.mode}${d.disagreement ? `, baseline ${label(live, d.baseline)}` : ''}${d.reason ? ', ' + d.reason : ''})`),
    breakdown(live, d)))));
}

export function mount(root, live) {
  const head = h('div'), recent = h('div', { id: 'decisions' }), shadow = h('div'), costs = h('div'), charts = h('div', { class: 'charts' });
  root.append(h('h1', {}, 'Routing'), section('Scheduler', head),
    section('Recent decisions', h('p', { class: 'muted small' }, 'Open one for its score breakdown (every term in ms; the lowest total wins).'), recent),
    h('div', { class: 'grid' }, section('Shadow disagreements', shadow), section('Network costs', costs)),
    section('Network cost over time', charts));

  function update(what) {
    if (!['status', 'decision', 'history', undefined].includes(what)) return;
    const st = live.status || {};
    const sch = st.scheduler || {};
    if (what !== 'history') {
      clear(head, h('dl', { class: 'facts' },
        h('dt', {}, 'Mode'), h('dd', { id: 'sched-mode' }, sch.mode || '–'),
        ...[['Decisions', 'decisions'], ['Overrides', 'overrides'], ['Shadow disagreements', 'shadow_disagreements'], ['No target', 'no_target'],
          ['Affinity hits', 'affinity_hits'], ['Cooling candidates', 'cooling_candidates']].flatMap(([k, f]) => [h('dt', {}, k), h('dd', {}, String(sch[f] ?? 0))])));
      const local = (sch.recent_decisions || []).map(fromStatus);
      const merged = live.decisions.length ? live.decisions.map((d) => Object.assign({ ts: d.ts }, d)) : local;
      clear(recent, decisionList(live, merged.slice(0, 50), 'No request routed yet.'));
      clear(shadow, decisionList(live, merged.filter((d) => d.disagreement).slice(0, 50), sch.mode === 'shadow' ? 'The scheduler agrees with the baseline so far.' : `The scheduler is in ${sch.mode || '–'} mode.`));
      const nc = st.network_costs || {};
      clear(costs, h('p', { class: 'small muted' }, `${nc.tracked_targets ?? 0} targets tracked, ${nc.stale_targets ?? 0} stale`),
        table(['Node', 'Model', 'Kind', 'RTT ms', 'TTFT p50 / p95 ms', 'tok/s', 'OK / failed'], (nc.targets || []).slice(0, 50).map((t) => {
          const m = t.metrics || {}, g = (k, f) => (m[k] || {})[f];
          return row([label(live, t.node), h('code', {}, t.model || '–'), t.kind + (t.stale ? ' (stale)' : ''), num(g('rtt_ms', 'avg'), 1),
            `${num(g('ttft_ms', 'p50'), 0)} / ${num(g('ttft_ms', 'p95'), 0)}`, num(g('tokens_per_s', 'avg'), 1), `${t.successes ?? 0} / ${t.failures ?? 0}`]);
        }), { empty: 'no target measured yet' }));
    }
    const ids = new Set();
    for (const pt of live.history) for (const id of Object.keys(pt.rtt_ms || {})) ids.add(id);
    clear(charts, lineChart('RTT per peer', [...ids].slice(0, 8).map((id) => ({ name: live.name(id), points: live.history.map((pt) => [pt.ts, (pt.rtt_ms || {})[id] ?? null]) })), { unit: 'ms' }),
      lineChart('Time to first token', [{ name: 'p95', points: live.history.map((p) => [p.ts, p.ttft_p95_ms ?? null]) }], { unit: 'ms' }));
  }
  update();
  return { update };
}
