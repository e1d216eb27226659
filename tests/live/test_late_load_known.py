"""A full known_files table degrades gracefully: the failure is counted and
said once, every open of a file it could not remember is paused and resumed
again, and the opener completes (the table's size is lowered here)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest


pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

KNOWN_MAX = 2
FILES = 6


def test_full_known_table_is_counted_said_and_never_leaves_a_process_stopped(tmp_path, in_process):

    from pasta_trace.capture.procs.late_load import LateLoadWatcher
    from pasta_trace.probes import program

    libs = []
    for i in range(FILES):  # distinct inodes: one table entry each
        lib = tmp_path / f"v{i}" / "libcuda.so.1"
        lib.parent.mkdir()
        shutil.copy("/bin/true", lib)
        libs.append(str(lib))
    b = in_process.bpf(program.build(program.Spec(probes=False, filter_pids=True, known_max=KNOWN_MAX)))
    warnings: list[str] = []
    opened: list[str] = []
    w = in_process.closing(LateLoadWatcher(
        b, on_library=lambda lib: opened.append(lib.ns_path) or True, on_fork=lambda *a: None,
        on_exec=lambda *a: None, on_exit=lambda *a: None, on_warning=warnings.append))
    go = tmp_path / "go"
    script = ("import os, sys, time\n"
              f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
              f"for _ in range(2):\n    for p in {libs!r}:\n        open(p, 'rb').close()\n")
    child = subprocess.Popen([sys.executable, "-c", script])
    pf = b["pid_filter"]
    pf[pf.Key(child.pid)] = pf.Leaf(1)
    go.touch()
    deadline = time.monotonic() + 60
    while child.poll() is None and time.monotonic() < deadline:
        w.poll()
        time.sleep(0.005)
    w.poll()
    assert child.returncode == 0
    # first round: every open paused; second round: only the files the table could not hold
    assert opened == libs + libs[KNOWN_MAX:]
    assert w.stops == FILES + FILES - KNOWN_MAX
    assert w.known_full == FILES - KNOWN_MAX
    assert warnings == [f"more than {KNOWN_MAX} library files have probes: each later open of another one "
                        "pauses its process for a moment"]
