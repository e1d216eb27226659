"""An event of a Python process without a stack is always counted: a forked
child calls at once, before the tracer has registered it as Python (its fork
notification is handled a poll later), and those events are counted in
counts.stacks.unregistered_python, so that with stacks on, events with a
stack_id + the stack counters = the events."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

PYTHON = Path("/usr/bin/python3")
CALLS = 50
CHILDREN = 20
SCRIPT = f"""
import ctypes, json, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
p = ctypes.c_uint64()
def calls():
    for _ in range({CALLS}):
        lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(4096))
calls()
children = []
for _ in range({CHILDREN}):
    pid = os.fork()
    if pid == 0:
        calls()
        os._exit(0)
    os.waitpid(pid, 0)
    children.append(pid)
with open(sys.argv[2], "w") as f:
    json.dump({{"parent": os.getpid(), "children": children}}, f)
time.sleep(0.5)  # our code objects are read while we are alive
"""


def test_events_of_python_processes_before_registration_are_counted(tmp_path, cuda_stub):
    if not PYTHON.exists():
        pytest.skip(f"no {PYTHON}")
    script = tmp_path / "forks.py"
    script.write_text(SCRIPT)
    pids = tmp_path / "pids.json"
    out = tmp_path / "cap"
    r = run_pasta(["-o", str(out), "--", str(PYTHON), str(script), str(cuda_stub), str(pids)], timeout=300)
    assert r.returncode == 0, r.stderr
    who = json.loads(pids.read_text())
    cap = open_capture(out)
    counts = cap.manifest["counts"]["stacks"]
    events = cap.events.select("pid", "stack_id").collect()
    assert events.height == CALLS * (1 + CHILDREN) == cap.manifest["counts"]["events"]
    assert sorted(events["pid"].unique().to_list()) == sorted([who["parent"], *who["children"]])
    # the parent was registered when it opened the library, before its first call
    assert events.filter((pl.col("pid") == who["parent"]) & pl.col("stack_id").is_null()).height == 0
    without = events["stack_id"].is_null().sum()
    assert (counts["lost_stacks"], counts["unreadable_stacks"], counts["no_python_thread"]) == (0, 0, 0)
    assert without == counts["unregistered_python"], counts
    print(f"{without} of {CALLS * CHILDREN} events of forked children came before their registration")
