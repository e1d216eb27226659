document.documentElement.classList.add("js");
(() => {
const NS = document.querySelector("svg")?.namespaceURI;  // SVG's; spelled out, it would read as an address
const el = (tag, attrs, text) => {
  const e = document.createElementNS(NS, tag);
  for (const k in attrs) e.setAttribute(k, attrs[k]);
  if (text !== undefined) e.textContent = text;
  return e;
};
const nice = (span, n) => {
  const raw = span / n, mag = 10 ** Math.floor(Math.log10(raw));
  return [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw);
};
// ns as the axis writes it: in the largest unit where `step` has at most one decimal, with `more` decimals
const fmt = (ns, step, more = 0) => {
  const [u, s] = [["s", 1e9], ["ms", 1e6], ["µs", 1e3]].find(([, s]) => step >= s / 10) || ["ns", 1];
  return (ns / s).toFixed(Math.max(0, -Math.floor(Math.log10(step / s) + 1e-9)) + more) + " " + u;
};
const plots = [...document.querySelectorAll("svg.tplot")];
const XS = plots.length ? +plots[0].dataset.xs : 1;
let v0 = 0, v1 = XS;

function drawPlot(svg) {
  const L = +svg.dataset.left, R = +svg.dataset.right, H = svg.viewBox.baseVal.height;
  // the width the page gives the plot (CSS width:100%): one unit of the drawing per pixel
  const W = Math.max(Math.round(svg.getBoundingClientRect().width), L + R + 100), pw = W - L - R;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("width", W);
  const view = svg.querySelector("svg.view"), vh = view.viewBox.baseVal.height;
  view.setAttribute("width", pw);
  view.setAttribute("viewBox", `${v0} 0 ${v1 - v0} ${vh}`);
  const off = +svg.dataset.offset, span = +svg.dataset.span;
  const a = off + v0 / XS * span, b = off + v1 / XS * span, step = nice(b - a, Math.max(2, Math.round(pw / 140)));
  svg.dataset.view = `${a} ${b}`;
  const axis = svg.querySelector("g.taxis");
  axis.replaceChildren(el("line", {class: "axis", x1: L, y1: vh, x2: L + pw, y2: vh}));
  for (let t = Math.ceil(a / step) * step; t <= b + step * 1e-9; t += step) {
    const x = L + (t - a) / (b - a) * pw;
    axis.append(el("line", {class: "tick", x1: x, y1: vh, x2: x, y2: vh + 4}),
                el("text", {class: "tlabel", x: x, y: vh + 16, "text-anchor": "middle"}, fmt(t, step)));
  }
  const labels = svg.querySelector("g.klabels");
  labels.replaceChildren();
  for (const k of svg.querySelectorAll("rect.kern")) {
    const kx = +k.getAttribute("x"), s0 = Math.max(kx, v0), s1 = Math.min(kx + +k.getAttribute("width"), v1);
    const px0 = L + (s0 - v0) / (v1 - v0) * pw, room = (s1 - s0) / (v1 - v0) * pw - 6;
    if (room < 20) continue;
    const t = el("text", {class: "klabel", x: px0 + 3, y: +k.getAttribute("y") + 11}, k.dataset.name);
    labels.append(t);
    if (t.getComputedTextLength() > room) t.remove();
  }
}
function draw() {
  plots.forEach(drawPlot);
  const r = document.getElementById("zoom-range");
  if (r && plots.length) {
    const [a, b] = plots[0].dataset.view.split(" ").map(Number), step = nice(b - a, 6);
    r.textContent = `showing ${fmt(a, step, 2)} to ${fmt(b, step, 2)}`;
  }
}
function show(a, b) {
  const w = Math.min(XS, Math.max(XS * 1e-5, b - a));
  v0 = Math.min(Math.max(0, a), XS - w);
  v1 = v0 + w;
  draw();
}
const zoom = (frac, factor) => {
  const c = v0 + frac * (v1 - v0), w = (v1 - v0) * factor;
  show(c - frac * w, c - frac * w + w);
};
for (const svg of plots) {
  const view = svg.querySelector("svg.view");
  const at = e => { const r = view.getBoundingClientRect(); return Math.min(1, Math.max(0, (e.clientX - r.left) / r.width)); };
  svg.addEventListener("wheel", e => {
    if (!(e.ctrlKey || e.metaKey)) return;
    e.preventDefault();
    zoom(at(e), Math.exp(e.deltaY * 0.002));
  }, {passive: false});
  let from = null, sel = null;
  svg.addEventListener("mousedown", e => {
    if (e.button !== 0) return;
    from = at(e);
    e.preventDefault();
  });
  window.addEventListener("mousemove", e => {
    if (from === null) return;
    const to = at(e), L = +svg.dataset.left, pw = view.width.baseVal.value;
    if (!sel) svg.append(sel = el("rect", {class: "sel", y: 0, height: view.height.baseVal.value}));
    sel.setAttribute("x", L + Math.min(from, to) * pw);
    sel.setAttribute("width", Math.abs(to - from) * pw);
  });
  window.addEventListener("mouseup", e => {
    if (from === null) return;
    const to = at(e), a = Math.min(from, to), b = Math.max(from, to);
    from = null;
    if (sel) { sel.remove(); sel = null; }
    if (b - a > 0.005) show(v0 + a * (v1 - v0), v0 + b * (v1 - v0));
  });
  svg.addEventListener("dblclick", () => show(0, XS));
}
for (const b of document.querySelectorAll("button[data-zoom]")) {
  b.addEventListener("click", () => {
    const w = v1 - v0;
    ({in: () => zoom(0.5, 0.5), out: () => zoom(0.5, 2), left: () => show(v0 - w / 2, v1 - w / 2),
      right: () => show(v0 + w / 2, v1 + w / 2), reset: () => show(0, XS)})[b.dataset.zoom]();
  });
}
window.addEventListener("resize", draw);
draw();

for (const th of document.querySelectorAll("table.tool th")) {
  th.addEventListener("click", () => {
    const body = th.closest("table").tBodies[0], i = th.cellIndex;
    const up = th.getAttribute("aria-sort") !== "ascending";
    for (const o of th.parentNode.children) o.removeAttribute("aria-sort");
    th.setAttribute("aria-sort", up ? "ascending" : "descending");
    const key = td => td.dataset.v === undefined ? td.textContent : td.dataset.v === "" ? null : +td.dataset.v;
    const rows = [...body.rows].sort((r, s) => {
      const a = key(r.cells[i]), b = key(s.cells[i]);
      if (a === null || b === null) return (a === null) - (b === null);  // empty cells last either way
      const c = typeof a === "number" ? a - b : a.localeCompare(b);
      return up ? c : -c;
    });
    body.append(...rows);
  });
}

for (const g of document.querySelectorAll("svg.flame")) {
  const detail = document.getElementById(g.id + "-detail");
  g.addEventListener("mouseover", e => {
    const r = e.target.closest("rect.fr");
    if (r) detail.textContent = r.querySelector("title").textContent;
  });
}
})();
