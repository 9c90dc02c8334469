(function (cfg) {
  "use strict";
  // cfg (from page.go, pageConfig): state, events, elapsed_ms, expected_ms, retry_after_ms, phases.
  if (cfg.state !== "waiting") { return; }
  var byId = function (id) { return document.getElementById(id); };
  var set = function (id, text) { var el = byId(id); if (el) { el.textContent = text; } };
  var secs = function (ms) { return ms < 10000 ? (ms / 1000).toFixed(1) + " s" : Math.round(ms / 1000) + " s"; };
  var base = performance.now() - cfg.elapsed_ms; // elapsed = performance.now() - base
  var expected = cfg.expected_ms;
  var over = false; // a final event arrived: stop ticking, no fallback reload
  var reloadTimer = 0;

  function tick() {
    if (over) { return; }
    var ms = Math.max(0, performance.now() - base);
    set("wp-elapsed", secs(ms) + " elapsed");
    var bar = byId("wp-bar");
    if (!bar || expected <= 0) { return; }
    if (ms < expected) {
      bar.max = expected;
      bar.value = ms;
    } else {
      bar.removeAttribute("value"); // past the estimate: indeterminate
      set("wp-expected", "taking longer than usual");
    }
  }

  function phases(list) {
    var ol = byId("wp-phases");
    if (!ol || !list) { return; }
    while (ol.firstChild) { ol.removeChild(ol.firstChild); }
    list.forEach(function (name) {
      var li = document.createElement("li");
      li.setAttribute("data-phase", name);
      li.textContent = name;
      ol.appendChild(li);
    });
  }

  function update(ev) {
    base = performance.now() - ev.elapsed_ms;
    if (ev.expected_ms > 0 && expected <= 0) {
      expected = ev.expected_ms;
      set("wp-expected", "usually ready in about " + secs(expected));
    }
    phases(ev.phases);
    tick();
  }

  function fallback() {
    if (over || reloadTimer) { return; }
    reloadTimer = setTimeout(function () { location.reload(); }, cfg.retry_after_ms);
  }

  var timer = setInterval(tick, 200);
  tick();
  if (!cfg.events || !window.EventSource) { fallback(); return; }

  var es = new EventSource(cfg.events);
  es.addEventListener("phase", function (m) { update(JSON.parse(m.data)); });
  es.addEventListener("ready", function (m) {
    over = true;
    es.close();
    clearInterval(timer);
    var ev = JSON.parse(m.data);
    phases(ev.phases);
    var main = document.querySelector("main");
    if (main) { main.setAttribute("data-state", "ready"); }
    var bar = byId("wp-bar");
    if (bar) { bar.max = 1; bar.value = 1; }
    set("wp-elapsed", "ready after " + secs(ev.elapsed_ms) + ", opening…");
    location.reload();
  });
  es.addEventListener("failed", function (m) {
    over = true;
    es.close();
    clearInterval(timer);
    var ev = JSON.parse(m.data);
    set("wp-cause", ev.cause || "The wake failed.");
    set("wp-wakeid", ev.wake_id);
    set("wp-retry-after", ev.retry_after_ms > 0 ? "A new attempt is possible in " + Math.ceil(ev.retry_after_ms / 1000) + " s." : "");
    var main = document.querySelector("main");
    if (main) { main.setAttribute("data-state", "failed"); }
    document.title = document.title.replace(/^Starting (.*)…$/, "$1 could not start");
    var waiting = byId("wp-waiting"), failed = byId("wp-failed");
    if (waiting) { waiting.hidden = true; }
    if (failed) { failed.hidden = false; }
    var retry = byId("wp-retry");
    if (retry) { retry.focus(); }
  });
  // The stream broke or ended without a final event (the edge restarted, the stream's time ran out):
  // load the page again after Retry-After, as the no-JavaScript page does.
  es.onerror = function () { es.close(); fallback(); };
})
