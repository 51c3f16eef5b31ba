// Start reading /api/status while the page's modules load; live.js takes this answer for its
// first read (a 401 or a network error there falls back to the normal path, which asks for the key).
(() => {
  const key = sessionStorage.getItem('hydra.apiKey');
  window.hydraBoot = fetch('/api/status', { headers: key ? { Authorization: 'Bearer ' + key } : {} }).catch(() => null);
})();
