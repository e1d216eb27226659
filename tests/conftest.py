"""Shared test fixtures: BPF availability, session-cached builds of the stub
libraries and workloads (tests/fixtures/build.py), and `tracer`, which runs the
real `pasta-trace` CLI in the background (tests/fixtures/pasta_run.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
import build  # noqa: E402  (tests/fixtures/build.py)
import torch_env  # noqa: E402  (tests/fixtures/torch_env.py)
import users  # noqa: E402  (tests/fixtures/users.py)
from pasta_run import Tracer  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A daemon traces every process of the machine, as -a does: every test of
    tests/live/test_daemon*.py is machine_wide (pyproject.toml says what that
    means to scripts/test.sh), those of later such files too."""
    for item in items:
        if item.path.name.startswith("test_daemon") and item.path.parent.name == "live":
            item.add_marker(pytest.mark.machine_wide)


def _bpf_problem() -> str | None:
    try:
        import bcc  # noqa: F401  (Debian's python3-bpfcc, never PyPI's `bcc`)
    except Exception as e:  # ImportError, or a broken libbcc underneath
        return f"BCC not importable ({type(e).__name__}: {e}): apt-get install python3-bpfcc"
    try:
        from bcc import BPF

        b = BPF(text=b"int pasta_probe(void *ctx) { return 0; }")
        b.load_func(b"pasta_probe", BPF.KPROBE)
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


class InProcess:
    """BPF programs and their watchers made in the test process."""

    def __init__(self) -> None:
        self._programs: list = []
        self._closers: list = []

    def bpf(self, text: str):
        from bcc import BPF

        b = BPF(text=text.encode())
        self._programs.append(b)
        return b

    def closing(self, obj):
        """``obj`` (a watcher, a ring) closed at teardown, before the programs."""
        self._closers.append(obj)
        return obj

    def release(self) -> None:
        for obj in reversed(self._closers):
            obj.close()
        for b in reversed(self._programs):
            b.cleanup()
        self._closers.clear()
        self._programs.clear()


@pytest.fixture
def in_process(require_bpf) -> InProcess:
    """Load BPF programs in the test process, released after the test
    whatever its outcome.  A discover program left loaded keeps its `pt_own`
    map, which holds this process: every tracer started later merges the
    other tracers' `pt_own` maps, counts this process and its children (the
    workloads of every later test) as its own, and traces none of them."""
    made = InProcess()
    yield made
    made.release()


@pytest.fixture(scope="session", autouse=True)
def _bpf_cache(tmp_path_factory) -> None:
    """One cache of compiled BPF handlers (probes/compiled_cache) for the
    session's tracers, which inherit the variable: the first capture of each
    configuration compiles, the later ones load.  Root's own cache
    (/var/cache/pasta-trace/bpf) is neither read nor filled by the tests; a
    variable already set (a cache kept across runs) is kept."""
    os.environ.setdefault("PASTA_TRACE_BPF_CACHE", str(tmp_path_factory.mktemp("bpf-cache")))


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
def c10_stub(build_dir: Path) -> Path:
    return _built("c10_stub", build_dir)


@pytest.fixture(scope="session")
def real_libs_program(build_dir: Path) -> Path:
    return _built("real_libs_calls", build_dir)


@pytest.fixture(scope="session")
def native_chain(build_dir: Path) -> Path:
    """tests/fixtures/native_chain.c; its libnativechain.so lies beside it."""
    return _built("native_chain", build_dir)


@pytest.fixture(scope="session")
def cudart_stub(build_dir: Path) -> Path:
    return _built("cudart_stub", build_dir)


@pytest.fixture(scope="session")
def cudart_launcher(build_dir: Path):
    """Factory: cudart_launcher("shared" | "static") -> the nvcc-built launcher (tests/fixtures/cudart_launcher.cu)."""
    return lambda cudart: _built(f"cudart_launcher_{cudart}", build_dir)


@pytest.fixture(scope="session")
def torch_cpu() -> torch_env.TorchEnv:
    """PyTorch's CPU build in a private cache (installed on first use), or a skip saying why."""
    try:
        return torch_env.torch_env()
    except torch_env.Unavailable as e:
        pytest.skip(f"torch CPU build not available: {e}")


@dataclass(frozen=True)
class RealNccl:
    lib: Path  # libnccl.so.2
    header: Path  # its nccl.h
    version_code: int  # NCCL_VERSION_CODE of that header (what ncclGetVersion returns)


@pytest.fixture(scope="session")
def real_libnccl() -> RealNccl:
    """NVIDIA's libnccl.so.2 from PyPI's nvidia-nccl-cu13 wheel, cached by
    scripts/fetch_nccl.sh (never installed); skip saying why if unavailable."""
    r = subprocess.run([str(ROOT / "scripts" / "fetch_nccl.sh")], capture_output=True, text=True, timeout=900)
    if r.returncode == 3:
        pytest.skip(f"NVIDIA's libnccl.so.2 is unavailable: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    lib = Path(r.stdout.strip().splitlines()[-1])
    header = lib.parent.parent / "include" / "nccl.h"
    code = next(int(line.split()[2]) for line in header.read_text().splitlines()
                if line.startswith("#define NCCL_VERSION_CODE"))
    return RealNccl(lib, header, code)


@dataclass(frozen=True)
class Family:
    """Everything a live test needs about one library family."""

    name: str  # cuda | hip
    stub: Path
    workload: Path
    soname: str  # file name the library is loaded under


@pytest.fixture(scope="session")
def families(build_dir: Path) -> list[Family]:
    """Both stub families, so one tracer run (seconds of BCC compile) covers CUDA and HIP."""
    return [
        Family("cuda", _built("cuda_stub", build_dir), _built("cuda_workload", build_dir), "libcuda.so.1"),
        Family("hip", _built("hip_stub", build_dir), _built("hip_workload", build_dir), "libamdhip64.so"),
    ]


@pytest.fixture
def small_fs(tmp_path: Path):
    """A 4 MiB tmpfs, for a disk that fills up (mounting needs root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", "-l", str(d)], check=True)


@pytest.fixture
def sleeper():
    """A process to point -p at, idle for a minute."""
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


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


@pytest.fixture(scope="module")
def user() -> users.User:
    """A real local user (useradd), one per test module, removed after; the
    tests play it as the attacker or as the person who runs sudo."""
    if (why := users.unavailable()) is not None:
        pytest.skip(why)
    with users.temporary_user() as u:
        yield u
