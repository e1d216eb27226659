"""Tracers never stop each other or themselves: two `-a` captures at once, and
a process started after both that loads a library copy neither had seen.
Both stop it at its open; the last one to finish attaching resumes it, so
both captures hold every one of its calls."""

from __future__ import annotations

import os
import subprocess

import pytest

import expect
from pasta_run import copy_library, read_report
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.machine_wide, pytest.mark.usefixtures("require_bpf")]

PHASES = {"setup", "before_go", "run"}


def test_two_system_wide_tracers_and_a_late_loader_all_finish_with_exact_counts(families, tmp_path, tracer):
    cuda = next(f for f in families if f.name == "cuda")
    lib = copy_library(cuda.stub, tmp_path / "bundle", cuda.soname)
    tracers = [tracer(["-a", "-o", str(tmp_path / f"cap{i}"), "--buffer-pages", "16384"], name=f"t{i}")
               for i in range(2)]
    for t in tracers:
        t.wait_ready(timeout=300)
    report = tmp_path / "late.json"
    cmd = [str(cuda.workload), "--lib", str(lib), "--report", str(report), "--threads", "2", "--iters", "2"]
    assert subprocess.run(cmd, timeout=120).returncode == 0
    for t in tracers:
        assert t.stop() == 0, t.stderr()
    rep = read_report(report)
    for i in range(2):
        cap = open_capture(tmp_path / f"cap{i}")
        assert cap.complete, cap.problems
        assert expect.mismatches(cap, [rep], PHASES) == []


def test_a_launched_command_is_no_system_wide_tracers_own(tmp_path, in_process):
    """Under -a a child of a tracer is one of that tracer's own from its
    first instruction, and a system-wide tracer counts the other tracers'
    processes as its own: so the command another tracer launches (its child)
    became the system-wide tracer's own, never traced by it.  The launching
    tracer takes it out of every other tracer's `pt_own` before it lets it
    run (LateLoadWatcher.disown_elsewhere)."""
    import time

    from pasta_trace.capture.procs.late_load import LateLoadWatcher
    from pasta_trace.probes import program

    system = in_process.bpf(program.build(program.Spec(probes=False, filter_pids=False)))
    others = system["pt_own"]
    others[others.Key(os.getpid())] = others.Leaf(1)  # this process stands for a launching tracer
    command = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while others.get(others.Key(command.pid)) is None:  # made its own at its first return to user space
            assert time.monotonic() < deadline, "the system-wide program never took the child for its own"
            time.sleep(0.01)
        launcher = in_process.bpf(program.build(program.Spec(probes=False, filter_pids=True)))
        watcher = in_process.closing(LateLoadWatcher(launcher, on_library=lambda lib: True, on_fork=lambda *a: None,
                                                     on_exec=lambda *a: None, on_exit=lambda *a: None))
        watcher.disown_elsewhere(command.pid)
        assert others.get(others.Key(command.pid)) is None
        assert others.get(others.Key(os.getpid())) is not None  # the launcher itself stays exempt
    finally:
        command.kill()
        command.wait()
