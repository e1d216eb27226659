"""Open the HTML report in headless Chromium (Debian's `chromium`), driven over
the DevTools protocol on a pipe: the page must load with no console errors, no
uncaught exceptions and no network request; its plots must render (SVG marks
with non-empty boxes, in the expected numbers, and a screenshot that is not
blank) and fill the window's width; and what a person does must work on
screen: dragging across the timeline zooms it (and the memory plot with it),
a click on a header sorts a table, and hovering a flame graph's frame names
its function (file:line)."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pasta_trace import cli
from test_flame import write_stacked_capture

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

TIMEOUT_S = 60

#: Evaluated in the page: marks per plot and how many of them have an empty box.
MEASURE = """JSON.stringify(Object.fromEntries(
  [["ev", "#timeline-plot rect.ev"], ["kern", "#timeline-plot rect.kern"], ["lanes", "#timeline-plot text.lane"],
   ["series", "#memory-plot path.series"], ["cells", "#heatmap-plot rect.cell"], ["tables", "table.tool"],
   ["flame_sync", "#flame-sync rect.fr"], ["flame_allocated", "#flame-allocated rect.fr"],
   ["flame_peak", "#flame-peak rect.fr"]]
  .map(([k, sel]) => {
    const els = [...document.querySelectorAll(sel)];
    const empty = els.filter(e => { const r = e.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); });
    return [k, [els.length, empty.length]];
  })))"""

#: Evaluated in the page: decode a PNG (the screenshot) and count its colours.
PIXELS = """(async () => {
  const img = new Image(); img.src = "data:image/png;base64,%s"; await img.decode();
  const c = document.createElement("canvas"); c.width = img.width; c.height = img.height;
  const g = c.getContext("2d"); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data;
  const colours = new Set(); let first = -1, differ = 0;
  for (let i = 0; i < d.length; i += 4) {
    const v = (d[i] << 16) | (d[i + 1] << 8) | d[i + 2];
    colours.add(v); if (first < 0) first = v; if (v !== first) differ++;
  }
  return JSON.stringify({width: c.width, height: c.height, colours: colours.size, differ});
})()"""


class DevTools:
    """A Chromium started with --remote-debugging-pipe (fd 3 in, fd 4 out):
    JSON messages separated by NUL bytes."""

    def __init__(self, profile: Path) -> None:
        to_chrome_r, self._w = os.pipe()
        self._r, from_chrome_w = os.pipe()

        def fds() -> None:
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--disable-extensions", "--hide-scrollbars", f"--user-data-dir={profile}",
             "about:blank"],
            pass_fds=(3, 4), preexec_fn=fds, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _read(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                raise TimeoutError("chromium did not answer")
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise EOFError("chromium closed the pipe")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method: str, session: str | None = None, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            reply = self._read(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        for e in self.events:
            if e.get("method") == method:
                return e
        while True:
            e = self._read(deadline)
            self.events.append(e)
            if e.get("method") == method:
                return e

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (TimeoutError, EOFError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._r)
        os.close(self._w)


class Page:
    """One page open in a DevTools session."""

    def __init__(self, dt: DevTools, session: str) -> None:
        self.dt, self.s = dt, session

    def js(self, expression: str) -> object:
        """The value of `expression`; a JSON string comes back decoded."""
        value = self.dt.call("Runtime.evaluate", self.s, expression=expression, returnByValue=True,
                             awaitPromise=True)["result"].get("value")
        return json.loads(value) if isinstance(value, str) and value[:1] in "[{" else value

    def box(self, selector: str) -> dict:
        return self.js(f"JSON.stringify(document.querySelector({json.dumps(selector)}).getBoundingClientRect())")

    def mouse(self, kind: str, x: float, y: float, **extra) -> None:
        self.dt.call("Input.dispatchMouseEvent", self.s, type=kind, x=x, y=y, **extra)

    def click(self, x: float, y: float) -> None:
        for kind in ("mousePressed", "mouseReleased"):
            self.mouse(kind, x, y, button="left", buttons=1, clickCount=1)


def open_page(dt: DevTools, page: Path, width: int, height: int) -> Page:
    target = dt.call("Target.createTarget", url="about:blank")["targetId"]
    s = dt.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
    for domain in ("Page", "Runtime", "Log", "Network"):
        dt.call(f"{domain}.enable", s)
    dt.call("Emulation.setDeviceMetricsOverride", s, width=width, height=height, deviceScaleFactor=1, mobile=False)
    dt.call("Page.navigate", s, url=page.as_uri())
    dt.wait_for("Page.loadEventFired")
    return Page(dt, s)


def problems(events: list[dict]) -> tuple[list[dict], list[str]]:
    """The page's console errors and uncaught exceptions, and its requests for anything not in the file."""
    errors = [
        e["params"] for e in events
        if e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")
    ]
    requests = [
        e["params"]["request"]["url"] for e in events
        if e.get("method") == "Network.requestWillBeSent" and not e["params"]["request"]["url"].startswith(("file:", "data:"))
    ]
    return errors, requests


