"""The CUPTI collector: the encoding of real cupti-python activity records, and
what a traced Python program sees when CUPTI cannot run (this machine has no GPU)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.device import read_device_file
from pasta_trace.device.cupti_collector import ActivityEncoder, CuptiCollector, CuptiUnavailable
from pasta_trace.device.inject import DeviceSession
from pasta_trace.device.writer import DeviceFileWriter

cupti = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed")
ROOT = Path(__file__).resolve().parents[2]
from pasta_trace.safe_output import OutputDir


def _out(path):
    return OutputDir.claim(path, force=False)


def _driver_present() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


NO_DRIVER = pytest.mark.skipif(_driver_present(), reason="a CUDA driver library is installed here")


_STRUCTS: list[np.ndarray] = []  # CUPTI structs must outlive the objects that view them


def _activity(cls, dtype, **fields):
    """A real cupti-python activity object over a CUPTI struct we fill in.
    cupti-python complains on stderr when such an object dies (its buffer manager
    never saw the memory); harmless, hence the filterwarnings below."""
    a = np.zeros(1, dtype=dtype)
    for k, v in fields.items():
        a[k] = v
    _STRUCTS.append(a)
    return cls.from_ptr(a.ctypes.data, readonly=True)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_activity_records_become_device_records(tmp_path):
    K = cupti.ActivityKind
    names = [ctypes.create_string_buffer(b"vecadd"), ctypes.create_string_buffer(b"gemm_128x128")]
    acts = [
        _activity(cupti.ActivityKernel10, cupti.activity_kernel10_dtype, kind=int(K.CONCURRENT_KERNEL), start=1000,
                  end=2500, grid_id=7, stream_id=13, correlation_id=41, device_id=0, name=ctypes.addressof(names[0]),
                  grid_x=4096, grid_y=1, grid_z=1, block_x=256, block_y=1, block_z=1),
        _activity(cupti.ActivityMemcpy6, cupti.activity_memcpy6_dtype, kind=int(K.MEMCPY), start=3000, end=3400,
                  bytes=1 << 24, stream_id=13, correlation_id=42, device_id=0, copy_kind=int(cupti.ActivityMemcpyKind.HTOD)),
        _activity(cupti.ActivityMemset4, cupti.activity_memset4_dtype, kind=int(K.MEMSET), start=3500, end=3600,
                  bytes=4096, stream_id=14, correlation_id=43, device_id=1, value=0xAB),
        _activity(cupti.ActivityKernel10, cupti.activity_kernel10_dtype, kind=int(K.CONCURRENT_KERNEL), start=4000,
                  end=9000, grid_id=8, stream_id=14, correlation_id=44, device_id=1, name=ctypes.addressof(names[1]),
                  grid_x=8, grid_y=8, grid_z=2, block_x=128, block_y=2, block_z=1),
        _activity(cupti.ActivityKernel10, cupti.activity_kernel10_dtype, kind=int(K.CONCURRENT_KERNEL), start=9100,
                  end=9200, grid_id=9, stream_id=13, correlation_id=45, device_id=0, name=ctypes.addressof(names[0]),
                  grid_x=1, grid_y=1, grid_z=1, block_x=32, block_y=1, block_z=1),
        _activity(cupti.ActivityMemory4, cupti.activity_memory4_dtype, kind=int(K.MEMORY2), timestamp=500,
                  memory_operation_type=int(cupti.ActivityMemoryOperationType.ALLOCATION),
                  memory_kind=int(cupti.ActivityMemoryKind.DEVICE), address=0x7F0000000000, bytes=1 << 24,
                  context_id=1, stream_id=0),
        _activity(cupti.ActivityMemory4, cupti.activity_memory4_dtype, kind=int(K.MEMORY2), timestamp=600,
                  memory_operation_type=int(cupti.ActivityMemoryOperationType.ALLOCATION),
                  memory_kind=int(cupti.ActivityMemoryKind.MANAGED), address=0x7F0001000000, bytes=4096,
                  context_id=1, stream_id=0),
        _activity(cupti.ActivityMemory4, cupti.activity_memory4_dtype, kind=int(K.MEMORY2), timestamp=700,
                  memory_operation_type=int(cupti.ActivityMemoryOperationType.ALLOCATION), is_async=1,
                  memory_kind=int(cupti.ActivityMemoryKind.DEVICE), address=0x7F0002000000, bytes=512,
                  context_id=1, stream_id=14),
        _activity(cupti.ActivityMemory4, cupti.activity_memory4_dtype, kind=int(K.MEMORY2), timestamp=9900,
                  memory_operation_type=int(cupti.ActivityMemoryOperationType.RELEASE),
                  memory_kind=int(cupti.ActivityMemoryKind.DEVICE), address=0x7F0000000000, bytes=1 << 24,
                  context_id=1, stream_id=0),
    ]
    path = tmp_path / "gpu_probes.77.cupti.bin"
    with DeviceFileWriter(path, pid=77, backend=schema.DeviceBackend.cupti) as w:
        enc = ActivityEncoder(cupti, w)
        enc.write(acts[:4])
        enc.write(acts[4:])  # a second buffer: names already interned are not written again
    d = read_device_file(path)
    assert d.problems == []
    f = d.frames
    assert f["cupti_kernels"].select(
        "pid", "start", "end", "grid_id", "stream_id", "correlation_id", "device", "name",
        "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
    ).rows() == [
        (77, 1000, 2500, 7, 13, 41, 0, "vecadd", 4096, 1, 1, 256, 1, 1),
        (77, 4000, 9000, 8, 14, 44, 1, "gemm_128x128", 8, 8, 2, 128, 2, 1),
        (77, 9100, 9200, 9, 13, 45, 0, "vecadd", 1, 1, 1, 32, 1, 1),
    ]
    assert f["cupti_kernels"]["name_id"].to_list() == [1, 2, 1]
    assert f["cupti_memcpy"].rows() == [(77, 3000, 3400, 1 << 24, 13, 42, 0, int(cupti.ActivityMemcpyKind.HTOD))]
    assert f["cupti_memset"].rows() == [(77, 3500, 3600, 4096, 14, 43, 1, 0xAB)]
    assert f["allocs"].rows() == [
        (77, 500, 0x7F0000000000, 1 << 24, 1, 0, 0),
        (77, 600, 0x7F0001000000, 4096, 1, 0, 1),
        (77, 700, 0x7F0002000000, 512, 1, 14, 3),
    ]
    assert f["frees"].rows() == [(77, 9900, 0x7F0000000000, 1 << 24, 1, 0, 0)]
    # exactly two STRING records (16 + 8 + len(name), padded to 8): names are interned once
    rec = lambda r: 16 + r.size  # noqa: E731
    assert path.stat().st_size == 64 + 32 + 40 + 3 * rec(schema.DEV_CUPTI_KERNEL) + 2 * rec(schema.DEV_CUPTI_MEMOP) + 4 * rec(schema.DEV_ALLOC)


@NO_DRIVER
def test_collector_start_without_driver_raises_and_leaves_no_file(tmp_path):
    # in a fresh interpreter: other tests load libcuda.so.1 into this one
    code = f"""
