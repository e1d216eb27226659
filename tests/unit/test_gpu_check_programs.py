"""scripts/gpu_check's capture readers (tests/gpu/programs/*.py), run as the script runs them (a file, the
repository on PYTHONPATH) on one seeded synthetic capture: each prints one JSON line, and what they count
agrees with the capture and with each other.  Their GPU workloads run only on a GPU (scripts/gpu_check)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_trace.read import open_capture
from pasta_trace.testing import synthetic
from test_gpu_check import gpu_check_module

ROOT = Path(__file__).resolve().parents[2]
SPEC = synthetic.Spec(pids=2, launches=40, allocations=8, accesses=300, collectives=5, seed=3)


@pytest.fixture(scope="module")
def gc():
    return gpu_check_module()


@pytest.fixture(scope="module")
def cap(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("programs") / "cap"
    synthetic.write_capture(path, SPEC)
    return path


def program(gc, name: str, *args) -> dict:
    r = subprocess.run([sys.executable, gc.program(name), *map(str, args)], capture_output=True, text=True,
                       cwd=ROOT, env=gc._pyenv(), timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_every_program_the_script_names_is_a_file_here(gc) -> None:
    source = Path(gc.__file__).read_text()
    files = {p.name for p in [*gc.PROGRAMS.glob("*.py"), *gc.PROGRAMS.glob("*.cu")]}
    named = set(re.findall(r'program\("([\w.]+)"\)', source))
    assert len(named) == 17 and named <= files
    # the one file no step names is what two of them import
    assert files - named == {"cuda_context.py"}


def test_the_host_and_merge_readers_count_the_capture_s_launches(gc, cap: Path) -> None:
    launches = open_capture(cap).events.filter(pl.col("kind") == "launch").collect().height
    host = program(gc, "count_host.py", cap, 1024)
    stats = program(gc, "merge_stats.py", cap)
    assert launches > 0
    assert host["launches"] == stats["host_launches"] == stats["device_executions"] == stats["matched_exact"] == launches
    assert host["allocs"] == 0  # no allocation of 4 x 1024 B in it
    # no graph in it: every count of the graph readers is zero
    assert program(gc, "count_graph.py", cap, gc.GRAPHK) == {"captured": 0, "graph_launches": 0, "via_graph": 0,
                                                            "direct": 0}
    assert program(gc, "count_graph_device.py", cap, gc.VECADD) == {
        "device_graph_kernels": 0, "correlation_ids": 0, "joined": 0, "direct": 0, "device_counts": [],
        "host_counts": []}


def test_the_nccl_names_and_attach_readers_give_the_capture_s_rows(gc, cap: Path) -> None:
    c = open_capture(cap)
    got = program(gc, "read_nccl.py", cap)
    calls = c.events.filter(pl.col("api").cast(pl.String) == "ncclAllReduce").sort("ts_ns").collect()
    assert [x["seq"] for x in got["calls"]] == calls["seq"].to_list() and calls.height > SPEC.collectives
    assert [(x["rank"], x["nranks"]) for x in got["comms"]] == [(0, 2), (1, 2)]
    names = program(gc, "read_attach_names.py", cap)
    assert len(names["names"]) == c.names.collect().height and names["attach_names"] == {}
    pid = int(c.events.select("pid").collect()["pid"][0])
    att = program(gc, "read_attach_capture.py", cap, pid)
    want = c.events.filter((pl.col("pid") == pid) & (pl.col("kind") == "launch")).collect()["ts_ns"].to_list()
    assert att["launch_ts"] == want and len(want) > 0
    assert (att["start_ns"], att["end_ns"]) == (c.manifest["clock"]["start_ns"], c.manifest["clock"]["end_ns"])
