// ftnb's live chart and controls: an anywidget ES module (no bundler, no dependencies).
//
// The model state holds everything a view draws: "series" (every trial's points, binary:
// float32 values, int32 iterations where they are not 1, 2, 3...), "trials" ([id, label of its
// varying hyperparameters or "", status as shown or its index in STATUSES]), "restarts", "controls" and "metric". The kernel sends
// appends as custom messages ({type: "delta"}), a whole new set after a metric change or a
// catch-up ({type: "series"}), and replies to control requests ({type: "reply"}).
//
// Views report themselves to the kernel ({type: "view", event: "open" | "beat" | "close"}; a
// hidden tab reports "close" and does not beat): a kernel no view reports to sends nothing, so
// an unattended server can be culled.
//
// Controls name trials by id. Where ftnb's Jupyter server extension answers (GET
// <base>ftnb/api/roots), they are POSTed to it and act while the kernel is busy; otherwise they
// are messages to the kernel, which acts when its running cell ends and refuses a trial that
// has ended or is gone.

const HEARTBEAT_MS = 30000;
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];
const LEGEND_MAX = 12;
const STATUSES = ["PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERRORED", "STOPPED", "INTERRUPTED"];
const SVG = "http://www.w3.org/2000/svg";

// -- the series, shared by every view of one model -------------------------------------------
const caches = new WeakMap();

function bytesOf(b) {
  if (!b) return null;
  if (b instanceof ArrayBuffer) return b;
  return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength);
}

function decodeSeries(s, buffers) {
  const out = new Map();
  if (!s || !s.ids) return out;
  const yb = bytesOf(buffers ? buffers[s.y] : s.y);
  const xb = bytesOf(buffers ? buffers[s.x] : s.x);
  const ys = yb ? new Float32Array(yb) : new Float32Array(0);
  const xs = xb ? new Int32Array(xb) : new Int32Array(0);
  let yi = 0, xi = 0;
  s.ids.forEach((id, k) => {
    const n = s.n[k], x0 = s.x0[k], x = new Array(n), y = new Array(n);
    for (let i = 0; i < n; i++) {
      x[i] = x0 === null ? xs[xi++] : x0 + i;
      const v = ys[yi++];
      y[i] = Number.isNaN(v) ? null : v;
    }
    out.set(id, { x, y });
  });
  return out;
}

function setTrials(c, list) {
  c.order = (list || []).map((t) => t[0]);
  c.trials = new Map((list || []).map((t) => [t[0], t.slice()]));
}

// {type: "trials"}: the entries that changed ({set, cells, drop, order}, keyed by trial id),
// or all of them ({all}) when most are new.
function applyTrials(c, msg) {
  if (msg.all) { setTrials(c, msg.all); return; }
  for (const id of msg.drop || []) c.trials.delete(id);
  for (const [id, t] of Object.entries(msg.set || {})) c.trials.set(id, t);
  for (const [id, changes] of Object.entries(msg.cells || {})) {
    const t = c.trials.get(id);
    if (t) for (const [i, v] of changes) t[i] = v;
  }
  if (msg.order) c.order = msg.order.slice();
}

function cacheOf(model) {
  let c = caches.get(model);
  if (!c) {
    c = { series: decodeSeries(model.get("series")), metric: model.get("metric"), views: new Set() };
    setTrials(c, model.get("trials"));
    caches.set(model, c);
    // The model's, not a view's: kept up to date while no view is rendered (a cell scrolled
    // out of a windowed notebook).
    model.on("msg:custom", (msg) => {
      if (msg.type !== "trials") return;
      applyTrials(c, msg);
      for (const v of c.views) v.redraw();
    });
  }
  return c;
}

function applyDelta(model, c, msg) {
  if (msg.metric !== c.metric) return false;
  for (const [id, d] of Object.entries(msg.trials)) {
    const have = c.series.get(id) || { x: [], y: [] };
    if (d.start > have.x.length) return false; // missed some: ask for all of it
    have.x.length = d.start; have.y.length = d.start;
    have.x.push(...d.x); have.y.push(...d.y);
    c.series.set(id, have);
  }
  return true;
}

