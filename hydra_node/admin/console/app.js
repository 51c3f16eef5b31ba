// The console shell: hash routing between pages, the connection badge, first-render timing.
import { Live } from './live.js';
import { getKey, setKey } from './api.js';
import { h, clear } from './dom.js';

const PAGES = ['overview', 'mesh', 'models', 'routing', 'chat', 'events'];
const live = new Live();
const main = document.getElementById('main');
let current = null;   // {name, view}
let firstRender = false;

async function show(name) {
  if (!PAGES.includes(name)) name = 'overview';
  if (current && current.name === name) return;
  if (current && current.view.unmount) current.view.unmount();
  const mod = await import(`./pages/${name}.js`);
  const root = h('div', { class: 'page', id: 'page-' + name });
  clear(main, root);
  current = { name, view: mod.mount(root, live) };
  for (const a of document.querySelectorAll('nav a')) {
    if (a.getAttribute('href') === '#' + name) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
  }
  document.title = `Hydra · ${name[0].toUpperCase()}${name.slice(1)}`;
  if (firstRender) main.focus({ preventScroll: true });
  markReady();
}

function markReady() {
  if (firstRender || !live.status || !current) return;
  firstRender = true;
  performance.mark('hydra-first-render');
  document.body.dataset.ready = '1';
}

function route() { show((location.hash || '#overview').slice(1)); }

function connBadge() {
  const el = document.getElementById('conn');
  const text = live.error ? 'node unreachable: ' + live.error
    : live.stream === 'live' ? 'live' : live.stream === 'polling' ? 'polling' : 'connecting…';
  el.textContent = text;
  el.className = live.error ? 'bad' : live.stream === 'live' ? 'good' : 'warn';
  document.getElementById('forget-key').hidden = !getKey();
  if (live.status) document.getElementById('node-name').textContent = live.status.name || live.status.node_id.slice(0, 8);
}

live.on((what) => {
  connBadge();
  if (current && current.view.update) current.view.update(what);
  if (what === 'status') markReady();
});

document.getElementById('forget-key').addEventListener('click', () => { setKey(''); location.reload(); });
window.addEventListener('hashchange', route);
window.hydraLive = live;   // for the browser tests and curious operators
route();
live.start();
