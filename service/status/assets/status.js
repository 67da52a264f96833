// tdreplay /status: polls GET /v1/status and plots each table with uPlot (bundled).
// The token, when the server needs one, is asked for once, kept in sessionStorage (this tab
// only) and sent as an Authorization header: never in a URL. Table names are set as text, and
// key only Maps and Sets, never plain objects (a table may be named "__proto__" or "constructor").
(function () {
  "use strict";
  var KEY = "tdreplay.token";
  var body = document.body;
  var every = Math.max(0.5, Number(body.dataset.interval) || 1) * 1000;
  var needsToken = body.dataset.auth === "bearer";
  var main = document.getElementById("tables");
  var login = document.getElementById("login");
  var stateEl = document.getElementById("state");
  var C = { insert: "#1f77b4", sample: "#ff7f0e", band: "#9aa3b2", target: "#2ca02c", fill: "#6f42c1" };
  // what the page shows, for people and for the browser test: plots by table, then by name
  var view = (window.tdreplayStatus = { plots: new Map(), cards: new Map(), polls: 0, errors: [] });
  var timer = null;

  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function say(text) { stateEl.textContent = text; }

  function ask(why) {
    login.hidden = false;
    say(why || "token needed");
    document.getElementById("token").focus();
  }

  login.addEventListener("submit", function (ev) {
    ev.preventDefault();
    var input = document.getElementById("token");
    if (input.value) sessionStorage.setItem(KEY, input.value);
    input.value = "";
    login.hidden = true;
    poll();
  });

  function poll() {
    clearTimeout(timer);
    var token = sessionStorage.getItem(KEY);
    if (needsToken && !token) { ask(); return; }
    var headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    fetch("/v1/status", { headers: headers, cache: "no-store", credentials: "omit" })
      .then(function (resp) {
        if (resp.status === 401) {
          sessionStorage.removeItem(KEY);
          ask("wrong token");
          return null;
        }
        if (!resp.ok) throw new Error("GET /v1/status answered " + resp.status);
        return resp.json();
      })
      .then(function (data) {
        if (!data) return;
        render(data);
        view.polls += 1;
        say("updated " + new Date(data.time * 1000).toLocaleTimeString());
        timer = setTimeout(poll, every);
      })
      .catch(function (err) {
        view.errors.push(String(err));
        say("no answer: " + err.message);
        timer = setTimeout(poll, every * 3);
      });
  }

  function ms(xs) { return xs.map(function (x) { return x === null ? null : x * 1000; }); }
  function pct(xs) { return xs.map(function (x) { return x === null ? null : x * 100; }); }
  function same(xs, v) { return xs.map(function () { return v === null || v === undefined ? null : v; }); }

  function line(label, stroke, extra) {
    var s = { label: label, stroke: stroke, width: 1.5, spanGaps: false };
    for (var k in extra || {}) s[k] = extra[k];
    return s;
  }

  // plot name -> [title, y label, series, data of (table)]
  var LINES = {
    fill: ["Fill level", "%", [line("fill %", C.fill, { fill: "rgba(111,66,193,.08)" })],
      function (s) { return [pct(s.fill)]; }, [0, 100]],
    rates: ["Insert and sample rate", "items/s", [line("inserts/s", C.insert), line("samples/s", C.sample)],
      function (s) { return [s.insert_rate, s.sample_rate]; }],
    spi: ["Samples per insert", "ratio", [
      line("now", C.sample), line("target", C.target, { dash: [6, 4] }),
      line("band low", C.band, { dash: [2, 3] }), line("band high", C.band, { dash: [2, 3] })],
      function (s, st) { return [s.spi, same(s.t, st.rate_limiter.target), s.spi_low, s.spi_high]; }],
    blocked: ["Time blocked by the rate limiter", "s/s", [line("insert", C.insert), line("sample", C.sample)],
      function (s) { return [s.blocked_insert, s.blocked_sample]; }],
    latency: ["Latency", "ms", [
      line("sample p50", C.sample), line("sample p99", C.sample, { dash: [4, 3] }),
      line("extend p50", C.insert), line("extend p99", C.insert, { dash: [4, 3] })],
      function (s) { return [ms(s.sample_p50), ms(s.sample_p99), ms(s.extend_p50), ms(s.extend_p99)]; }],
  };

  function width(box) { return Math.max(300, box.clientWidth || 380); }

  function timePlot(box, spec) {
    var opts = {
      width: width(box), height: 170,
      scales: { x: { time: true }, y: spec[4] ? { range: spec[4] } : {} },
      series: [{}].concat(spec[2]),
      axes: [{}, { label: spec[1], size: 56 }],
      legend: { live: false },
    };
    return new uPlot(opts, [[]].concat(spec[2].map(function () { return []; })), box);
  }

  function binLabel(edges, i, integer) {
    var lo = edges[i], hi = edges[i + 1];
    if (integer) {
      if (hi === undefined) return lo + "+";
      return hi - lo === 1 ? String(lo) : lo + "-" + (hi - 1);
    }
    if (i === 0) return "<" + fmt(hi);
    return hi === undefined ? fmt(lo) + "+" : fmt(lo);
  }
  function fmt(x) { return x >= 1 ? String(x) : "2^" + Math.round(Math.log2(x)); }

  function barPlot(box, label, color, hist, integer) {
    var n = hist.edges.length;
    var labels = hist.edges.map(function (_, i) { return binLabel(hist.edges, i, integer); });
    var step = Math.ceil(n / 8);  // a label every few bins: they must not overlap
    var opts = {
      width: width(box), height: 170,
      scales: { x: { time: false, range: [-0.5, n - 0.5] } },
      series: [{ label: "bin", value: function (u, i) { return i === null ? "" : labels[i]; } },
        { label: label, stroke: color, fill: color, points: { show: false }, paths: uPlot.paths.bars({ size: [0.7, 60] }) }],
      axes: [{ splits: function () { return labels.map(function (_, i) { return i; }).filter(function (i) { return i % step === 0; }); },
        values: function (u, splits) { return splits.map(function (i) { return labels[i] || ""; }); },
        rotate: 0, size: 30 }, { label: "items", size: 56 }],
      legend: { live: false },
    };
    return new uPlot(opts, [labels.map(function (_, i) { return i; }), hist.counts], box);
  }

  function card(t) {
    var c = view.cards.get(t.name);
    if (c) return c;
    var root = el("section", "table");
    var h = el("h2", null, t.name);
    h.appendChild(el("span", "kind", t.backend + " · " + t.sampler));
    root.appendChild(h);
    var summary = el("div", "summary");
    root.appendChild(summary);
    var grid = el("div", "plots");
    root.appendChild(grid);
    main.appendChild(root);
    c = { root: root, summary: summary, grid: grid, boxes: {} };
    view.cards.set(t.name, c);
    view.plots.set(t.name, {});
    return c;
  }

  function box(c, key, title) {
    var b = c.boxes[key];
    if (b) return b;
    b = c.boxes[key] = el("div", "plot");
    b.dataset.plot = key;
    b.appendChild(el("h3", null, title));
    c.grid.appendChild(b);
    return b;
  }

  function number(x, digits) {
    if (x === null || x === undefined) return "-";
    return Number(x).toLocaleString(undefined, { maximumFractionDigits: digits === undefined ? 2 : digits });
  }

  function summarize(c, st) {
    var rl = st.rate_limiter, ck = st.checkpoint, parts = [
      "size " + number(st.size, 0) + " / " + number(st.capacity, 0),
      "inserts " + number(st.inserts, 0), "samples " + number(st.samples, 0),
      "samples/insert " + number(rl.samples_per_insert) + (rl.target === null ? "" : " (target " + number(rl.target) + ")"),
      "sampled at least once " + number(st.unique_sampled, 0),
      "headroom insert " + number(rl.headroom.insert, 0) + ", sample " + number(rl.headroom.sample, 0),
      "waiting: insert " + rl.waiting.insert + ", sample " + rl.waiting.sample,
    ];
    if (st.trajectories !== null) parts.push("trajectories " + number(st.trajectories, 0));
    if (st.priority) parts.push("priority sum " + number(st.priority.sum) + ", max " + number(st.priority.max));
    parts.push(ck.last_ok_at === null ? "no checkpoint yet"
      : "checkpoint " + number(Date.now() / 1000 - ck.last_ok_at, 0) + " s ago (" + number(ck.bytes / 1e6) + " MB in " + number(ck.seconds) + " s)");
    c.summary.replaceChildren.apply(c.summary, parts.map(function (p) { return el("span", null, p); }));
  }

  function render(data) {
    var seen = new Set();
    if (!data.tables.length && !main.querySelector(".empty")) main.appendChild(el("p", "empty", "No tables yet."));
    data.tables.forEach(function (t) {
      seen.add(t.name);
      var c = card(t), plots = view.plots.get(t.name), s = t.series, st = t.stats;
      summarize(c, st);
      Object.keys(LINES).forEach(function (key) {
        var spec = LINES[key];
        if (!plots[key]) plots[key] = timePlot(box(c, key, spec[0]), spec);
        plots[key].setData([s.t].concat(spec[3](s, st)));
      });
      var hists = [["times", "Times each stored item was sampled", "items", C.insert, st.times_sampled, true],
        ["priority", "Priorities of the stored items", "items", C.sample, st.priority, false]];
      hists.forEach(function (h) {
        if (!h[4]) return;
        if (plots[h[0]]) plots[h[0]].setData([plots[h[0]].data[0], h[4].counts]);
        else plots[h[0]] = barPlot(box(c, h[0], h[1]), h[2], h[3], h[4], h[5]);
      });
    });
    Array.from(view.cards.keys()).forEach(function (name) {
      if (seen.has(name)) return;
      Object.values(view.plots.get(name)).forEach(function (u) { u.destroy(); });
      view.cards.get(name).root.remove();
      view.cards.delete(name);
      view.plots.delete(name);
    });
  }

  window.addEventListener("resize", function () {
    view.plots.forEach(function (plots) {
      Object.values(plots).forEach(function (u) { u.setSize({ width: width(u.root.parentNode), height: 170 }); });
    });
  });

  poll();
})();
