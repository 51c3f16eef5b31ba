// Talking to the node: one fetch wrapper (Bearer key from sessionStorage), the key prompt,
// and a Server-Sent Events reader over fetch (never EventSource: it cannot send the key).
const KEY_NAME = 'hydra.apiKey';
let keyPrompt = null;

export function getKey() { return sessionStorage.getItem(KEY_NAME) || ''; }
export function setKey(key) { if (key) sessionStorage.setItem(KEY_NAME, key); else sessionStorage.removeItem(KEY_NAME); }

export class ApiError extends Error {
  constructor(status, message, code) { super(message); this.status = status; this.code = code; }
}

function headers(extra) {
  const h = Object.assign({}, extra || {});
  const key = getKey();
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

// Ask for the key once (every caller waiting on a 401 shares the same prompt).
export function askKey(reason) {
  if (!keyPrompt) {
    keyPrompt = new Promise((resolve) => {
      const dlg = document.getElementById('key-dialog');
      const input = document.getElementById('key-input');
      document.getElementById('key-reason').textContent = reason || 'This node requires an API key.';
      input.value = '';
      let settled = false;
      const finish = (save) => {   // once per prompt, whichever way it ends
        if (settled) return;
        settled = true;
        if (save) setKey(input.value.trim());
        keyPrompt = null;
        resolve();
      };
      document.getElementById('key-form').onsubmit = (ev) => { ev.preventDefault(); finish(true); dlg.close(); };
      dlg.oncancel = () => finish(false);   // Escape: the caller's next 401 asks again
      dlg.showModal();
      input.focus();
    });
  }
  return keyPrompt;
}

async function errorOf(resp) {
  let message = resp.status + ' ' + resp.statusText, code = '';
  try {
    const body = await resp.json();
    if (body && body.error) { message = body.error.message || message; code = body.error.code || ''; }
  } catch (e) { /* not JSON */ }
  return new ApiError(resp.status, message, code);
}

// fetch with the key; a 401 asks for the key and tries again.
export async function request(method, path, body, opts = {}) {
  for (let attempt = 0; ; attempt++) {
    const init = { method, headers: headers(body !== undefined ? { 'Content-Type': 'application/json' } : {}),
                   signal: opts.signal };
    if (body !== undefined) init.body = JSON.stringify(body);
    const resp = await fetch(path, init);
    if (resp.status === 401 && attempt < 3 && !opts.noPrompt) {
      await askKey(getKey() ? 'The key was refused; enter it again.' : 'This node requires an API key.');
      continue;
    }
    if (!resp.ok && !opts.raw) throw await errorOf(resp);
    return resp;
  }
}

export async function getJson(path, opts) { return (await request('GET', path, undefined, opts)).json(); }
export async function postJson(path, body, opts) { return (await request('POST', path, body, opts)).json(); }
export async function del(path) { return (await request('DELETE', path)).json(); }

// Split an SSE byte stream into {id, event, data} records; comment lines (heartbeats) are skipped.
export function sseParser(onRecord) {
  let buf = '';
  let rec = { id: null, event: 'message', data: [] };
  return (chunk) => {
    buf += chunk;
    let nl;
    while ((nl = buf.indexOf('\n')) >= 0) {
      let line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line === '') {
        if (rec.data.length) onRecord({ id: rec.id, event: rec.event, data: rec.data.join('\n') });
        rec = { id: null, event: 'message', data: [] };
        continue;
      }
      if (line.startsWith(':')) continue;
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'data') rec.data.push(value);
      else if (field === 'event') rec.event = value;
      else if (field === 'id') rec.id = value;
    }
  };
}

// Read an SSE response body to its end, calling onRecord for each record.
export async function readSse(resp, onRecord) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  const feed = sseParser(onRecord);
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    feed(decoder.decode(value, { stream: true }));
  }
}
