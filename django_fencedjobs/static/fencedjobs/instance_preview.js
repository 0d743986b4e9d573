/* django-fencedjobs admin: an instance's next fire times, previewed while its schedule is
   edited. The page renders the preview once; each change of the schedule's fields asks the
   admin's preview view again (after a short pause in typing) and shows its answer. The
   markup comes from the server, escaped there: the same as the page's own. */
"use strict";
(function () {
  const FIELDS = ["job", "key", "cron", "every", "timezone", "jitter", "kwargs", "exclude"];
  const WATCHED = ["job", "key", "cron", "every", "timezone", "jitter", "exclude"];
  const PAUSE_MS = 250;

  function start() {
    const box = document.querySelector(".fj-preview[data-url]");
    if (!box) return;
    const inputs = WATCHED.map((name) => document.getElementById("id_" + name)).filter(Boolean);
    if (!inputs.some((input) => input.name === "cron")) return; // read-only: nothing to edit
    let timer = null;
    let asked = 0;

    function query() {
      const params = new URLSearchParams();
      for (const name of FIELDS) {
        const input = document.getElementById("id_" + name);
        const value = input ? input.value : box.dataset[name];
        if (value !== undefined) params.set(name, value);
      }
      return params;
    }

    function refresh() {
      const mine = ++asked;
      box.classList.add("fj-preview-busy");
      fetch(box.dataset.url + "?" + query(), {
        credentials: "same-origin",
        headers: { Accept: "application/json" },
      })
        .then((response) => (response.ok ? response.json() : Promise.reject(response.status)))
        .then((answer) => {
          if (mine !== asked) return; // a later change asked again
          box.innerHTML = answer.html;
          box.classList.remove("fj-preview-busy", "fj-preview-stale");
          box.dataset.count = String(answer.times.length);
        })
        .catch(() => {
          if (mine !== asked) return;
          box.classList.remove("fj-preview-busy");
          box.classList.add("fj-preview-stale");
        });
    }

    function later() {
      clearTimeout(timer);
      timer = setTimeout(refresh, PAUSE_MS);
    }

    for (const input of inputs) {
      input.addEventListener("input", later);
      input.addEventListener("change", later);
    }
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
