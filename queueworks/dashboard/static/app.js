// queueworks dashboard: live updates and actions without page reloads (no library).
//  * Every element with data-live="name" is refreshed every data-refresh ms (body
//    attribute: --refresh): the page is asked again with an X-Live header naming the
//    hash of each live block shown, and answers JSON with only the blocks that changed
//    (and every block's hash). A block the user is typing in is left as it is. Open
//    <details> stay open.
//  * The header's "Stop updates" button stops the live updates (remembered in this
//    browser) and "Live updates" starts them again (named apart from a queue's Pause).
//  * A form with data-api posts to that JSON endpoint with the CSRF token, asks first
//    when it has data-confirm, shows the answer in #flash and refreshes at once.
(function () {
  "use strict";
  var refreshMs = Math.max(Number(document.body.dataset.refresh || "1000"), 100);
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrf = csrfMeta ? csrfMeta.content : "";
  var status = document.getElementById("live-status");
  var toggle = document.getElementById("live-toggle");
  var flash = document.getElementById("flash");
  var hashes = {};
  var busy = false;
  var again = false;
  var paused = false;
  try { paused = window.localStorage.getItem("qw-live") === "paused"; } catch (e) { paused = false; }

  function setStatus(state, text) {
    if (!status) return;
    status.dataset.state = state;
    status.textContent = text;
  }

  function showPaused() {
    if (toggle) {
      toggle.textContent = paused ? "Live updates" : "Stop updates";
      toggle.setAttribute("aria-pressed", paused ? "true" : "false");
    }
    setStatus(paused ? "idle" : "ok", paused ? "paused" : "live");
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

  function have() {
    var parts = [];
    Object.keys(hashes).forEach(function (k) { parts.push(k + "=" + hashes[k]); });
    return parts.join(";") || "-";
  }

  function apply(answer) {
    var blocks = answer.blocks || {};
    Object.keys(answer.hashes || {}).forEach(function (name) {
      var cur = document.querySelector('[data-live="' + name + '"]');
      if (!cur) return;
      if (!Object.prototype.hasOwnProperty.call(blocks, name)) return;  // unchanged
      if (typingIn(cur)) { delete hashes[name]; return; }  // sent again next time
      var open = openDetails(cur);
      cur.innerHTML = blocks[name];
      cur.querySelectorAll("details[data-key]").forEach(function (d) { if (open[d.dataset.key]) d.open = true; });
      hashes[name] = answer.hashes[name];
    });
  }

  function refresh(force) {
    if (busy) { again = true; return Promise.resolve(); }
    if ((paused && !force) || document.hidden || !document.querySelector("[data-live]")) return Promise.resolve();
    busy = true;
    return fetch(location.href, { headers: { "X-Live": have() }, cache: "no-store", credentials: "same-origin" })
      .then(function (res) {
        var json = (res.headers.get("content-type") || "").indexOf("application/json") === 0;
        if (res.redirected || res.status === 401 || (res.ok && !json)) { location.reload(); return null; }
        if (!res.ok) throw new Error("HTTP " + res.status);
        return res.json();
      })
      .then(function (answer) {
        if (answer === null) return;
        if (paused && !force) return;  // paused while it was on its way: the page holds still
        apply(answer);
        if (!paused) setStatus("ok", "live · " + new Date().toLocaleTimeString());
      })
      .catch(function (err) { setStatus("error", "offline (" + err.message + ")"); })
      .finally(function () {
        busy = false;
        if (again) { again = false; refresh(force); }
      });
  }

  function show(message, bad) {
    if (!flash) return;
    flash.textContent = message;
    flash.classList.toggle("bad", !!bad);
    flash.hidden = false;
  }

  if (toggle) {
    toggle.addEventListener("click", function () {
      paused = !paused;
      try { window.localStorage.setItem("qw-live", paused ? "paused" : "live"); } catch (e) { /* private mode */ }
      showPaused();
      if (!paused) refresh();
    });
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
      .then(function (r) {
        show(r[0] ? r[1].message : "Failed: " + r[1].error, !r[0]);
        if (r[0] && form.dataset.then) location.assign(form.dataset.then);  // the page is gone
      })
      .catch(function (err) { show("Failed: " + err.message, true); })
      .finally(function () {
        if (document.activeElement && form.contains(document.activeElement)) document.activeElement.blur();
        refresh(true);
      });
  });

  setInterval(refresh, refreshMs);
  showPaused();
})();
