"""The HTML report's style sheet and its one small script, both inline: the
page loads nothing from anywhere.  The script only adds to a page that reads
well without it: it fits the time plots to the window, zooms them (drag across
a plot to zoom into that range; ctrl+wheel; the buttons), labels kernels where
their names fit, sorts tables by a click on a header, and shows the frame
under the pointer in a flame graph."""

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',sans-serif;margin:0;color:#1d232a;background:#f4f5f7}
header{background:#1d2b3a;color:#fff;padding:18px 28px}
header h1{margin:0 0 8px;font-size:22px;font-weight:600}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 16px;margin:0;font-size:13px}
dl.facts dt{color:#9fb3c8}dl.facts dd{margin:0;font-family:ui-monospace,monospace}
.banner{background:#c62828;color:#fff;font-weight:700;padding:10px 28px;font-size:15px}
nav{padding:8px 28px;background:#e4e7eb;font-size:13px}nav a{margin-right:14px;color:#1d4e89;white-space:nowrap;display:inline-block}
section{background:#fff;margin:16px 28px;padding:14px 18px;border-radius:6px;box-shadow:0 1px 2px #0002}
section h2{font-size:17px;margin:0 0 4px}section h3{font-size:14px;margin:14px 0 4px}
section p.desc{margin:0 0 10px;color:#52606d;font-size:13px}
p.note{color:#7b8794;font-style:italic}
dl.findings{display:grid;grid-template-columns:max-content 1fr;gap:4px 18px;margin:6px 0 0;font-size:14px}
dl.findings dt{font-weight:600;color:#52606d}dl.findings dd{margin:0}
dl.findings code{font-family:ui-monospace,monospace;font-size:13px}
svg.plot{display:block;width:100%;height:auto;user-select:none}
svg.tplot{cursor:crosshair}svg.tplot rect.bg{fill:transparent}
svg.tplot .view rect,svg.tplot .view path,svg.tplot .view line{vector-effect:non-scaling-stroke}
svg.tplot rect.ev{stroke-width:2}svg.tplot rect.kern{stroke-width:1}
svg.tplot line.peak{stroke-width:7;stroke-linecap:round}
svg.tplot rect.sel{fill:#1d4e8922;stroke:#1d4e89}
svg text{font:11px system-ui,sans-serif;fill:#3e4c59}svg text.klabel{fill:#fff;pointer-events:none}
.axis,.tick{stroke:#7b8794}.grid{stroke:#e4e7eb}
.legend{font-size:12px;margin:6px 0 0 190px}.key{margin-right:14px;white-space:nowrap}.key svg{margin-right:4px;vertical-align:middle}
.zoombar{display:none;gap:6px;align-items:center;font-size:12px;color:#52606d;margin:0 0 6px 190px}
.js .zoombar{display:flex;flex-wrap:wrap}.zoombar .hint{margin-left:10px;color:#7b8794}.zoombar button{font:12px system-ui,sans-serif;padding:1px 8px;cursor:pointer;white-space:nowrap}
.ramp{display:inline-block;width:120px;height:10px;margin-right:8px;vertical-align:middle;
background:linear-gradient(90deg,rgb(255,245,235),rgb(127,39,4))}
svg.flame{display:block}svg.flame rect.fr{stroke:#fff;stroke-width:.5}svg.flame rect.fr:hover{stroke:#1d232a;stroke-width:1}
svg.flame svg.fl{pointer-events:none}svg.flame text{font:11px ui-monospace,monospace;fill:#1d232a}
.flame-detail{font:12px ui-monospace,monospace;color:#3e4c59;min-height:1.5em;margin:4px 0 8px}
table.tool{border-collapse:collapse;font-size:12px;width:100%}
table.tool th{text-align:left;background:#f0f2f5;padding:4px 8px;border-bottom:1px solid #cbd2d9;position:sticky;top:0;
cursor:pointer;white-space:nowrap;user-select:none}
table.tool th.num{text-align:right}table.tool th[aria-sort=ascending]::after{content:" \\25B2"}
table.tool th[aria-sort=descending]::after{content:" \\25BC"}
table.tool td{padding:3px 8px;border-bottom:1px solid #eef0f2;font-family:ui-monospace,monospace;white-space:nowrap}
table.tool td.num{text-align:right}table.tool td.wrap{white-space:normal;min-width:18em;overflow-wrap:anywhere}
table.tool caption{caption-side:bottom;text-align:left;color:#7b8794;padding-top:4px}
.scroll{max-height:480px;overflow:auto}
footer{color:#7b8794;font-size:12px;padding:8px 28px 24px}
"""

SCRIPT = r"""
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
"""
