// Kiln web UI: live updates from the event feed (server-sent events from
// /ui/events, which long-polls GET /v1/events). No page reloads: a
// machine's transition recolours its cells and moves the overview counts;
// the machine page appends the event and refreshes its own sections.
(function () {
  "use strict";
  var body = document.body;
  var live = body.dataset.live;
  // Render timing for the browser test and for operators: when every row
  // of the page is in the DOM (this deferred script runs after parsing).
  var rows = document.querySelectorAll("a.m[data-machine]").length;
  window.kilnRender = { rows: rows, domAt: performance.now(), paintedAt: 0 };
  requestAnimationFrame(function () {
    requestAnimationFrame(function () { window.kilnRender.paintedAt = performance.now(); });
  });
  if (!live) return;

  var dot = document.getElementById("live"), txt = document.getElementById("live-text");
  function status(on, t) {
    if (!dot) return;
    dot.className = "live " + (on ? "on" : "off");
    txt.textContent = t;
  }
  window.kilnLive = { events: 0, last: 0 };

  function setState(el, to) {
    var old = el.dataset.state;
    if (old === to) return;
    el.classList.remove("st-" + old);
    el.classList.add("st-" + to);
    el.dataset.state = to;
    var stl = el.querySelector(".stl");
    if (stl) stl.textContent = to;
    else if (el.id === "state") el.textContent = to;
    var t = el.getAttribute("title");
    if (t) el.setAttribute("title", t.replace(": " + old, ": " + to));
  }
  function bump(state, d) {
    var c = document.querySelector('[data-count="' + state + '"] .n');
    if (c) c.textContent = String(Math.max(0, parseInt(c.textContent, 10) + d));
  }
  function feed(ev) {
    var ol = document.getElementById("feed");
    if (!ol) return;
    var hint = document.getElementById("feed-empty");
    if (hint) hint.remove();
    var li = document.createElement("li");
    var id = ev.subject.indexOf("machine/") === 0 ? ev.subject.slice(8) : "";
    var a = document.createElement(id ? "a" : "span");
    if (id) a.href = "/ui/machines/" + encodeURIComponent(id);
    a.textContent = ev.subject;
    li.appendChild(a);
    li.appendChild(document.createTextNode(" " + ev.kind + (ev.to ? " " + (ev.from || "") + " → " + ev.to : "") +
      (ev.actor ? " by " + ev.actor : "") + (ev.reason ? " (" + ev.reason + ")" : "")));
    ol.insertBefore(li, ol.firstChild);
    while (ol.children.length > 50) ol.removeChild(ol.lastChild);
  }
  function historyRow(ev) {
    var tb = document.getElementById("events-body");
    if (!tb) return;
    var tr = document.createElement("tr");
    [String(ev.index), "now", ev.kind, ev.to ? (ev.from || "") + " → " + ev.to : "", ev.actor || "",
      (ev.reason || "") + " " + (ev.message || "")].forEach(function (v) {
      var td = document.createElement("td"); td.textContent = v; tr.appendChild(td);
    });
    tb.insertBefore(tr, tb.firstChild);
  }
  // The machine page refreshes its sections (step, hardware, jobs,
  // actions) from the server after an event about it, debounced.
  var refreshTimer = 0;
  function refreshMachine() {
    clearTimeout(refreshTimer);
    refreshTimer = setTimeout(function () {
      fetch(location.pathname, { credentials: "same-origin", headers: { "Accept": "text/html" } })
        .then(function (r) {
          if (r.redirected && r.url.indexOf("/ui/login") >= 0) { location.href = r.url; return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) {
          if (!html) return;
          var doc = new DOMParser().parseFromString(html, "text/html");
          ["step", "hw", "actions", "jobs", "leases", "diff"].forEach(function (id) {
            var now = document.getElementById(id), next = doc.getElementById(id);
            if (now && next) now.replaceWith(next);
          });
          var s = doc.getElementById("progress"), t = document.getElementById("progress");
          if (s && t) t.replaceWith(s);
        });
    }, 250);
  }
  function apply(ev) {
    window.kilnLive.events++;
    window.kilnLive.last = ev.index;
    feed(ev);
    if (ev.subject.indexOf("machine/") !== 0) return;
    var id = ev.subject.slice(8);
    if (ev.kind === "transition" && ev.to) {
      var els = document.querySelectorAll('[data-machine="' + CSS.escape(id) + '"]');
      for (var i = 0; i < els.length; i++) setState(els[i], ev.to);
      if (live === "overview" && ev.from) { bump(ev.from, -1); bump(ev.to, 1); }
    }
    if (live === "machine") {
      var st = document.getElementById("state");
      if (st && st.dataset.machine === id) { historyRow(ev); refreshMachine(); }
    }
  }
  var es = new EventSource("/ui/events?after=" + encodeURIComponent(body.dataset.cursor || "0"));
  es.onopen = function () { status(true, "live"); };
  es.onerror = function () { status(false, "reconnecting"); };
  es.onmessage = function (m) {
    try { apply(JSON.parse(m.data)); } catch (e) { /* a bad message is skipped */ }
  };
  es.addEventListener("expired", function () {
    es.close();
    location.href = "/ui/login?expired=1&next=" + encodeURIComponent(location.pathname + location.search);
  });
  es.addEventListener("resync", function () { es.close(); location.reload(); });
})();
