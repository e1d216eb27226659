"""A library written while the capture runs is probed once it is loaded: the
`cp` that writes it is not paused, and a file that got no probe is tried
again at its next open (not marked done with 0 probes)."""

from __future__ import annotations

import pytest

import expect
from pasta_run import read_report, run_pasta
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]


def test_library_copied_in_during_the_capture_is_traced(families, tmp_path):
    cuda = next(f for f in families if f.name == "cuda")
    d = tmp_path / "d"
    d.mkdir()
    report = tmp_path / "cuda.json"
    lib = d / "libcuda.so.1"
    script = (f"cp {cuda.stub} {lib} && exec {cuda.workload} --lib {lib} --report {report} "
              "--threads 1 --iters 1")
    out = tmp_path / "cap"
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    rep = read_report(report)
    assert expect.mismatches(cap, [rep], {"setup", "before_go", "run"}) == []
    assert cap.manifest["counts"]["events"] == len(expect.expected_calls(rep, {"setup", "before_go", "run"}))
    assert cap.manifest["counts"]["lost_events"] == 0
