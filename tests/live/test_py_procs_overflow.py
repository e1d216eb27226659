"""More Python processes than the table of interpreters (bpf/pystack.h's
py_procs) holds: the capture completes, every process runs to its end, their
calls are all recorded, and the ones that found the table full are counted
(counts.stacks.unregistered_python_processes, a line of the summary), never
an error.  An exited process's entry is deleted, so later processes get
stacks again.  The table is made small for the test
(program.PY_PROCS_MAX_ENV); the rule is the same at its real size, 4,096."""

from __future__ import annotations

import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace.probes.program import PY_PROCS_MAX_ENV
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

TABLE = 2
FIRST_WAVE = 4  # at once: TABLE of them get stacks, the others are counted
SECOND_WAVE = 2  # after the first wave exited: the table has room again
CALLS = 5

WORKER = """\
import ctypes, os, sys, time
lib = ctypes.CDLL(sys.argv[1])
report, go = sys.argv[2], sys.argv[3]
open(report + ".ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.01)
for _ in range({calls}):
    lib.cuCtxSynchronize()
open(report, "w").write(str(os.getpid()))
"""


def _wave(py: str, worker: Path, lib: Path, d: Path, name: str, n: int) -> str:
    """Shell: start n workers, let them call once all have loaded the library, wait for them."""
    reports = [d / f"{name}{i}" for i in range(n)]
    start = " ".join(f"{py} {worker} {lib} {r} {d / name}.go &" for r in reports)
    ready = " || ".join(f"[ ! -e {r}.ready ]" for r in reports)
    return f"{start} while {ready}; do sleep 0.01; done; touch {d / name}.go; wait"


def test_more_python_processes_than_the_table_holds_are_counted_and_all_run(tmp_path, cuda_stub):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER.format(calls=CALLS))
    py = sys.executable
    script = "; ".join([_wave(py, worker, cuda_stub, tmp_path, "a", FIRST_WAVE),
                        _wave(py, worker, cuda_stub, tmp_path, "b", SECOND_WAVE)])
    out = tmp_path / "cap"
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300, env={PY_PROCS_MAX_ENV: str(TABLE)})
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    first = [int((tmp_path / f"a{i}").read_text()) for i in range(FIRST_WAVE)]  # each ran to its end
    second = [int((tmp_path / f"b{i}").read_text()) for i in range(SECOND_WAVE)]
    cap = open_capture(out)
    assert cap.complete, cap.problems
    counts = cap.manifest["counts"]
    assert counts["stacks"]["unregistered_python_processes"] == FIRST_WAVE - TABLE
    assert cap.losses["unregistered_python_processes"] == FIRST_WAVE - TABLE
    status = cap.manifest["stacks"]["processes"]
    with_stacks = [pid for pid in first if status[str(pid)]["stacks"]]
    assert len(with_stacks) == TABLE
    for pid in set(first) - set(with_stacks):
        assert status[str(pid)]["reason"] == f"more than {TABLE} Python processes at once"
    assert all(status[str(pid)]["stacks"] for pid in second)  # the first wave's entries went at its exit
    events = cap.events.collect().filter(pl.col("api").cast(pl.String) == "cuCtxSynchronize")
    per_pid = dict(events.group_by("pid").len().iter_rows())
    assert per_pid == {pid: CALLS for pid in first + second}
    with_stack = events.filter(pl.col("stack_id") != 0)["pid"].unique().sort().to_list()
    assert with_stack == sorted(with_stacks + second)
    assert (f"LOST: {FIRST_WAVE - TABLE} Python processes without stacks: more Python processes ran at once "
            "than the table of interpreters holds") in r.stderr
