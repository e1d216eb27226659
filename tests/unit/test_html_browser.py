"""Open the HTML report in headless Chromium (Debian's `chromium`), driven over
the DevTools protocol on a pipe: the page must load with no console errors, no
uncaught exceptions and no network request, and its plots must render (SVG
marks with non-empty boxes, in the expected numbers, and a screenshot that is
not blank)."""

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
from test_tools_capture import write_device_capture

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

TIMEOUT_S = 60

#: Evaluated in the page: marks per plot and how many of them have an empty box.
MEASURE = """JSON.stringify(Object.fromEntries(
  [["ev", "#timeline-plot rect.ev"], ["kern", "#timeline-plot rect.kern"], ["lanes", "#timeline-plot text.lane"],
   ["series", "#memory-plot path.series"], ["peaks", "#memory-plot circle.peak"],
   ["cells", "#heatmap-plot rect.cell"], ["tables", "table.tool"]]
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


def load(page: Path, profile: Path) -> dict:
    """Load `page`; return its console/exception/log errors, non-file requests,
    mark measurements and the screenshot's pixel statistics."""
    dt = DevTools(profile)
    try:
        target = dt.call("Target.createTarget", url="about:blank")["targetId"]
        s = dt.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            dt.call(f"{domain}.enable", s)
        dt.call("Emulation.setDeviceMetricsOverride", s, width=1100, height=1600, deviceScaleFactor=1, mobile=False)
        dt.call("Page.navigate", s, url=page.as_uri())
        dt.wait_for("Page.loadEventFired")
        measured = json.loads(dt.call("Runtime.evaluate", s, expression=MEASURE, returnByValue=True)["result"]["value"])
        shot = dt.call("Page.captureScreenshot", s, format="png", captureBeyondViewport=False)["data"]
        pixels = json.loads(dt.call("Runtime.evaluate", s, expression=PIXELS % shot, awaitPromise=True,
                                    returnByValue=True)["result"]["value"])
        events = list(dt.events)
    finally:
        dt.close()
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
    return {"errors": errors, "requests": requests, "marks": measured, "pixels": pixels,
            "png": base64.b64decode(shot)}


def test_report_renders_in_chromium(tmp_path: Path, capsys) -> None:
    page = tmp_path / "report.html"
    assert cli.main(["report", str(write_device_capture(tmp_path / "cap")), "--html", str(page)]) == 0
    capsys.readouterr()
    got = load(page, tmp_path / "profile")
    (tmp_path / "report.png").write_bytes(got["png"])
    assert got["errors"] == []
    assert got["requests"] == []
    # [marks, marks with an empty box]: 18 host events at distinct pixels; 4 kernel executions;
    # 2 thread lanes + 2 stream lanes; one memory series and one peak per process;
    # 8 (page, launch) cells; one table per tool with rows (24 tools; copy_storms and api_errors found nothing)
    assert got["marks"] == {
        "ev": [18, 0], "kern": [4, 0], "lanes": [4, 0], "series": [2, 0], "peaks": [2, 0],
        "cells": [8, 0], "tables": [22, 0],
    }
    px = got["pixels"]
    assert (px["width"], px["height"]) == (1100, 1600)
    # a blank page has one colour; this one has the plots' and tables' colours
    assert px["colours"] > 50
    assert px["differ"] > 100_000


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