// -- the Jupyter server extension ---------------------------------------------------------------
let serverProbe = null;

function pageConfig() {
  const el = document.getElementById("jupyter-config-data");
  try { return el ? JSON.parse(el.textContent) : {}; } catch (e) { return {}; }
}

function baseUrl() {
  let base = pageConfig().baseUrl || "/";
  return base.endsWith("/") ? base : base + "/";
}

function headers(post) {
  const h = {};
  const token = pageConfig().token;
  if (token) h["Authorization"] = "token " + token;
  if (post) {
    h["Content-Type"] = "application/json";
    const m = document.cookie.match("\\b_xsrf=([^;]*)\\b");
    if (m) h["X-XSRFToken"] = decodeURIComponent(m[1]);
  }
  return h;
}

function probeServer() {
  if (serverProbe === null) {
    serverProbe = fetch(baseUrl() + "ftnb/api/roots", { credentials: "same-origin", headers: headers(false) })
      .then((r) => r.ok).catch(() => false);
  }
  return serverProbe;
}

async function postServer(route, body) {
  const r = await fetch(baseUrl() + "ftnb/api/" + route, {
    method: "POST", credentials: "same-origin", headers: headers(true), body: JSON.stringify(body),
  });
  let data = {};
  try { data = await r.json(); } catch (e) { /* an empty or HTML answer */ }
  return { ok: r.ok, status: r.status, text: data.message || (r.ok ? "requested" : `HTTP ${r.status}`) };
}

// -- drawing ------------------------------------------------------------------------------------
function el(tag, attrs, parent, ns) {
  const e = ns ? document.createElementNS(ns, tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (parent) parent.appendChild(e);
  return e;
}

function ticks(lo, hi, n, log, whole) {
  if (log) {
    const out = [];
    for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) out.push(10 ** e);
    return out.filter((t) => t >= lo / 1.0001 && t <= hi * 1.0001);
  }
  const step0 = (hi - lo) / n || 1;
  const mag = 10 ** Math.floor(Math.log10(step0));
  let step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || step0;
  if (whole) step = Math.max(1, Math.round(step)); // iterations: 1, 2, 3, never 1.5
  const out = [];
  for (let t = Math.ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) out.push(+t.toPrecision(12));
  return out;
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(2) : +v.toPrecision(4) + "";
}

function plural(n, word) { return `${n} ${word}${n === 1 ? "" : "s"}`; }

function dashOf(shown) {
  return { ERRORED: "2 3", STOPPED: "7 3", PAUSED: "1 4", INTERRUPTED: "1 4" }[shown] || null;
}

// The plot's width: its box's (which never takes its width from the SVG: contain:
// inline-size). Hidden (a theme switch, a collapsed cell, a background tab) it measures 0: the
// last width stays and the ResizeObserver draws again once it shows; never a guessed width
// that would stay. Rendered in a box with no width of its own: 640.
function plotWidth(view) {
  const measured = view.box.clientWidth;
  if (measured > 0) return Math.max(320, measured);
  if (view.width) return view.width;
  return view.box.getClientRects().length ? 640 : 0;
}

