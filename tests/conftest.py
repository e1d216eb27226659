"""Shared test fixtures: BPF availability, session-cached builds of the stub
libraries and workloads (tests/fixtures/build.py), and a helper that runs the
real `pasta-trace` CLI as a subprocess with a timeout."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import build  # noqa: E402  (tests/fixtures/build.py)

#: the banner `pasta-trace` prints once its probes are attached (DESIGN.md §6)
READY_TEXT = "Ctrl-C to end"


def _bpf_problem() -> str | None:
    try:
        import bcc  # noqa: F401  (Debian's python3-bpfcc, never PyPI's `bcc`)
    except Exception as e:  # ImportError, or a broken libbcc underneath
        return f"BCC not importable ({type(e).__name__}: {e}): apt-get install python3-bpfcc"
    try:
        from bcc import BPF

        b = BPF(text="int pasta_probe(void *ctx) { return 0; }")
        b.load_func("pasta_probe", BPF.KPROBE)
        b.cleanup()
    except Exception as e:
        return f"cannot load a BPF program ({type(e).__name__}: {e})"
    return None


@pytest.fixture(scope="session")
def _bpf_status() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    problem = _bpf_problem()
    return f"BPF unavailable: {problem}" if problem else None


@pytest.fixture
def require_bpf(_bpf_status: str | None) -> None:
    """Skip (saying why) unless we are root and can load BPF programs."""
    if _bpf_status:
        pytest.skip(_bpf_status)


@pytest.fixture(scope="session")
def build_dir() -> Path:
    return build.DEFAULT_OUT


def _built(name: str, out: Path) -> Path:
    try:
        return build.BUILDERS[name](out)
    except build.Unavailable as e:
        pytest.skip(f"cannot build {name}: {e}")


@pytest.fixture(scope="session")
def cuda_stub(build_dir: Path) -> Path:
    return _built("cuda_stub", build_dir)


@pytest.fixture(scope="session")
def hip_stub(build_dir: Path) -> Path:
    return _built("hip_stub", build_dir)


@pytest.fixture(scope="session")
def cuda_workload(build_dir: Path) -> Path:
    return _built("cuda_workload", build_dir)


@pytest.fixture(scope="session")
def hip_workload(build_dir: Path) -> Path:
    return _built("hip_workload", build_dir)


@pytest.fixture(scope="session")
def real_libs_program(build_dir: Path) -> Path:
    return _built("real_libs_calls", build_dir)


@dataclass(frozen=True)
class Family:
    """Everything a live test needs about one library family."""

    name: str  # cuda | hip
    stub: Path
    workload: Path
    soname: str  # file name the library is loaded under


@pytest.fixture(scope="session", params=["cuda", "hip"])
def family(request, build_dir: Path) -> Family:
    if request.param == "cuda":
        return Family("cuda", _built("cuda_stub", build_dir), _built("cuda_workload", build_dir), "libcuda.so.1")
    return Family("hip", _built("hip_stub", build_dir), _built("hip_workload", build_dir), "libamdhip64.so")


# --------------------------------------------------------------------------- running pasta-trace


def pasta_command() -> list[str]:
    exe = Path(sys.executable).parent / "pasta-trace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pasta_trace.cli"]


def run_pasta(args: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    """Run `pasta-trace ARGS` to completion; the timeout kills it (and fails the test)."""
    return subprocess.run([*pasta_command(), *args], capture_output=True, text=True, timeout=timeout, **kw)


class Tracer:
    """`pasta-trace ARGS` in the background; stderr goes to a file we can poll."""

    def __init__(self, args: list[str], log: Path):
        self.log = log
        self._err = open(log, "w")
        self.proc = subprocess.Popen([*pasta_command(), *args], stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, start_new_session=True)
        self.stdout = ""

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60, text: str = READY_TEXT) -> None:
        """Wait for the attach banner; fail with the tracer's own words otherwise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.stderr():
                return
            if self.proc.poll() is not None:
                self.finish()
                pytest.fail(f"pasta-trace exited {self.proc.returncode} before attaching:\n{self.stderr()}")
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"pasta-trace did not print {text!r} within {timeout}s:\n{self.stderr()}")

    def stop(self, timeout: float = 60) -> int:
        """Ctrl-C: the tracer must write everything and exit 0."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.finish(timeout)

    def finish(self, timeout: float = 60) -> int:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"pasta-trace did not exit within {timeout}s:\n{self.stderr()}")
        self.stdout = out or ""
        self._err.close()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._err.close()


@pytest.fixture
def tracer(tmp_path: Path):
    """Factory: tracer(args) -> Tracer; any tracer still running at the end is killed."""
    started: list[Tracer] = []

    def start(args: list[str], name: str = "tracer") -> Tracer:
        t = Tracer(args, tmp_path / f"{name}.stderr")
        started.append(t)
        return t

    yield start
    for t in started:
        t.kill()


def wait_for_file(path: Path, timeout: float = 30, proc: subprocess.Popen | None = None) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return path.read_text()
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{proc.args[0]} exited {proc.returncode} before writing {path}")
        time.sleep(0.02)
    pytest.fail(f"{path} did not appear within {timeout}s")


def read_report(path: Path) -> dict:
    return json.loads(path.read_text())


def copy_library(src: Path, dest_dir: Path, name: str | None = None) -> Path:
    """A copy of a library at another path: a new inode, as a venv-bundled copy would be."""
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / (name or src.name)
    shutil.copy2(src, dest)
    return dest
