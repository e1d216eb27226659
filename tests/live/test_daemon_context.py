"""What a dump holds besides the events, on one daemon shared by the tests:
the Python call site of each event (stacks.parquet, exactly the stacks the
program itself saw), a stack forgotten once its events left the window and
sent again by BPF when the program comes back to it, and the kernel names
found at dump time: an nvcc-built runtime program's, from its files while it
runs and from the maps saved of it once it has exited, and those of driver
handles looked up before the daemon started, from the driver's objects."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

import cudart_expect as ce
from conftest import _built
from pasta_run import Tracer, read_report, run_pasta, wait_for_file
from pasta_trace import merge
from pasta_trace.daemon.stacks import GRACE_S
from pasta_trace.daemon.service import WINDOW_SLACK_S
from pasta_trace.daemon.window import SEGMENT_S
from pasta_trace.read import open_capture
from test_attach_names_live import KERNELS, LAUNCHES
from test_python_stacks import captured_stacks, expected_stacks, workload

pytestmark = [pytest.mark.live]

#: the daemon's window: long enough for a dump asked for right after a program's calls, short for a stack to leave
WINDOW_S = 4.0


class Daemon:
    def __init__(self, tracer: Tracer, sock: Path):
        self.tracer = tracer
        self.sock = sock

    def dump(self, pid: int) -> Path:
        """A dump of ``pid``'s window, asked on the socket (docs/daemon.md) with no `pasta-trace dump` to start."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(120)
            s.connect(str(self.sock))
            s.sendall((json.dumps({"dump": True, "pid": pid}) + "\n").encode())
            answer = b""
            while not answer.endswith(b"\n") and (chunk := s.recv(4096)):
                answer += chunk
        reply = json.loads(answer)
        assert "dir" in reply, (reply, self.tracer.stderr())
        return Path(reply["dir"])


@pytest.fixture(scope="module")
def looked_up(_bpf_status, build_dir, tmp_path_factory):
    """attach_names_workload on stub layout 1 (tests/live/test_attach_names_live.py), started before the
    daemon: it looks its five handles up, then waits for SIGUSR1 to launch them."""
    if _bpf_status:
        pytest.skip(_bpf_status)
    ready = tmp_path_factory.mktemp("looked_up") / "ready"
    proc = subprocess.Popen([str(_built("attach_names_workload", build_dir)),
                             str(_built("cuda_stub_layout1", build_dir)), str(ready), "600"])
    try:
        wait_for_file(ready, proc=proc)
        yield proc, ready
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def daemon(looked_up, tmp_path_factory):
    where = tmp_path_factory.mktemp("daemon")
    with tempfile.TemporaryDirectory(prefix="pasta-daemon-", dir="/tmp") as d:
        sock = Path(d) / "daemon.sock"
        # --metrics off: the default port may be another test's daemon's
        t = Tracer(["daemon", "-o", str(where / "dumps"), "--socket", str(sock), "--window", str(WINDOW_S),
                    "--keep", "20", "--after", "0", "--metrics", "off"], where / "daemon.log")
        try:
            t.wait_ready(timeout=180)  # the first start of a configuration compiles the BPF program
            yield Daemon(t, sock)
            assert t.stop() == 0, t.stderr()
        finally:
            t.kill()