function draw(view) {
  const { model, c, svg, legend, tip } = view;
  const width = plotWidth(view);
  view.width = width;
  const height = model.get("height") || 360;
  const log = !!model.get("log_y");
  const trials = c.order.filter((id) => c.trials.has(id)).map((id) => c.trials.get(id)).map(([id, label, s]) =>
    ({ id, label: label || id, shown: typeof s === "number" ? STATUSES[s] : s }));
  const meta = new Map(trials.map((t, i) => [t.id, { ...t, color: PALETTE[i % PALETTE.length] }]));
  view.meta = meta;
  svg.setAttribute("width", width || "100%"); svg.setAttribute("height", height);
  svg.setAttribute("viewBox", `0 0 ${width || 640} ${height}`);
  while (svg.firstChild) svg.removeChild(svg.firstChild);
  const metric = model.get("metric") || "";
  const name = metric ? `${metric} against training_iteration, ${plural(trials.length, "trial")}`
    : "ftnb chart: no metric reported yet";
  svg.setAttribute("aria-label", name);
  el("title", {}, svg, SVG).textContent = name;
  const m = { l: 56, r: 12, t: 12, b: 34 };
  let xlo = Infinity, xhi = -Infinity, ylo = Infinity, yhi = -Infinity;
  for (const s of c.series.values()) {
    for (let i = 0; i < s.x.length; i++) {
      const y = s.y[i];
      if (y === null || (log && y <= 0)) continue;
      if (s.x[i] < xlo) xlo = s.x[i];
      if (s.x[i] > xhi) xhi = s.x[i];
      if (y < ylo) ylo = y;
      if (y > yhi) yhi = y;
    }
  }
  const empty = xlo === Infinity;
  if (empty) { xlo = 0; xhi = 1; ylo = log ? 0.1 : 0; yhi = 1; }
  if (xhi === xlo) { xlo -= 1; xhi += 1; } // one iteration: its point in the middle
  if (yhi === ylo) { yhi = ylo + (Math.abs(ylo) || 1) * 0.1; ylo = log ? ylo / 1.1 : ylo - (Math.abs(ylo) || 1) * 0.1; }
  if (!log) { const pad = (yhi - ylo) * 0.04; ylo -= pad; yhi += pad; }
  const W = (width || 640) - m.l - m.r, H = height - m.t - m.b;
  const ty = log ? (y) => Math.log10(y) : (y) => y;
  const [tlo, thi] = [ty(ylo), ty(yhi)];
  const px = (x) => m.l + ((x - xlo) / (xhi - xlo)) * W;
  const py = (y) => m.t + H - ((ty(y) - tlo) / (thi - tlo)) * H;
  view.scale = { px, py, log };
  const axes = el("g", { class: "ftnb-axes" }, svg, SVG);
  for (const t of ticks(xlo, xhi, Math.max(2, Math.floor(W / 80)), false, true)) {
    el("line", { x1: px(t), x2: px(t), y1: m.t, y2: m.t + H, class: "ftnb-grid" }, axes, SVG);
    el("text", { x: px(t), y: m.t + H + 14, "text-anchor": "middle" }, axes, SVG).textContent = fmt(t);
  }
  for (const t of ticks(ylo, yhi, Math.max(2, Math.floor(H / 50)), log)) {
    el("line", { x1: m.l, x2: m.l + W, y1: py(t), y2: py(t), class: "ftnb-grid" }, axes, SVG);
    el("text", { x: m.l - 4, y: py(t) + 4, "text-anchor": "end" }, axes, SVG).textContent = fmt(t);
  }
  el("text", { x: m.l + W / 2, y: height - 4, "text-anchor": "middle" }, axes, SVG).textContent = "training_iteration";
  el("text", { x: 12, y: m.t + H / 2, "text-anchor": "middle", transform: `rotate(-90 12 ${m.t + H / 2})` },
    axes, SVG).textContent = (model.get("metric") || "") + (log ? " (log)" : "");
  const lines = el("g", { "data-testid": "ftnb-chart-lines" }, svg, SVG);
  for (const [id, s] of c.series) {
    const t = meta.get(id) || { id, label: id, shown: "", color: PALETTE[0] };
    let d = "", pen = "M";
    for (let i = 0; i < s.x.length; i++) {
      const y = s.y[i];
      if (y === null || (log && y <= 0)) { pen = "M"; continue; }
      d += `${pen}${px(s.x[i]).toFixed(1)},${py(y).toFixed(1)}`;
      pen = "L";
    }
    if (!d) continue;
    const path = el("path", { d, stroke: t.color, class: "ftnb-line", "data-trial-id": id,
      "data-status": t.shown || "" }, lines, SVG);
    const dash = dashOf(t.shown);
    if (dash) path.setAttribute("stroke-dasharray", dash);
    if (s.x.length < 3) {
      for (let i = 0; i < s.x.length; i++) {
        if (s.y[i] === null || (log && s.y[i] <= 0)) continue;
        el("circle", { cx: px(s.x[i]), cy: py(s.y[i]), r: 4, fill: t.color, "data-trial-id": id,
          "data-testid": "ftnb-point" }, lines, SVG);
      }
    }
  }
  const marks = el("g", { "data-testid": "ftnb-chart-restarts" }, svg, SVG);
  for (const r of model.get("restarts") || []) {
    if (r.y === null || (log && r.y <= 0) || r.x < xlo || r.x > xhi) continue;
    const [x, y] = [px(r.x), py(r.y)];
    const g = el("g", { class: `ftnb-mark ftnb-${r.kind}`, "data-kind": r.kind, "data-trial-id": r.trial }, marks, SVG);
    if (r.kind === "retry") {
      el("path", { d: `M${x - 5},${y - 5}L${x + 5},${y + 5}M${x - 5},${y + 5}L${x + 5},${y - 5}` }, g, SVG);
    } else {
      el("path", { d: `M${x - 4},${y - 5}L${x + 5},${y}L${x - 4},${y + 5}Z` }, g, SVG);
    }
    el("title", {}, g, SVG).textContent = r.text;
  }
  if (empty) {
    el("text", { x: m.l + W / 2, y: m.t + H / 2, "text-anchor": "middle", class: "ftnb-empty" }, svg, SVG)
      .textContent = model.get("metric") ? "no points yet" : "no metric reported yet";
  }
  // The legend: one entry per trial with points, while they fit.
  legend.textContent = "";
  const shown = trials.filter((t) => c.series.has(t.id));
  legend.style.display = shown.length && shown.length <= LEGEND_MAX ? "" : "none";
  for (const t of shown.slice(0, LEGEND_MAX)) {
    const entry = el("span", { class: "ftnb-legend-entry", "data-trial-id": t.id }, legend);
    const sw = el("span", { class: "ftnb-swatch" }, entry);
    sw.style.borderTop = `2px ${dashOf(t.shown) ? "dashed" : "solid"} ${meta.get(t.id).color}`;
    el("span", {}, entry).textContent = t.label;
    // ftnb-w-*: the widget's own classes (the lab panel's .ftnb-status must not style these).
    el("span", { class: `ftnb-w-status ftnb-w-s-${t.shown}` }, entry).textContent = t.shown;
    entry.title = `${t.id}: ${t.shown}`;
  }
  tip.style.display = "none";
}