from pathlib import Path
from pasta_trace.device.cupti_collector import CuptiCollector, CuptiUnavailable
c = CuptiCollector(Path({str(tmp_path)!r}), pid=5)
try:
    c.start()
except CuptiUnavailable as e:
    print(e)
c.stop()  # nothing started: a no-op
"""
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "CUDA driver is not found (libcuda.so.1: cannot open shared object file: No such file or directory)\n"
    assert list(tmp_path.iterdir()) == []


def _run_traced(session: DeviceSession, code: str, extra_env: dict[str, str] | None = None, cwd: Path | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_LIBRARY_PATH")}
    env.update(session.env())
    env.update(extra_env or {})
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@NO_DRIVER
@pytest.mark.parametrize("status", [0, 3])
def test_traced_program_goes_on_without_driver(tmp_path, status):
    cap = tmp_path / "cap"
    s = DeviceSession("cupti", _out(cap))
    # run from a folder without pasta_trace: the bootstrap must find it through PASTA_TRACE_PYTHONPATH
    r = _run_traced(s, f"import sys; print('traced program ran'); sys.exit({status})", cwd=tmp_path)
    assert r.returncode == status
    assert r.stdout == "traced program ran\n"
    assert r.stderr == (
        "CUPTI unavailable: CUDA driver is not found "
        "(libcuda.so.1: cannot open shared object file: No such file or directory)\n"
    )
    # decided: no file at all when CUPTI is unavailable
    assert s.finish() == []
    assert list(cap.iterdir()) == [] and not s.staging.exists()


def _vendor_libcuda() -> Path:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "fetch_vendor_libs.sh")], capture_output=True, text=True, timeout=300)
    if r.returncode == 3:
        pytest.skip(f"NVIDIA's libcuda.so.1 could not be fetched: {r.stderr.strip() or r.stdout.strip()}")
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip().splitlines()[-1])


def test_traced_program_goes_on_with_a_driver_too_old_for_cupti(tmp_path):
    """NVIDIA's real 535 driver library loads, but cupti-python 13 wants a CUDA 13 driver."""
    lib = _vendor_libcuda()
    version = (lib.parents[5] / "VERSION").read_text().strip() if (lib.parents[5] / "VERSION").exists() else ""
    if not version.startswith("535."):
        pytest.skip(f"expected the 535 driver library, found {version or 'no VERSION'}")
    s = DeviceSession("cupti", _out(tmp_path / "cap"))
    r = _run_traced(s, "print('still here')", {"LD_LIBRARY_PATH": str(lib.parent)}, cwd=tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (
        0, "still here\n", "CUPTI unavailable: only CUDA 13.0 or later driver is supported\n",
    )
    assert s.finish() == []


@NO_DRIVER
def test_the_shadowed_sitecustomize_still_runs(tmp_path):
    user = tmp_path / "user_site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import sys; print('user sitecustomize', file=sys.stderr)\n")
    s = DeviceSession("cupti", _out(tmp_path / "cap"))
    env = s.env()
    r = _run_traced(s, "print('main')", {"PYTHONPATH": env["PYTHONPATH"] + os.pathsep + str(user)}, cwd=tmp_path)
    assert (r.returncode, r.stdout) == (0, "main\n")
    assert r.stderr.splitlines() == [
        "user sitecustomize",
        "CUPTI unavailable: CUDA driver is not found "
        "(libcuda.so.1: cannot open shared object file: No such file or directory)",
    ]


def test_unset_gpu_probes_dir_is_reported_not_raised(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GPU_PROBES_DIR", "PYTHONPATH")}
    env["PYTHONPATH"] = str(ROOT / "pasta_trace" / "device" / "cupti_bootstrap") + os.pathsep + str(ROOT)
    r = subprocess.run([sys.executable, "-c", "print(1)"], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (0, "1\n", "CUPTI unavailable: GPU_PROBES_DIR is not set\n")