def screenshot(p: Page) -> tuple[bytes, dict]:
    """The viewport as PNG, and its pixel statistics."""
    shot = p.dt.call("Page.captureScreenshot", p.s, format="png", captureBeyondViewport=False)["data"]
    return base64.b64decode(shot), p.js(PIXELS % shot)


def load(page: Path, profile: Path) -> dict:
    """Load `page`; return its console/exception/log errors, non-file requests,
    mark measurements and the screenshot's pixel statistics."""
    dt = DevTools(profile)
    try:
        p = open_page(dt, page, 1100, 1600)
        measured = p.js(MEASURE)
        png, pixels = screenshot(p)
        events = list(dt.events)
    finally:
        dt.close()
    errors, requests = problems(events)
    return {"errors": errors, "requests": requests, "marks": measured, "pixels": pixels, "png": png}


WIDTH = 1280  # a laptop's window
#: section margin 28 px and padding 18 px on each side; the time plots' lane labels 190 px, right margin 20 px
CONTENT_W = WIDTH - 2 * 28 - 2 * 18
VIEW_W = CONTENT_W - 190 - 20


def texts(p: Page, selector: str) -> list[str]:
    return p.js(f"JSON.stringify([...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent))")


def test_report_renders_in_chromium(tmp_path: Path, capsys) -> None:
    page = tmp_path / "report.html"
    assert cli.main(["report", str(write_stacked_capture(tmp_path / "cap")), "--html", str(page)]) == 0
    capsys.readouterr()
    dt = DevTools(tmp_path / "profile")
    try:
        p = open_page(dt, page, WIDTH, 1600)
        marks = p.js(MEASURE)
        png, pixels = screenshot(p)
        (tmp_path / "report.png").write_bytes(png)
        # the plots fill the window's width, and the time plots' text is not scaled: one drawing unit per pixel
        widths = {sel: p.box(sel)["width"] for sel in ("#timeline-plot", "#memory-plot", "#heatmap-plot",
                                                          "#flame-sync", "#timeline-plot svg.view")}
        scale = p.js("document.querySelector('#timeline-plot').viewBox.baseVal.width")
        # key findings first, then the plots
        sections = p.js("JSON.stringify([...document.querySelectorAll('section')].slice(0, 4).map(s => s.id))")
        findings = texts(p, "#findings dt")
        # processes: the numbers before the command line
        proc_heads = texts(p, "#table-processes th")
        zoom = check_zoom(p)
        sort = check_sort(p)
        hover = check_flame_hover(p)
        events = list(dt.events)
    finally:
        dt.close()
    errors, requests = problems(events)
    assert errors == []
    assert requests == []
    # [marks, marks with an empty box]: 18 host events at distinct times; 4 kernel executions;
    # 2 thread lanes + 2 stream lanes; one memory series per process; 8 (page, launch) cells; one table per tool
    # with rows (24 tools; copy_storms and api_errors found nothing); flame graph frames (test_flame.py):
    # 7 of time blocked in syncs, 12 of bytes allocated, 10 of bytes live at the peak
    assert marks == {
        "ev": [18, 0], "kern": [4, 0], "lanes": [4, 0], "series": [2, 0], "cells": [8, 0], "tables": [22, 0],
        "flame_sync": [7, 0], "flame_allocated": [12, 0], "flame_peak": [10, 0],
    }
    assert widths == {"#timeline-plot": CONTENT_W, "#memory-plot": CONTENT_W, "#heatmap-plot": CONTENT_W,
                      "#flame-sync": CONTENT_W, "#timeline-plot svg.view": VIEW_W}
    assert scale == CONTENT_W
    assert sections == ["findings", "timeline", "memory", "flames"]
    assert findings == ["top kernel", "syncs", "peak memory", "errors", "leaks"]
    assert proc_heads[:4] == ["pid", "process", "threads", "calls"] and proc_heads[-1] == "command line"
    assert zoom == ZOOMED
    assert sort == SORTED
    assert hover == "Model.step (model.py:31) · 2.0 µs (57.1%)"
    assert (pixels["width"], pixels["height"]) == (WIDTH, 1600)
    # a blank page has one colour; this one has the plots' and tables' colours
    assert pixels["colours"] > 50
    assert pixels["differ"] > 100_000


