// The live counts of the queues page: every 5 s, /console/counts.json replaces the numbers in
// the tabs; a session that ended sends the page back to /console, which says why. Nothing else
// runs here; the pages work without it.
(function () {
  'use strict';
  var spots = document.querySelectorAll('[data-count]');
  var live = document.getElementById('live');
  if (!spots.length) return;
  function show(n, cap) { return n >= cap ? cap + '+' : String(n); }
  function refresh() {
    fetch('/console/counts.json', { credentials: 'same-origin', cache: 'no-store' })
      .then(function (r) {
        if (r.status === 401) { window.location.assign('/console'); return null; }
        return r.ok ? r.json() : null;
      })
      .then(function (counts) {
        if (!counts) { if (live) live.className = 'live'; return; }
        spots.forEach(function (el) {
          var id = el.getAttribute('data-count');
          if (id in counts) el.textContent = show(counts[id], counts.cap);
        });
        if (live) { live.className = 'live on'; live.title = 'refreshed ' + new Date().toISOString(); }
      })
      .catch(function () { if (live) live.className = 'live'; });
  }
  refresh();
  window.setInterval(refresh, 5000);
})();
