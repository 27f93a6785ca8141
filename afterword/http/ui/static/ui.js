// afterword status page: optional enhancements only. Every page reads the same without it.
// No inline handlers (the Content-Security-Policy forbids them) and no browser storage: the
// refresh choice lives in the URL fragment.
"use strict";
(function () {
  var toggle = document.getElementById("live-toggle");
  var box = document.getElementById("live");
  if (!toggle || !box || !document.getElementById("health")) {
    return; // only the status page itself refreshes
  }
  toggle.hidden = false;
  box.checked = window.location.hash === "#live";
  var timer = null;
  function arm() {
    if (timer !== null) {
      window.clearTimeout(timer);
      timer = null;
    }
    if (box.checked) {
      timer = window.setTimeout(function () { window.location.reload(); }, 10000);
    }
  }
  box.addEventListener("change", function () {
    history.replaceState(null, "", box.checked ? "#live" : window.location.pathname + window.location.search);
    arm();
  });
  arm();
})();