#: The timeline's window is 1 µs to 20.5 µs after the capture's start (its first and last call); at 978 px the
#: kernels are 130 px (hip_fill), 50 px (each axpy) and 30 px (reduce: too narrow for its name) wide.
#: Dragging across the middle third of the plot shows 7.5 µs to 14 µs: three times as wide, only reduce in
#: full view, now with its name; the memory plot follows.
ZOOMED = {
    "before": {"view": "1000 20500", "ticks": ["5 µs", "10 µs", "15 µs", "20 µs"],
               "labels": ["hip_fill", "axpy", "axpy"], "reduce": 30.1},
    "selecting": VIEW_W / 6,
    "after": {"view": "7500 14000", "ticks": ["8 µs", "9 µs", "10 µs", "11 µs", "12 µs", "13 µs", "14 µs"],
              "labels": ["reduce"], "reduce": 90.3},
    "memory": "7500 14000",
}


def check_zoom(p: Page) -> dict:
    def state() -> dict:
        return {
            "view": p.js("document.querySelector('#timeline-plot').dataset.view"),
            "ticks": texts(p, "#timeline-plot g.taxis text"),
            "labels": texts(p, "#timeline-plot text.klabel"),
            "reduce": round(p.js("document.querySelectorAll('#timeline-plot rect.kern')[3].getBoundingClientRect()"
                                 ".width"), 1),
        }

    before = state()
    view = p.box("#timeline-plot svg.view")
    y = view["y"] + 10
    # whole pixels (mouse events carry whole pixels): a third and two thirds of the plot
    x0, x1 = view["x"] + VIEW_W / 3, view["x"] + VIEW_W * 2 / 3
    assert (x0, x1) == (int(x0), int(x1))
    p.mouse("mousePressed", x0, y, button="left", buttons=1, clickCount=1)
    p.mouse("mouseMoved", (x0 + x1) / 2, y, button="left", buttons=1)
    selecting = p.box("#timeline-plot rect.sel")["width"]  # the range being selected shows while dragging
    p.mouse("mouseMoved", x1, y, button="left", buttons=1)
    p.mouse("mouseReleased", x1, y, button="left", buttons=1, clickCount=1)
    return {"before": before, "selecting": selecting, "after": state(),
            "memory": p.js("document.querySelector('#memory-plot').dataset.view")}


#: The kernels table, in the tool's order, then sorted by a click on "GPU time (µs)", then by a second click.
SORTED = {
    "heads": ["pid", "kernel", "launches", "launches/s", "shapes", "top grid", "top block", "first at (s)",
              "last at (s)", "API time (ns)", "API mean (ns)", "GPU time (µs)", "GPU mean (µs)"],
    "rows": [["axpy", "reduce", "hip_fill"], ["reduce", "axpy", "hip_fill"], ["hip_fill", "axpy", "reduce"]],
}


def check_sort(p: Page) -> dict:
    heads = texts(p, "#table-kernels th")
    names = "JSON.stringify([...document.querySelectorAll('#table-kernels tbody tr')].map(r => r.cells[1].textContent))"
    rows = [p.js(names)]
    p.js("document.querySelector('#table-kernels').scrollIntoView()")
    th = p.box(f"#table-kernels th:nth-child({heads.index('GPU time (µs)') + 1})")
    for _ in range(2):
        p.click(th["x"] + th["width"] / 2, th["y"] + th["height"] / 2)
        rows.append(p.js(names))
    return {"heads": heads, "rows": rows}


