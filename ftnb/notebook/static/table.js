// ftnb's trial table: an anywidget ES module. The model state holds "columns", "more" and
// "rows" ({order, cells}: every shown row); the kernel then sends only what changed:
// {type: "rows", set: {trial_id: cells}, cells: {trial_id: [[index, value]]}, drop: [trial_id],
// order: [trial_id] | null}, or the
// whole table after its columns changed ({type: "table", order, cells}).
const caches = new WeakMap();

function cacheOf(model) {
  let c = caches.get(model);
  if (!c) {
    const t = model.get("rows") || { order: [], cells: [] };
    c = { order: t.order.slice(), cells: new Map(t.order.map((id, i) => [id, t.cells[i]])), views: new Set() };
    caches.set(model, c);
    // The model's, not a view's: kept up to date while no view is rendered (a cell scrolled
    // out of a windowed notebook).
    model.on("msg:custom", (msg) => {
      if (msg.type !== "table" && msg.type !== "rows") return;
      apply(c, msg);
      for (const v of c.views) draw(v);
    });
  }
  return c;
}

function apply(c, msg) {
  if (msg.type === "table") {
    c.order = msg.order.slice();
    c.cells = new Map(msg.order.map((id, i) => [id, msg.cells[i]]));
    return;
  }
  for (const id of msg.drop || []) c.cells.delete(id);
  for (const [id, cells] of Object.entries(msg.set || {})) c.cells.set(id, cells);
  for (const [id, changes] of Object.entries(msg.cells || {})) {
    const cells = c.cells.get(id);
    if (cells) for (const [i, v] of changes) cells[i] = v;
  }
  if (msg.order) c.order = msg.order.slice();
}

function draw(view) {
  const { model, c, table, more } = view;
  const head = document.createElement("thead"), hr = head.insertRow();
  for (const h of model.get("columns") || []) {
    const th = document.createElement("th");
    th.textContent = h;
    hr.appendChild(th);
  }
  const body = document.createElement("tbody");
  for (const id of c.order) {
    const cells = c.cells.get(id);
    if (!cells) continue;
    const tr = body.insertRow();
    tr.dataset.trialId = id;
    cells.forEach((text, i) => {
      const td = tr.insertCell();
      td.textContent = text;
      if (i === 1) td.className = `ftnb-w-status ftnb-w-s-${text}`;
    });
  }
  table.replaceChildren(head, body);
  more.textContent = model.get("more") || "";
  more.style.display = more.textContent ? "" : "none";
}

function render({ model, el }) {
  const c = cacheOf(model);
  const root = document.createElement("div"), box = document.createElement("div");
  root.className = "ftnb-w";
  box.className = "ftnb-table-box";
  const table = document.createElement("table");
  table.className = "ftnb-w-table";
  table.dataset.testid = "ftnb-table";
  const more = document.createElement("div");
  more.className = "ftnb-w-muted";
  more.dataset.testid = "ftnb-table-more";
  box.append(table);
  root.append(box, more);
  el.append(root);
  const view = { model, c, table, more };
  c.views.add(view);
  const redraw = () => draw(view);
  model.on("change:columns", redraw);
  model.on("change:more", redraw);
  draw(view);
  return () => {
    model.off("change:columns", redraw);
    model.off("change:more", redraw);
    c.views.delete(view);
  };
}

export default { render };
