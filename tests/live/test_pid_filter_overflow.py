"""A launched command's children that the table of traced processes
(pid_filter) cannot hold are counted (untraced_children, a line of the
summary), never silently untraced; those it holds are traced call for call.
The table is made small for the test (program.PID_FILTER_MAX_ENV); the rule is
the same at its real size, 4,096."""

from __future__ import annotations

import sys

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace.probes.program import PID_FILTER_MAX_ENV
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

TABLE = 4  # the launched process and 3 of its children
CHILDREN = 6
CALLS = 5

#: forks CHILDREN that all exist at once (each waits on a pipe the parent closes
#: once it has forked them all), then each loads the library and calls it
DRIVER = """\
import ctypes, os, sys
lib_path, n, calls, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r, w = os.pipe()
kids = []
for _ in range(n):
    pid = os.fork()
    if pid == 0:
        os.close(w)
        os.read(r, 1)
        lib = ctypes.CDLL(lib_path)
        for _ in range(calls):
            lib.cuCtxSynchronize()
        os._exit(0)
    kids.append(pid)
os.close(r)
os.close(w)
codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in kids]
open(out, "w").write(" ".join(map(str, kids)))
sys.exit(max(codes))
"""


def test_children_beyond_the_table_are_counted_and_the_others_traced(tmp_path, cuda_stub):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    kids_file = tmp_path / "kids"
    out = tmp_path / "cap"
    r = run_pasta(["-o", str(out), "--", sys.executable, str(driver), str(cuda_stub), str(CHILDREN), str(CALLS),
                   str(kids_file)], timeout=300, env={PID_FILTER_MAX_ENV: str(TABLE)})
    assert r.returncode == 0, r.stderr  # every child ran to its end: none was left stopped
    kids = [int(p) for p in kids_file.read_text().split()]
    cap = open_capture(out)
    assert cap.complete, cap.problems
    untraced = CHILDREN - (TABLE - 1)
    assert cap.manifest["counts"]["untraced_children"] == untraced
    assert cap.losses == {"untraced_children": untraced}
    per_pid = dict(cap.events.collect().filter(pl.col("api").cast(pl.String) == "cuCtxSynchronize")
                   .group_by("pid").len().iter_rows())
    assert set(per_pid) <= set(kids)
    assert sorted(per_pid.values()) == [CALLS] * (TABLE - 1)  # those it held: every call
    assert (f"LOST: {untraced} untraced child processes: the table of traced processes was full when they "
            "started") in r.stderr