def test_a_dump_has_the_python_call_site_of_each_event(daemon, cuda_stub, tmp_path):
    report = tmp_path / "w.json"
    # it settles before its first call (registered at its exec) and lingers after its report (alive at the dump)
    proc = subprocess.Popen(workload(sys.executable, report, cuda_stub, "--settle", "0.5", "--linger", "60"))
    try:
        wait_for_file(report, 120, proc)
        d = daemon.dump(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    want = read_report(report)
    cap = open_capture(d)
    assert cap.complete, cap.problems
    assert cap.manifest["stacks"]["processes"] == {
        str(proc.pid): {"python": want["python"], "interpreter": cap.manifest["stacks"]["processes"][str(proc.pid)][
            "interpreter"], "stacks": True}}
    assert cap.manifest["counts"]["stacks"]["lost_stacks"] == cap.manifest["counts"]["stacks"]["unreadable_stacks"] == 0
    assert captured_stacks(cap, proc.pid, {c["api"] for c in want["calls"]}) == expected_stacks(want)
    # every stack an event names is there, and no other
    events = cap.events.filter(pl.col("stack_id").is_not_null()).select("pid", "stack_id").unique().collect()
    assert sorted(events.rows()) == sorted(cap.stacks.select("pid", "stack_id").unique().collect().rows())
    assert cap.manifest["counts"]["stacks"]["stacks"] == events.height
    r = run_pasta(["report", str(d)])
    assert r.returncode == 0, r.stderr
    # its call sites, as for a capture: each allocation at alloc()'s line
    allocs = [c["stack"][0] for c in want["calls"] if c["api"] == "cuMemAlloc_v2"]
    (file, function, line), = set(map(tuple, allocs))
    assert "Call sites (the Python line of each call)" in r.stdout
    assert re.search(rf"^ *{proc.pid} +\S*{re.escape(Path(file).name[-10:])}:{line} {function} +{len(allocs)} +0 +0 ", r.stdout,
                     re.M), r.stdout


SITES = """\
import ctypes, sys, time
from pathlib import Path

lib, d = ctypes.CDLL(sys.argv[1]), Path(sys.argv[2])


def site_a():
    lib.cuCtxSynchronize()


def site_b():
    lib.cuCtxSynchronize()


time.sleep(0.5)  # registered as Python at its exec before its first call
n = 0
while True:
    if n == 0 or (d / "again").exists():  # site_a's stack, the same each time
        (d / "again").unlink(missing_ok=True)
        site_a()
        (d / ("again.done" if n else "started")).write_text("")
    site_b()
    n += 1
    time.sleep(0.02)
"""


def _sites(cap, pid: int) -> dict[str, int]:
    """Events of ``pid`` by the function of their stack's innermost frame (None: no stack)."""
    inner = cap.stacks.filter(pl.col("depth") == 0).select("pid", "stack_id", "function")
    ev = cap.events.filter(pl.col("pid") == pid).join(inner, on=["pid", "stack_id"], how="left").collect()
    return dict(ev.group_by("function").len().rows())


def _stack_of(cap, function: str) -> pl.DataFrame:
    """The whole stack whose innermost frame is ``function``'s."""
    sid = cap.stacks.filter((pl.col("depth") == 0) & (pl.col("function") == function)).select("stack_id")
    return cap.stacks.join(sid, on="stack_id").sort("depth").collect()


def test_a_stack_left_with_its_events_is_sent_again_when_the_program_comes_back(daemon, cuda_stub, tmp_path):
    script = tmp_path / "sites.py"
    script.write_text(SITES)
    proc = subprocess.Popen([sys.executable, str(script), str(cuda_stub), str(tmp_path)])
    try:
        wait_for_file(tmp_path / "started", 60, proc)
        first = open_capture(daemon.dump(proc.pid))
        assert _sites(first, proc.pid).get("site_a") == 1
        a = _stack_of(first, "site_a")
        a_ns = first.events.join(a.lazy().select("stack_id").unique(), on="stack_id").select("ts_ns").collect().item()
        # the daemon holds its window, its triggers' --after (0 here) and WINDOW_SLACK_S (daemon.service); the
        # event leaves with its segment (SEGMENT_S), and its stack GRACE_S after: forgotten by the daemon, and out
        # of BPF's table of the stacks sent
        time.sleep(max(a_ns / 1e9 + WINDOW_S + WINDOW_SLACK_S + SEGMENT_S + GRACE_S + 0.5 - time.monotonic(), 0))
        cap = open_capture(daemon.dump(proc.pid))
        assert set(_sites(cap, proc.pid)) == {"site_b"}
        assert cap.stacks.filter(pl.col("function") == "site_a").collect().height == 0
        (tmp_path / "again").touch()
        wait_for_file(tmp_path / "again.done", 30, proc)
        again = open_capture(daemon.dump(proc.pid))
    finally:
        proc.kill()
        proc.wait()
    # the stack was sent again with site_a's next call: its event has it, frame for frame
    sites = _sites(again, proc.pid)
    assert sites["site_a"] == 1 and None not in sites, sites
    assert _stack_of(again, "site_a").equals(a) and a.height == 2  # site_a, <module>
    assert again.manifest["counts"]["stacks"]["lost_stacks"] == 0


@pytest.fixture
def stub_env(cudart_stub, cuda_stub) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": f"{cudart_stub.parent}:{cuda_stub.parent}"}


def _launches(d: Path, pid: int, since_ns: int = 0) -> list[tuple]:
    """(name, grid, block) of each counted launch of ``pid`` in dump ``d`` from ``since_ns`` on."""
    k = merge.kernel_executions(open_capture(d)).filter((pl.col("pid") == pid) & (pl.col("ts_ns") >= since_ns))
    return sorted(k.select("name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z").collect().rows())


def test_a_dump_names_the_kernels_of_a_runtime_program(daemon, cudart_launcher, stub_env, tmp_path):
    """Named at dump time as a capture's end names them: while the program waits, from its files; once it
    has exited, from the maps saved of it."""
    launcher = cudart_launcher("shared")
    report, go = tmp_path / "report.json", tmp_path / "go"
    proc = subprocess.Popen([str(launcher), "--report", str(report), "--rounds", "2", "--go-file", str(go)],
                            env={**os.environ, **stub_env})
    try:
        wait_for_file(report.with_name(report.name + ".ready"), timeout=60, proc=proc)
        alive = daemon.dump(proc.pid)
        go.touch()
        assert proc.wait(timeout=60) == 0
        gone = daemon.dump(proc.pid)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    want = ce.read(report)
    assert _launches(alive, proc.pid) == ce.reported_launches(want, {"before_go"})
    # the run's launches, made after the first dump
    since = json.loads((alive / "manifest.json").read_text())["clock"]["end_ns"]
    assert _launches(gone, proc.pid, since) == ce.reported_launches(want, {"run"})
    for d in (alive, gone):
        names = open_capture(d).names.filter(pl.col("pid") == proc.pid).collect()
        assert not names.filter(pl.col("name").str.starts_with("unknown@")).height, names
    # the driver launch inside each runtime launch is named after it (the first round of each thread pairs
    # them all; later ones are folded, so a dump without it has fewer)
    names = open_capture(alive).names.filter(pl.col("pid") == proc.pid).collect()
    assert sorted(names.filter(pl.col("source") == "runtime_launch")["name"].unique().to_list()) == \
        sorted(("_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "plain_c_kernel", "_ZN2ns5innerEPd"))


def test_a_dump_names_driver_handles_looked_up_before_the_daemon(daemon, looked_up):
    """As a capture attached with -p names them (test_attach_names_live.py): from the driver's objects."""
    proc, ready = looked_up
    os.kill(proc.pid, signal.SIGUSR1)
    wait_for_file(ready.with_name(ready.name + ".launched"), proc=proc)
    cap = open_capture(daemon.dump(proc.pid))
    launches = merge.kernel_executions(cap).filter(pl.col("pid") == proc.pid).select("func", "name").collect()
    handles = launches["func"].unique(maintain_order=True).to_list()  # in launch order: the workload's order
    assert len(handles) == 5 and launches.height == 15
    names = cap.names.filter(pl.col("pid") == proc.pid).collect()
    got = {h: (name, str(src), reason) for h, name, src, reason in names.select("handle", "name", "source",
                                                                              "reason").iter_rows()}
    want = {h: (k, "driver_object", None) for h, k in zip(handles[:4], KERNELS)}
    want[handles[4]] = ("plain_c_kernel", "module_get_function", None)
    assert got == want
    assert dict(launches.group_by("name").len().iter_rows()) == LAUNCHES
    assert cap.manifest["attach_names"][str(proc.pid)] == {
        "handles_read": 5, "named": 4, "path": [0x58], "reason": None, "unnamed_handles": 4}
