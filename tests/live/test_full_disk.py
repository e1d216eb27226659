"""A capture whose disk fills up mid-way: what was written stays, every
event is accounted for, nothing temporary is left, the manifest is completed,
and the exit is one line and code 1 (before: a traceback, 0 events kept, a
.tmp left behind and "INCOMPLETE: 0 events lost")."""

from __future__ import annotations

import json
import os

import polars as pl
import pytest

import expect
from pasta_run import read_report, run_pasta

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

# about 0.9 bytes a launch of this flood on disk (dictionary- and delta-encoded files): 7 MB, more than
# twice the 3 MiB the 4 MiB file system leaves beside the 1 MiB held for the manifest
FLOOD = 8_000_000


def test_a_disk_that_fills_mid_capture_loses_nothing_silently(cuda_stub, cuda_workload, small_fs, tmp_path):
    out, report = small_fs / "cap", tmp_path / "report.json"
    r = run_pasta(["-o", str(out), "--", str(cuda_workload), "--lib", str(cuda_stub), "--report", str(report),
                   "--threads", "1", "--flood", str(FLOOD)], timeout=300)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["complete"] is True
    c = manifest["counts"]
    files = sorted(out.glob("events-*.parquet"))
    assert sum(pl.read_parquet(f).height for f in files) == c["events"] > 0
    assert c["lost_unwritten"] > 0
    made = read_report(report)["flood"]["calls"] + len(expect.expected_calls(read_report(report),
                                                                              {"setup", "before_go", "run"}))
    assert c["events"] + c["lost_unwritten"] + c["lost_writer_behind"] + c["lost_events"] == made
    lines = r.stderr.splitlines()
    at = lines.index(f"LOST: {c['lost_unwritten']:,} events: they could not be written: the disk was full")
    assert lines[at + 1] == "  free space or choose another -o"
    assert lines[-1] == (
        f"pasta-trace: error: writing {out} failed (No space left on device): {c['events']:,} events were written, "
        f"{c['lost_unwritten']:,} were not (counted in manifest.json)")
    assert [n for n in os.listdir(out) if n.startswith(".")] == []  # no temporaries