function hover(view, event) {
  const { c, scale, meta, tip, svg } = view;
  if (!scale) return;
  const box = svg.getBoundingClientRect();
  const mx = event.clientX - box.left, my = event.clientY - box.top;
  let best = null, bestD = 400; // within 20 px
  for (const [id, s] of c.series) {
    for (let i = 0; i < s.x.length; i++) {
      const y = s.y[i];
      if (y === null || (scale.log && y <= 0)) continue;
      const dx = scale.px(s.x[i]) - mx, dy = scale.py(y) - my, d = dx * dx + dy * dy;
      if (d < bestD) { bestD = d; best = [id, s.x[i], y]; }
    }
  }
  if (!best) { tip.style.display = "none"; return; }
  const t = meta.get(best[0]) || { label: best[0], shown: "" };
  tip.textContent = "";
  el("div", { class: "ftnb-tip-label" }, tip).textContent = t.label;
  el("div", {}, tip).textContent = `${best[0]} · ${t.shown}`;
  el("div", {}, tip).textContent = `iter ${best[1]}: ${fmt(best[2])}`;
  tip.style.display = "block";
  tip.style.left = `${Math.min(mx + 12, box.width - 220)}px`;
  tip.style.top = `${my + 12}px`;
}

// -- controls ---------------------------------------------------------------------------------
function renderControls(view) {
  const { model, controls } = view;
  const ctl = model.get("controls") || {};
  const running = !!ctl.running;
  controls.stopRow.style.display = running ? "" : "none";
  const select = controls.select;
  const current = select.value;
  select.textContent = "";
  for (const [id, label] of ctl.stoppable || []) {
    el("option", { value: id }, select).textContent = label && label !== id ? `${id} (${label})` : id;
  }
  if ((ctl.stoppable || []).some(([id]) => id === current)) select.value = current;
  controls.stopTrial.disabled = !(ctl.stoppable || []).length;
  controls.resumeRow.style.display = ctl.interrupted ? "" : "none";
  controls.resumeLine.textContent = ctl.resume_line || "";
  controls.fault.style.display = ctl.storage_fault ? "" : "none";
  controls.fault.textContent = ctl.storage_fault || "";
  const tk = ctl.takeover;
  controls.takeoverRow.style.display = tk ? "" : "none";
  if (tk) controls.takeoverText.textContent = tk.text;
  controls.takeover.disabled = !(tk && tk.available);
}

