"""Real uprobes, real CLI: `-p` on processes that looked their kernels up
before the attach.  Each runs on a stub libcuda whose handles are objects
holding the kernel's name (tests/fixtures/cuda_stub_objects.h): at +0x58
(layout 1), behind one pointer (layout 2), or at an offset that differs per
object (layout 3, where nothing may be named).  One tracer follows all three
(the BPF compile costs seconds).  Layout 1's process exits on its own 3 s
after its launches (named by the scan while it runs); the tracer is stopped
while the others still run (named at the end, before the probes go)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import signal
import subprocess
import time
from pathlib import Path

import polars as pl
import pytest

from conftest import _built
from pasta_run import wait_for_file
from pasta_trace.capture.naming import name_scan
from pasta_trace.capture.naming.attach_names import NOT_LOOKED_UP
from pasta_trace.merge.kernels import kernel_executions
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

#: the handles in the workload's order, their kernel and how many launches each gets
KERNELS = ["_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "_ZN2ns5innerEPd", "_ZN2ns5innerEPd", "plain_c_kernel"]
LAUNCHES = {"_Z6vecAddPKfS0_Pfi": 1, "_Z5scaleIfEvPT_S0_i": 2, "_ZN2ns5innerEPd": 3 + 4, "plain_c_kernel": 5}
LINGER_S = {1: 3, 2: 120, 3: 120}


def test_names_of_handles_looked_up_before_attach(build_dir, tmp_path, tracer):
    workload = _built("attach_names_workload", build_dir)
    stubs = {n: _built(f"cuda_stub_layout{n}", build_dir) for n in (1, 2, 3)}
    procs, pids = {}, {}
    try:
        for n, stub in stubs.items():
            ready = tmp_path / f"layout{n}.ready"
            procs[n] = subprocess.Popen([str(workload), str(stub), str(ready), str(LINGER_S[n])])
            pids[n] = int(wait_for_file(ready, proc=procs[n]))
        out = tmp_path / "cap"
        t = tracer(["-p", ",".join(str(p) for p in pids.values()), "-o", str(out)])
        t.wait_ready()
        for n, pid in pids.items():
            os.kill(pid, signal.SIGUSR1)
            wait_for_file(tmp_path / f"layout{n}.ready.launched", proc=procs[n])
        assert procs[1].wait(timeout=60) == 0
        time.sleep(0.5)  # layout 1 has gone: its names come from the scan made while it ran
        assert t.stop() == 0, t.stderr()
    finally:
        for p in procs.values():
            p.kill()

    assert "4 kernel handles have no name: looked up before the attach; the driver" in t.stderr()
    cap = open_capture(out)
    assert cap.complete, cap.problems
    names = cap.names.collect()
    launches = kernel_executions(cap).select("pid", "func", "name").collect()
    for n, pid in pids.items():
        mine = launches.filter(pl.col("pid") == pid)
        handles = mine["func"].unique(maintain_order=True).to_list()  # in launch order: the workload's order
        assert len(handles) == 5 and mine.height == 15
        rows = names.filter(pl.col("pid") == pid).sort("handle")
        got = {h: (name, str(src), reason) for h, name, src, reason in rows.select("handle", "name", "source",
                                                                                 "reason").iter_rows()}
        if n == 3:
            why = f"{NOT_LOOKED_UP}; {name_scan.DISAGREE}"
            want = {h: (f"unknown@{h:#x}", "unknown", why) for h in handles[:4]}
            want[handles[4]] = ("plain_c_kernel", "module_get_function", None)
            assert got == want
            assert dict(mine.group_by("name").len().iter_rows()) == {
                **{f"unknown@{h:#x}": k + 1 for k, h in enumerate(handles[:4])}, "plain_c_kernel": 5}
            assert cap.manifest["attach_names"][str(pid)] == {
                "handles_read": 5, "named": 0, "path": None, "reason": name_scan.DISAGREE, "unnamed_handles": 4}
            continue
        want = {h: (k, "driver_object", None) for h, k in zip(handles[:4], KERNELS)}
        want[handles[4]] = ("plain_c_kernel", "module_get_function", None)
        assert got == want
        assert dict(mine.group_by("name").len().iter_rows()) == LAUNCHES
        assert cap.manifest["attach_names"][str(pid)] == {
            "handles_read": 5, "named": 4, "path": [0x58] if n == 1 else [0x30, 0x10], "reason": None,
            "unnamed_handles": 4}


def test_gpu_check_step_runs_on_the_stand_in(build_dir, tmp_path, monkeypatch):
    """scripts/gpu_check's "kernel names on attach" step, end to end on stub
    layout 1 (whose cuFuncGetName/cuKernelGetName answer the names its
    objects hold) with an nvcc that hands over the prebuilt fatbin: every row
    passes, so on a GPU a FAIL can only be the real driver's answer."""
    stub = _built("cuda_stub_layout1", build_dir)
    _built("attach_names_workload", build_dir)  # builds kernels.fatbin beside it
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvcc").write_text(f'#!/bin/sh\nwhile [ $# -gt 1 ]; do [ "$1" = -o ] && cp {build_dir}/kernels.fatbin "$2"; '
                               'shift; done\n')
    (fake / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(stub.parent))
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(Path(__file__).parents[2] / "scripts/gpu_check"))
    gc = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    loader.exec_module(gc)
    tab = gc.Table()
    (tmp_path / "work").mkdir()  # gpu_check's main makes it
    gc.attach_names_probes(tab, "550.163.01", gc.python_for_pasta(), tmp_path / "work")
    assert [r for r in tab.rows if r[3] != "PASS"] == [
        (f"[attach {mode}] name offset", "-", "0x58", "info") for mode in gc.ATTACH_MODES]
    assert len(tab.rows) == 2 + 3 * 5
