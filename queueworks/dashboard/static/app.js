// queueworks dashboard: live updates and actions without page reloads (no library).
//  * Every element with data-live="name" is refreshed from the same page every
//    data-refresh ms (body attribute; at most 2 s): the page is fetched again and each
//    live block whose HTML changed is replaced, unless the user is typing in it.
//  * A form with data-api posts to that JSON endpoint with the CSRF token, shows the
//    answer in #flash and refreshes the page's live blocks at once.
(function () {
  "use strict";
  var refreshMs = Math.min(Number(document.body.dataset.refresh || "1000"), 2000);
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrf = csrfMeta ? csrfMeta.content : "";
  var status = document.getElementById("live-status");
  var flash = document.getElementById("flash");
  var busy = false;
  var again = false;

  function setStatus(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function typingIn(el) {
    var a = document.activeElement;
    return a && a !== document.body && el.contains(a) && a.matches("input, select, textarea");
  }

  function openDetails(el) {
    var keys = {};
    el.querySelectorAll("details[open][data-key]").forEach(function (d) { keys[d.dataset.key] = true; });
    return keys;
  }

  function refresh() {
    if (busy) { again = true; return Promise.resolve(); }
    if (document.hidden || !document.querySelector("[data-live]")) return Promise.resolve();
    busy = true;
    return fetch(location.href, { headers: { "X-Live": "1" }, cache: "no-store", credentials: "same-origin" })
      .then(function (res) {
        if (res.redirected || res.status === 401) { location.reload(); return null; }
        if (!res.ok) throw new Error("HTTP " + res.status);
        return res.text();
      })
      .then(function (html) {
        if (html === null) return;
        var doc = new DOMParser().parseFromString(html, "text/html");
        doc.querySelectorAll("[data-live]").forEach(function (fresh) {
          var cur = document.querySelector('[data-live="' + fresh.dataset.live + '"]');
          if (!cur || typingIn(cur) || cur.innerHTML === fresh.innerHTML) return;
          var open = openDetails(cur);
          cur.innerHTML = fresh.innerHTML;
          cur.querySelectorAll("details[data-key]").forEach(function (d) { if (open[d.dataset.key]) d.open = true; });
        });
        setStatus("ok", "live · " + new Date().toLocaleTimeString());
      })
      .catch(function (err) { setStatus("error", "offline (" + err.message + ")"); })
      .finally(function () {
        busy = false;
        if (again) { again = false; refresh(); }
      });
  }

  function show(message, bad) {
    if (!flash) return;
    flash.textContent = message;
    flash.classList.toggle("bad", !!bad);
    flash.hidden = false;
  }

  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    if (!form.dataset || !form.dataset.api) return;
    ev.preventDefault();
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) return;
    var body = new URLSearchParams(new FormData(form));
    fetch(form.dataset.api, {
      method: "POST",
      headers: { "X-CSRF-Token": csrf, "Content-Type": "application/x-www-form-urlencoded" },
      body: body,
      credentials: "same-origin"
    })
      .then(function (res) { return res.json().then(function (j) { return [res.ok, j]; }); })
      .then(function (r) { show(r[0] ? r[1].message : "Failed: " + r[1].error, !r[0]); })
      .catch(function (err) { show("Failed: " + err.message, true); })
      .finally(function () {
        if (document.activeElement && form.contains(document.activeElement)) document.activeElement.blur();
        refresh();
      });
  });

  setInterval(refresh, refreshMs);
  setStatus("ok", "live");
})();
