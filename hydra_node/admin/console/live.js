// The console's live model of the node: /api/status, the event stream, /api/history.
// Events drive state changes at once (peer and model states, decisions, finished requests);
// /api/status is re-read after them (debounced) and every STATUS_EVERY_MS for load figures,
// or every POLL_EVERY_MS while the event stream is unavailable (the fall-back).
import { getJson, request, readSse, ApiError } from './api.js';

export const MAX_EVENTS = 1000;      // the node keeps 1000 too
export const MAX_DECISIONS = 200;
export const MAX_POINTS = 720;       // one hour at 5 s, as /api/history
const STATUS_EVERY_MS = 10000;
const POLL_EVERY_MS = 2000;
const HISTORY_EVERY_MS = 5000;
const RETRY_MS = [1000, 2000, 5000, 10000];

export class Live {
  constructor() {
    this.status = null;
    this.peers = new Map();          // id -> {id, name, state, ...row}
    this.names = new Map();          // id -> display name learned from events
    this.events = [];
    this.decisions = [];
    this.finished = [];
    this.history = [];
    this.historySource = 'none';
    this.stream = 'connecting';      // connecting | live | polling
    this.lastEventId = 0;            // 0: replay what the node still keeps, then live
    this.error = null;
    this.listeners = new Set();
    this._statusTimer = null;
    this._refreshSoon = null;
  }

  // what: 'status' (a new /api/status), 'peer' (a peer event, after 'event'), 'event', 'history', 'stream', 'error'
  on(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); }
  emit(what) { for (const fn of [...this.listeners]) { try { fn(what); } catch (e) { console.error(e); } } }

  start() {
    this.refreshStatus();
    this.loopEvents();
    this.loopHistory();
  }

  name(id) {
    if (this.status && id === this.status.node_id) return this.status.name || id.slice(0, 8);
    return this.names.get(id) || (id ? id.slice(0, 8) : '?');
  }

  async refreshStatus() {
    clearTimeout(this._statusTimer);
    try {
      const early = window.hydraBoot ? await window.hydraBoot : null;   // boot.js's read, made while modules loaded
      window.hydraBoot = null;
      const st = early && early.ok ? await early.json() : await getJson('/api/status');
      this.status = st;
      this.error = null;
      this.mergePeers(st.peers || []);
      if (this.historySource !== 'node') this.sampleFromStatus(st);
      this.emit('status');
    } catch (e) {
      this.error = e.message;
      this.emit('error');
    }
    clearTimeout(this._statusTimer);
    this._statusTimer = setTimeout(() => this.refreshStatus(), this.stream === 'live' ? STATUS_EVERY_MS : POLL_EVERY_MS);
  }

  refreshSoon() {
    if (this._refreshSoon) return;
    this._refreshSoon = setTimeout(() => { this._refreshSoon = null; this.refreshStatus(); }, 300);
  }

  mergePeers(rows) {
    const seen = new Set();
    for (const r of rows) {
      seen.add(r.id);
      const old = this.peers.get(r.id) || {};
      this.peers.set(r.id, Object.assign({}, old, r, { gone: false }));
    }
    // a peer the node forgot after it died or left stays on the page, marked by its last state
    for (const [id, p] of this.peers) {
      if (!seen.has(id) && !p.gone) {
        p.gone = true;
        if (p.state === 'alive' || p.state === 'suspect') p.state = 'dead';
      }
    }
  }

  applyEvent(ev) {
    this.events.push(ev);
    if (this.events.length > MAX_EVENTS) this.events.splice(0, this.events.length - MAX_EVENTS);
    const t = ev.type || '';
    if (t.startsWith('peer.') && ev.node_id) {
      if (ev.name) this.names.set(ev.node_id, ev.name);
      const p = this.peers.get(ev.node_id) || { id: ev.node_id, models: [], model_states: {} };
      p.state = t.slice(5) === 'joined' ? 'alive' : t.slice(5);
      if (ev.addrs) p.addresses = ev.addrs;
      p.gone = false;
      this.peers.set(ev.node_id, p);
      this.refreshSoon();
      this.emit('peer');
    } else if (t === 'route.decision') {
      this.decisions.unshift(ev);
      this.decisions.length = Math.min(this.decisions.length, MAX_DECISIONS);
      this.emit('decision');
    } else if (t === 'request.finished') {
      this.finished.unshift(ev);
      this.finished.length = Math.min(this.finished.length, MAX_DECISIONS);
    } else if (t.startsWith('model.') || t.startsWith('runner.') || t.startsWith('placement.')) {
      this.refreshSoon();
    }
    this.emit('event');
  }

  async loopEvents() {
    for (let attempt = 0; ; attempt++) {
      try {
        const q = this.lastEventId !== null ? `?last_event_id=${encodeURIComponent(this.lastEventId)}` : '';
        const resp = await request('GET', '/api/events' + q, undefined, { raw: true });
        if (resp.status === 404) { this.setStream('polling'); return; }   // an older node: poll
        if (!resp.ok) throw new ApiError(resp.status, `events: ${resp.status}`);
        this.setStream('live');
        attempt = 0;
        await readSse(resp, (rec) => {
          if (rec.id !== null) this.lastEventId = rec.id;
          let data;
          try { data = JSON.parse(rec.data); } catch (e) { return; }
          if (!data.type) data.type = rec.event;
          this.applyEvent(data);
        });
      } catch (e) {
        /* the stream broke: fall back to polling until it is back */
      }
      this.setStream('polling');
      await new Promise((r) => setTimeout(r, RETRY_MS[Math.min(attempt, RETRY_MS.length - 1)]));
    }
  }

  setStream(state) {
    if (this.stream === state) return;
    this.stream = state;
    this.emit('stream');
    if (state === 'polling') this.refreshSoon();
  }

  async loopHistory() {
    for (;;) {
      try {
        const since = this.historySource === 'node' && this.history.length ? `?since=${this.history[this.history.length - 1].ts}` : '';
        const resp = await request('GET', '/api/history' + since, undefined, { raw: true });
        if (resp.status === 404) { this.historySource = 'status'; return; }   // an older node: sample status
        if (resp.ok) {
          const body = await resp.json();
          if (this.historySource !== 'node') { this.history = []; this.historySource = 'node'; }
          this.addPoints(body.series || []);
          this.emit('history');
        }
      } catch (e) { /* try again later */ }
      await new Promise((r) => setTimeout(r, HISTORY_EVERY_MS));
    }
  }

  addPoints(points) {
    this.history.push(...points);
    if (this.history.length > MAX_POINTS) this.history.splice(0, this.history.length - MAX_POINTS);
  }

  // The fall-back history: the figures /api/status carries, one point per status read.
  sampleFromStatus(st) {
    const models = st.models || [];
    const rtt = {};
    for (const p of st.peers || []) if (p.rtt_ms !== null && p.rtt_ms !== undefined) rtt[p.id] = p.rtt_ms;
    const ttft = models.map((m) => (m.requests || {}).ttft_ms).filter((v) => v);
    this.addPoints([{ ts: Date.now() / 1000,
      tok_s: models.reduce((a, m) => a + ((m.requests || {}).tokens_per_s || 0), 0),
      ttft_p50_ms: ttft.length ? ttft.sort((a, b) => a - b)[Math.floor(ttft.length / 2)] : null,
      ttft_p95_ms: ttft.length ? Math.max(...ttft) : null,
      queue_depth: st.queue_depth || 0, requests: st.inflight_requests || 0, rtt_ms: rtt }]);
  }
}