def check_flame_hover(p: Page) -> str:
    """Move the pointer over the frame of Model.step (model.py:31); the line under the graph names it."""
    p.js("document.querySelector('#flame-sync').scrollIntoView()")
    r = p.js("""JSON.stringify([...document.querySelectorAll('#flame-sync rect.fr')]
      .find(e => e.querySelector('title').textContent.startsWith('Model.step (model.py:31)')).getBoundingClientRect())""")
    p.mouse("mouseMoved", r["x"] + r["width"] / 2, r["y"] + r["height"] / 2)
    return p.js("document.querySelector('#flame-sync-detail').textContent")
def test_the_check_catches_a_broken_page(tmp_path: Path) -> None:
    # the same measurement on a page with a script error and a network request must fail loudly
    bad = tmp_path / "bad.html"
    bad.write_text('<!DOCTYPE html><html><body><script>no_such_function();</script>'
                   '<img src="http://192.0.2.1/x.png"></body></html>')
    got = load(bad, tmp_path / "profile")
    assert len(got["errors"]) >= 1
    assert any("no_such_function" in json.dumps(e) for e in got["errors"])
    assert got["requests"] == ["http://192.0.2.1/x.png"]
    assert got["marks"]["series"] == [0, 0]


def test_tensor_memory_plots_render_and_zoom_with_the_timeline(tmp_path: Path, capsys) -> None:
    """A PyTorch-like capture (synthetic tensors, two processes): one stacked plot per process and device, each
    band drawn, as wide as the page, zoomed with the timeline."""
    from pasta_trace.testing import synthetic

    synthetic.write_capture(tmp_path / "cap", synthetic.Spec(pids=2, launches=20, allocations=8, accesses=200,
                                                             stacks=True, tensors=60))
    page = tmp_path / "report.html"
    assert cli.main(["report", str(tmp_path / "cap"), "--html", str(page)]) == 0
    capsys.readouterr()
    dt = DevTools(tmp_path / "profile")
    try:
        p = open_page(dt, page, WIDTH, 1600)
        plots = p.js("JSON.stringify([...document.querySelectorAll('#tensors svg.tplot')].map(s => s.id))")
        bands = p.js("""JSON.stringify([...document.querySelectorAll('#tensors path.band')].map(e => {
          const r = e.getBoundingClientRect(); return r.width > 0 && r.height > 0; }))""")
        widths = {p.box(f"#{pid}")["width"] for pid in plots}
        nav = texts(p, "nav a")
        view = p.box("#timeline-plot svg.view")
        x0, x1, y = view["x"] + VIEW_W // 4, view["x"] + VIEW_W // 2, view["y"] + 10
        p.mouse("mousePressed", x0, y, button="left", buttons=1, clickCount=1)
        p.mouse("mouseMoved", x1, y, button="left", buttons=1)
        p.mouse("mouseReleased", x1, y, button="left", buttons=1, clickCount=1)
        views = {p.js(f"document.querySelector('#{pid}').dataset.view") for pid in [*plots, "timeline-plot"]}
        events = list(dt.events)
    finally:
        dt.close()
    assert problems(events) == ([], [])
    # pids 4242 and 4259, each with CPU tensors and CUDA tensors
    assert plots == ["tensor-plot-4242-cpu", "tensor-plot-4242-cuda-0", "tensor-plot-4259-cpu",
                     "tensor-plot-4259-cuda-0"]
    # cpu: the activations; cuda:0: bytes from before the capture, weights, activations, the growing cache
    assert bands == [True] * (1 + 4 + 1 + 4)
    assert widths == {CONTENT_W}
    assert nav[:5] == ["key findings", "timeline chart", "memory chart", "tensor memory chart", "flame graphs"]
    assert len(nav) == len(set(nav))  # no two links read the same (the memory chart and the memory tool did)
    assert len(views) == 1  # every time plot shows the range dragged across the timeline
