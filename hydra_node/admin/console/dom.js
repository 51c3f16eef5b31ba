// Small DOM helpers shared by the pages: element builder, formatting, a confirmation dialog.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') el.className = v;
    else if (k === 'text') el.textContent = v;
    else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

export function clear(el, ...children) { el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined)); return el; }

export function short(id) { return id ? String(id).slice(0, 8) : '–'; }

export function num(v, digits = 1) {
  if (v === null || v === undefined || Number.isNaN(v)) return '–';
  return Number(v).toFixed(digits).replace(/\.0+$/, '');
}

export function bytes(n) {
  if (!n && n !== 0) return '–';
  const units = ['B', 'KB', 'MB', 'GB', 'TB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + ' ' + units[i];
}

export function duration(s) {
  if (s === null || s === undefined) return '–';
  s = Math.floor(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60);
  if (d) return `${d}d ${hh}h ${m}m`;
  if (hh) return `${hh}h ${m}m ${s % 60}s`;
  if (m) return `${m}m ${s % 60}s`;
  return `${s}s`;
}

export function clock(ts) { return new Date(ts * 1000).toLocaleTimeString([], { hour12: false }); }

export function badge(state) { return h('span', { class: 'badge st-' + String(state || 'unknown').replace(/[^a-z_]/gi, '') }, state || 'unknown'); }

export function table(columns, rows, opts = {}) {
  return h('div', { class: 'scroll' }, h('table', { class: opts.class || '' },
    opts.caption ? h('caption', {}, opts.caption) : null,
    h('thead', {}, h('tr', {}, columns.map((c) => h('th', { scope: 'col' }, c)))),
    h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', { colspan: columns.length, class: 'muted' }, opts.empty || 'nothing yet')))));
}

export function row(cells, attrs) { return h('tr', attrs || {}, cells.map((c) => h('td', {}, c))); }

export function section(title, ...children) { return h('section', { class: 'card' }, h('h2', {}, title), ...children); }

// Resolve true when the operator confirms (a modal <dialog>: keyboard and screen-reader friendly).
export function confirmAction(message, okLabel = 'Confirm') {
  return new Promise((resolve) => {
    const dlg = document.getElementById('confirm-dialog');
    document.getElementById('confirm-text').textContent = message;
    const ok = document.getElementById('confirm-ok');
    ok.textContent = okLabel;
    const finish = (v) => { dlg.close(); resolve(v); };
    ok.onclick = () => finish(true);
    document.getElementById('confirm-cancel').onclick = () => finish(false);
    dlg.oncancel = () => resolve(false);
    dlg.showModal();
    document.getElementById('confirm-cancel').focus();
  });
}

export function notice(el, text, kind = 'info') { clear(el, text ? h('p', { class: 'notice ' + kind, role: kind === 'error' ? 'alert' : 'status' }, text) : null); }
