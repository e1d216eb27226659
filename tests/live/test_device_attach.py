"""`--device cupti -p PID`: the CUPTI collector loaded into running programs
through ptrace (pasta_trace/device/attach/), here without a GPU: real
libcupti, the stub libcuda.so.1.  Each workload checks its own results; every
test also checks that nothing is left stopped or traced, that no EINTR
reached the program, and (where the tracer lived) that errno and the signal
mask are what they were."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from cli_run import ROOT, cli, one_error_line  # tests/fixtures/cli_run.py
from pasta_run import Tracer  # tests/fixtures/pasta_run.py
from pasta_trace.device.attach import target as tg
from pasta_trace.device.attach.collector import (NO_CUPTI, NOT_STARTED, START, STOP, call_collector,
                                                 collector_library, preflight)
from pasta_trace.device.attach.ptrace import Tracee
from pasta_trace.device.attach.remote import HeldThread
from pasta_trace.errors import PastaError, PermissionsError, UsageError
from pasta_trace.probes.elf import exported_symbols
from pasta_trace.read import open_capture

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="ptrace of another process needs root here")
FIXTURES = ROOT / "tests" / "fixtures" / "attach"


@pytest.fixture(scope="session")
def lib() -> Path:
    try:
        path = collector_library()
    except PastaError as e:
        pytest.skip(str(e))
    if "gp_cupti_attach_start" not in exported_symbols(str(path)):
        pytest.skip("libgpu_probes_cupti.so predates the attach entry points: run scripts/build_gpu_probes.sh")
    return path


def _gcc(build_dir: Path, name: str) -> Path:
    """tests/fixtures/attach/NAME.c built into build_dir/attach/NAME (renamed into place: concurrent sessions)."""
    out = build_dir / "attach" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    subprocess.run(["gcc", "-O2", "-Wall", "-pthread", str(FIXTURES / f"{name}.c"), "-o", str(tmp), "-ldl"],
                   check=True)
    tmp.replace(out)
    return out


@pytest.fixture(scope="session")
def workload(build_dir: Path) -> Path:
    return _gcc(build_dir, "attach_workload")


class Running:
    """A workload that said "ready"."""

    def __init__(self, argv: list[str], cuda_stub: Path) -> None:
        env = {**os.environ, "LD_LIBRARY_PATH": str(cuda_stub.parent)}
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def finish(self, text: str | None = None, sig: int | None = None) -> str:
        if sig is not None:
            self.proc.send_signal(sig)
        out, _ = self.proc.communicate(text, timeout=60)
        assert self.proc.returncode == 0, out
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def running(cuda_stub):
    made: list[Running] = []

    def start(*argv: str) -> Running:
        made.append(Running([str(a) for a in argv], cuda_stub))
        return made[-1]

    yield start
    for r in made:
        r.kill()


def assert_running_untraced(pid: int) -> None:
    """No thread of pid is stopped or traced (a moment allowed for a dead tracer's detach)."""
    deadline = time.monotonic() + 10
    while True:
        states = {}
        for tid in os.listdir(f"/proc/{pid}/task"):
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            states[tid] = (re.search(r"^State:\s+(\S)", status, re.M).group(1),
                           re.search(r"^TracerPid:\s+(\d+)", status, re.M).group(1))
        if all(s not in ("t", "T") and tracer == "0" for s, tracer in states.values()):
            return
        assert time.monotonic() < deadline, states
        time.sleep(0.05)


def maps_collector(pid: int, lib: Path) -> bool:
    return str(lib) in Path(f"/proc/{pid}/maps").read_text()


def start_and_stop(pid: int, lib: Path, tmp_path: Path) -> None:
    """Start: the collector ran in the process (its own CUPTI's answer: no GPU here) and left no file;
    stop: it says it was not recording."""
    out = tmp_path / f"gpu_probes.{pid}.cupti.bin"
    rc, msg = call_collector(pid, lib, START, str(out))
    assert (rc, msg.startswith("CUPTI unavailable: ")) == (NO_CUPTI, True), msg
    assert maps_collector(pid, lib) and not out.exists()
    assert_running_untraced(pid)
    assert call_collector(pid, lib, STOP, None) == (NOT_STARTED, "not recording")
    assert_running_untraced(pid)


def test_a_thread_blocked_in_read_keeps_its_read_errno_and_mask(lib, workload, running, tmp_path):
    w = running(workload, "read")
    mask = tg.sigblk(w.pid, w.pid)
    assert mask == 1 << (signal.SIGUSR2 - 1)
    start_and_stop(w.pid, lib, tmp_path)
    assert tg.sigblk(w.pid, w.pid) == mask
    assert w.finish("hello\n") == "got hello errno 77 usr2 blocked\n"


def test_a_thread_blocked_in_poll_with_a_timeout_sees_no_eintr(lib, workload, running, tmp_path):
    """poll's -ERESTART_RESTARTBLOCK: restart_syscall after our rt_sigreturn would return EINTR;
    the poll is made again instead."""
    w = running(workload, "poll")
    deadline = time.monotonic() + 10
    while tg.thread_syscall(w.pid, w.pid) != 7:  # in poll (it said "ready" just before)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    start_and_stop(w.pid, lib, tmp_path)
    # back in poll: made again after our frame returned (on a loaded machine the thread may not have run
    # the instructions back into it yet when the capture ends); an EINTR would be in what it prints
    deadline = time.monotonic() + 10
    while tg.thread_syscall(w.pid, w.pid) != 7:
        assert time.monotonic() < deadline, "the thread did not go back into poll"
        time.sleep(0.01)
    assert w.finish("hello\n") == "got hello errno 77 usr2 blocked\n"


def test_threads_busy_checking_their_arithmetic(lib, workload, running, tmp_path):
    w = running(workload, "busy", "3")
    start_and_stop(w.pid, lib, tmp_path)
    start_and_stop(w.pid, lib, tmp_path)  # a second capture finds the collector loaded
    assert re.fullmatch(r"ok [1-9][0-9]*\n", w.finish("stop\n"))


def test_every_thread_running(lib, workload, running, tmp_path):
    """No thread blocked anywhere: the call is made on a running one, stopped outside libc."""
    w = running(workload, "spin", "2")
    assert all(tg.thread_syscall(w.pid, int(t)) is None for t in os.listdir(f"/proc/{w.pid}/task"))
    start_and_stop(w.pid, lib, tmp_path)
    assert re.fullmatch(r"ok [1-9][0-9]*\n", w.finish(sig=signal.SIGUSR1))


def test_a_python_program(lib, running, tmp_path):
    w = running(sys.executable, FIXTURES / "attach_py_workload.py")
    start_and_stop(w.pid, lib, tmp_path)
    assert re.fullmatch(r"ok [1-9][0-9]*\n", w.finish(""))


def test_the_frame_alone_restores_the_thread_exactly(workload, running):
    """What a thread whose tracer died gets: rt_sigreturn from our frame gives
    back every register (a restarted read's too) and the whole XSAVE state."""
    w = running(workload, "read")
    libc = preflight(w.pid, None)
    held = HeldThread(w.pid, libc)
    held.stop()
    try:
        assert tg.thread_syscall(w.pid, held.tracee.tid) is not None
        held.call(libc.dlopen, (0, 2), b"/nonexistent/libnothing.so\0", data_args=(0,))
        assert held.frame_restored is True
    finally:
        held.release()
    assert_running_untraced(w.pid)
    assert w.finish("again\n") == "got again errno 77 usr2 blocked\n"


@pytest.mark.parametrize("kill_at", ["seized", "stopped", "frame written", "calling", "in call", "returned"])
def test_sigkill_of_the_tracer_leaves_the_program_running(lib, workload, running, tmp_path, kill_at):
    w = running(workload, "read")
    helper = subprocess.Popen([sys.executable, FIXTURES / "inject_step.py", str(w.pid), kill_at,
                               str(tmp_path / "out.bin")], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        for line in helper.stdout:
            if line == kill_at + "\n":
                break
        else:
            pytest.fail(f"the helper ended before {kill_at!r}")
        helper.kill()
        helper.wait()
    finally:
        helper.kill()
    assert_running_untraced(w.pid)
    out = w.finish("hello\n")
    # killed during the call, the thread finishes it alone: the C library may have changed errno
    errno_kept = kill_at not in ("calling", "in call")
    assert re.fullmatch(r"got hello errno (77|[0-9]+) usr2 blocked\n", out), out
    assert (out == "got hello errno 77 usr2 blocked\n") or not errno_kept, out


def test_refused_without_libcuda_under_aggregate(running, tmp_path):
    """--aggregate drains no events, so no first driver call is seen: the process must have libcuda."""
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert preflight(sleeper.pid, None, late=True).dlopen > 0
        with pytest.raises(UsageError) as e:
            preflight(sleeper.pid, None)
        assert str(e.value) == (
            f"PID {sleeper.pid} has not loaded libcuda yet: --device cupti -p attaches to a process that has "
            "(run pasta-trace after its first CUDA call, or launch it with --device cupti -- CMD)")
        out = tmp_path / "never" / "made"
        r = cli("-p", str(sleeper.pid), "--device", "cupti", "--aggregate", "-o", str(out))
        assert (r.returncode, one_error_line(r)) == (
            2, f"pasta-trace: error: PID {sleeper.pid} has not loaded libcuda yet: with --aggregate, --device cupti "
            "-p needs a process that has (its first driver call is seen in the events, which --aggregate does not "
            "read): leave out --aggregate")
        assert not (tmp_path / "never").exists()  # refused before the output is made
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.fixture(scope="session")
def late_workload(build_dir: Path) -> Path:
    return _gcc(build_dir, "late_cuda_workload")


def wait_for(what: str, cond, tracer: Tracer, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline or tracer.proc.poll() is not None:
            tracer.kill()
            pytest.fail(f"{what}: not within {timeout} s; pasta-trace said:\n{tracer.stderr()}")
        time.sleep(0.02)


def test_injected_at_the_first_driver_call_after_a_late_load(require_bpf, lib, late_workload, running, tmp_path):
    """Attached before the program loads libcuda: its open of libcuda is held for the probes as any
    late load, the collector comes after that dlopen (the program saw no collector when its dlopen
    returned) at the first driver call, CUPTI says "no device" there, and every call is captured."""
    w = running(late_workload, lib)
    out = tmp_path / "cap"
    tracer = Tracer(["-p", str(w.pid), "--device", "cupti", "-o", str(out)], tmp_path / "tracer.log")
    try:
        tracer.wait_ready()
        assert (f"PID {w.pid} has not loaded libcuda yet: its CUPTI collector is loaded at its first driver call"
                in tracer.stderr())
        assert not maps_collector(w.pid, lib)
        w.proc.stdin.write("go\n")
        w.proc.stdin.flush()
        assert w.proc.stdout.readline() == "loaded collector=0\n"
        note = f"no device timeline for PID {w.pid}: CUPTI unavailable: "
        wait_for("the collector's answer", lambda: note in tracer.stderr(), tracer)
        assert maps_collector(w.pid, lib)
        assert_running_untraced(w.pid)
        said = w.finish("stop\n")
        m = re.fullmatch(r"rounds ([1-9][0-9]*) collector=1 ok\n", said)
        assert m, said
        rounds = int(m.group(1))
        assert tracer.finish() == 0, tracer.stderr()
    finally:
        tracer.kill()
    cap = open_capture(out)
    assert cap.complete, cap.problems
    assert cap.losses == {}
    [seen] = [n for n in cap.manifest["notes"] if n.startswith(note)]
    assert seen.endswith("(no GPU, or a driver CUPTI cannot use)"), seen
    calls = Counter(cap.events.filter(pl.col("pid") == w.pid).select(pl.col("api").cast(pl.String))
                    .collect()["api"].to_list())
    assert calls == {"cuInit": 1, "cuDeviceGetCount": rounds, "cuMemAlloc_v2": rounds, "cuMemFree_v2": rounds}
    assert not list(tmp_path.glob(".cap.device-*"))


def test_a_program_that_never_loads_libcuda_gets_a_note(require_bpf, lib, late_workload, running, tmp_path):
    w = running(late_workload, lib, "never")
    out = tmp_path / "cap"
    r = cli("-p", str(w.pid), "--device", "cupti", "-d", "1", "-o", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    note = f"the device collector was never injected: PID {w.pid} never loaded libcuda"
    assert note in json.loads((out / "manifest.json").read_text())["notes"]
    assert f"warning: {note}\n" in r.stderr
    assert not maps_collector(w.pid, lib)
    assert_running_untraced(w.pid)
    assert w.finish("stop\n") == "never\n"


def test_refused_in_a_static_binary(cuda_stub, tmp_path):
    """A static program that maps a libcuda.so.1 itself: no C library to call dlopen in."""
    src = tmp_path / "static.c"
    src.write_text('#include <fcntl.h>\n#include <stdio.h>\n#include <sys/mman.h>\n#include <unistd.h>\n'
                   'int main(int c, char **v) { int fd = open(v[1], O_RDONLY);\n'
                   '  if (mmap(0, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0) == MAP_FAILED) return 1;\n'
                   '  puts("ready"); fflush(stdout); pause(); return 0; }\n')
    subprocess.run(["gcc", "-static", "-O1", str(src), "-o", str(tmp_path / "static")], check=True)
    p = subprocess.Popen([tmp_path / "static", cuda_stub], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "ready\n"
        with pytest.raises(UsageError) as e:
            preflight(p.pid, None)
        assert str(e.value) == ("--device cupti -p: the process has no shared C library mapped (a static binary?): "
                                "nothing in it can load a library")
    finally:
        p.kill()
        p.wait()


def test_refused_next_to_another_tracer(workload, running):
    w = running(workload, "read")
    other = Tracee(w.pid, w.pid)
    other.seize()
    try:
        with pytest.raises(PermissionsError) as e:
            preflight(w.pid, None)
        assert (str(e.value), e.value.exit_code) == (
            f"PID {w.pid} is already traced by PID {os.getpid()} (a debugger?): --device cupti -p cannot attach "
            "next to it", 77)
    finally:
        other.detach()
    assert_running_untraced(w.pid)
    assert w.finish("x\n") == "got x errno 77 usr2 blocked\n"


def test_refused_under_sudo_for_another_users_process(workload, running, monkeypatch):
    w = running(workload, "read")
    monkeypatch.setenv("SUDO_UID", "65534")
    monkeypatch.setenv("SUDO_GID", "65534")
    with pytest.raises(PermissionsError, match=rf"^PID {w.pid} belongs to root \(uid 0\), not to "):
        preflight(w.pid, 65534)


def test_record_says_no_device_and_leaves_the_program_right(require_bpf, lib, workload, running, tmp_path):
    """The whole capture: the real libcupti loaded into a program on a machine
    without a GPU says so in the capture; the program runs on, correct."""
    w = running(workload, "busy", "2")
    out = tmp_path / "cap"
    r = cli("-p", str(w.pid), "--device", "cupti", "-d", "1", "-o", str(out), timeout=600)
    assert r.returncode == 0, r.stderr
    notes = json.loads((out / "manifest.json").read_text())["notes"]
    [note] = [n for n in notes if n.startswith("no device timeline")]
    assert re.fullmatch(rf"no device timeline for PID {w.pid}: CUPTI unavailable: .+ \(no GPU, or a driver CUPTI "
                        r"cannot use\)", note), note
    assert f"warning: {note}\n" in r.stderr
    assert_running_untraced(w.pid)
    assert maps_collector(w.pid, lib)
    assert re.fullmatch(r"ok [1-9][0-9]*\n", w.finish("stop\n"))
    assert not list(tmp_path.glob(".cap.device-*"))  # the staging directory went