function say(view, text, error) {
  view.controls.status.textContent = text;
  view.controls.status.className = error ? "ftnb-control-status ftnb-error" : "ftnb-control-status";
}

let requests = 0;

async function act(view, action, trialId) {
  const { model } = view;
  const ctl = model.get("controls") || {};
  const what = action === "stop_trial" ? `stop trial ${trialId}` : action.replace("_", " ");
  if (action === "stop_trial" && !trialId) { say(view, "choose a trial to stop first", true); return; }
  if (view.server && (action === "stop" || action === "stop_trial") && ctl.path) {
    say(view, `${what}: sending...`, false);
    try {
      const body = action === "stop" ? { path: ctl.path } : { path: ctl.path, trial_id: trialId };
      const r = await postServer(action, body);
      // 403: the server does not serve this experiment's storage (not under its roots): the
      // kernel, which opened it, can still act.
      if (r.status !== 403) {
        say(view, r.ok ? `${what}: requested (through the Jupyter server)` : `${what} refused: ${r.text}`, !r.ok);
        return;
      }
    } catch (e) {
      say(view, `${what}: the Jupyter server did not answer (${e}); asking the kernel`, true);
    }
  }
  const id = ++requests;
  view.pending.set(id, what);
  model.send({ type: action, trial_id: trialId || null, request: id, view: view.id });
  say(view, `${what}: sent to the kernel (acts once the running cell, if any, ends)`, false);
}

function buildControls(view, root) {
  const bar = el("div", { class: "ftnb-controls" }, root);
  const stopRow = el("span", { class: "ftnb-row" }, bar);
  const select = el("select", { "data-testid": "ftnb-trial-select", "aria-label": "trial to stop" }, stopRow);
  const stopTrial = el("button", { "data-testid": "ftnb-stop-trial", type: "button" }, stopRow);
  stopTrial.textContent = "Stop trial";
  const stop = el("button", { "data-testid": "ftnb-stop-experiment", type: "button", class: "ftnb-danger" }, stopRow);
  stop.textContent = "Stop experiment";
  const resumeRow = el("span", { class: "ftnb-row" }, bar);
  el("span", {}, resumeRow).textContent = "Interrupted: resume with ";
  const resumeLine = el("code", { "data-testid": "ftnb-resume-line" }, resumeRow);
  const resume = el("button", { "data-testid": "ftnb-resume", type: "button" }, resumeRow);
  resume.textContent = "Resume";
  const fault = el("div", { class: "ftnb-error", "data-testid": "ftnb-storage-fault" }, bar);
  fault.style.display = "none";
  const takeoverRow = el("span", { class: "ftnb-row", "data-testid": "ftnb-takeover-row" }, bar);
  const takeoverText = el("span", { "data-testid": "ftnb-takeover-countdown" }, takeoverRow);
  const takeover = el("button", { "data-testid": "ftnb-takeover", type: "button" }, takeoverRow);
  takeover.textContent = "Take over";
  const log = el("label", { class: "ftnb-row" }, bar);
  const logBox = el("input", { type: "checkbox", "data-testid": "ftnb-log-scale" }, log);
  el("span", {}, log).textContent = "log scale";
  const mode = el("div", { class: "ftnb-mode", "data-testid": "ftnb-control-mode" }, root);
  const status = el("div", { class: "ftnb-control-status", "data-testid": "ftnb-control-status" }, root);
  stopTrial.onclick = () => act(view, "stop_trial", select.value);
  stop.onclick = () => act(view, "stop");
  resume.onclick = () => act(view, "resume");
  takeover.onclick = () => act(view, "takeover");
  logBox.checked = !!view.model.get("log_y");
  logBox.onchange = () => { view.model.set("log_y", logBox.checked); view.model.save_changes(); };
  view.controls = { select, stopTrial, stop, stopRow, resumeRow, resumeLine, resume, fault, takeoverRow,
    takeoverText, takeover, logBox, mode, status };
}

// -- the view -----------------------------------------------------------------------------------
function render({ model, el: host }) {
  const c = cacheOf(model);
  const root = el("div", { class: "ftnb-chart", "data-testid": "ftnb-widget" }, host);
  const view = { model, c, root, id: Math.random().toString(36).slice(2), pending: new Map(), server: false };
  c.views.add(view);
  buildControls(view, root);
  const box = el("div", { class: "ftnb-plot" }, root);
  view.box = box;
  view.svg = el("svg", { "data-testid": "ftnb-chart", role: "img" }, box, SVG);
  view.tip = el("div", { class: "ftnb-tip", "data-testid": "ftnb-chart-tooltip" }, box);
  view.legend = el("div", { class: "ftnb-legend", "data-testid": "ftnb-chart-legend" }, root);
  let frame = 0;
  const redraw = () => { if (!frame) frame = requestAnimationFrame(() => { frame = 0; draw(view); }); };
  view.redraw = redraw;
  view.svg.addEventListener("mousemove", (e) => hover(view, e));
  view.svg.addEventListener("mouseleave", () => { view.tip.style.display = "none"; });

  const onCustom = (msg, buffers) => {
    if (msg.type === "series") {
      c.series = decodeSeries(msg, buffers); c.metric = msg.metric;
      if (msg.trials) setTrials(c, msg.trials);
    } else if (msg.type === "delta") {
      if (!applyDelta(model, c, msg)) { model.send({ type: "resync", view: view.id }); return; }
    } else if (msg.type === "reply") {
      if (msg.view === view.id) say(view, msg.text, !msg.ok);
      return;
    } else return;
    redraw();
  };
  const onMetric = () => { c.metric = model.get("metric"); };
  const onState = () => { renderControls(view); redraw(); };
  const onLog = () => { view.controls.logBox.checked = !!model.get("log_y"); redraw(); };
  const listeners = [["msg:custom", onCustom], ["change:metric", onMetric],
    ["change:restarts", redraw], ["change:controls", onState],
    ["change:log_y", onLog]];
  for (const [event, fn] of listeners) model.on(event, fn);
  const resize = new ResizeObserver(redraw);
  resize.observe(box);
  // A theme switch restyles the page (and may lay it out anew): draw again.
  const theme = new MutationObserver(redraw);
  theme.observe(document.body, { attributes: true, attributeFilter: ["data-jp-theme-name", "data-jp-theme-light"] });
  renderControls(view);
  draw(view);

  view.controls.mode.textContent = "Controls: checking for ftnb's Jupyter server extension...";
  probeServer().then((ok) => {
    view.server = ok;
    view.controls.mode.textContent = ok
      ? "Stop buttons act through the Jupyter server: they work while the kernel is busy."
      : "Controls wait for the kernel: while a cell runs, they act when it ends.";
  });

  const report = (event) => {
    let n = 0;
    for (const s of c.series.values()) n += s.x.length;
    try { model.send({ type: "view", view: view.id, event, metric: c.metric, points: n }); } catch (e) { /* closed */ }
  };
  // A tab in the background is nobody looking: it says so, and beats only while visible.
  const visible = () => document.visibilityState !== "hidden";
  report(visible() ? "open" : "close");
  const beat = setInterval(() => { if (visible()) report("beat"); }, HEARTBEAT_MS);
  const bye = () => report("close");
  const onVisibility = () => report(visible() ? "open" : "close");
  window.addEventListener("pagehide", bye);
  document.addEventListener("visibilitychange", onVisibility);
  return () => {
    clearInterval(beat);
    window.removeEventListener("pagehide", bye);
    document.removeEventListener("visibilitychange", onVisibility);
    resize.disconnect();
    theme.disconnect();
    for (const [event, fn] of listeners) model.off(event, fn);
    c.views.delete(view);
    bye();
  };
}

export default { render };
