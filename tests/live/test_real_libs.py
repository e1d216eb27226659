"""The real vendor libraries, no GPU: NVIDIA's libcuda.so.1 of drivers 535
and 550 (Debian non-free `libcuda1` of bookworm and trixie, unpacked into a
cache by scripts/fetch_vendor_libs.sh, never installed) and Debian's
libamdhip64.so.5.  Their calls fail ("no device"), which is exactly what lets
us check the return codes the probes capture.
Plus: a tracer killed with SIGKILL leaves readable Parquet files."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import warnings
from pathlib import Path

import polars as pl
import pytest
from elftools.elf.elffile import ELFFile

import expect
from pasta_run import descendants, read_report, run_pasta, wait_for_file
from pasta_trace.probes.catalog import APIS
from pasta_trace.read import open_capture

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_probe_catalog import CUDA_ABSENT, DRIVERS, vendor_libcuda  # noqa: E402

HIP_REAL = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5")
#: the kernel flushes row groups at least this often (issue 2, point 7)
FLUSH_INTERVAL_S = 2.0


@pytest.fixture(scope="session")
def real_libamdhip64() -> Path:
    if not HIP_REAL.exists():
        pytest.skip(f"{HIP_REAL} not installed (apt-get install libamdhip64-5)")
    return HIP_REAL.resolve()


def dynamic_functions(path: Path) -> set[str]:
    """Exported function names, read with pyelftools (version suffixes like @@hip_4.2 are not part of them)."""
    with open(path, "rb") as f:
        dynsym = ELFFile(f).get_section_by_name(".dynsym")
        return {s.name for s in dynsym.iter_symbols()
                if s["st_info"]["type"] == "STT_FUNC" and s["st_shndx"] != "SHN_UNDEF"}


def absent(family: str, path: Path) -> list[str]:
    exports = dynamic_functions(path)
    return sorted(a.symbol for a in APIS if a.family == family and a.symbol not in exports)


@pytest.mark.parametrize("driver", DRIVERS)
def test_probed_symbols_in_real_libcuda(driver):
    """pyelftools, not our own ELF reader, finds exactly the entry points each
    driver lacks (535: the name getters too)."""
    path, version = vendor_libcuda(driver)
    assert absent("cuda", Path(path)) == sorted(CUDA_ABSENT[driver]), f"libcuda {version}"


def test_probed_symbols_in_real_libamdhip64(real_libamdhip64):
    missing = absent("hip", real_libamdhip64)
    assert {"hipLaunchKernel", "hipMalloc", "hipFree", "hipMemcpy", "hipStreamSynchronize",
            "hipModuleGetFunction"}.isdisjoint(missing)
    warnings.warn(f"Debian {real_libamdhip64.name}: {len(missing)} probed entry points absent: "
                  f"{', '.join(missing) or 'none'}")


#: what real_libs_calls passes to each CUDA call (tests/fixtures/real_libs_calls.c); "src" it prints
CUDA_ARGS = {
    "cuInit": {},
    "cuDeviceGetCount": {},
    "cuDeviceGet": {},
    "cuMemAlloc_v2": {"size": 4096},
    "cuMemcpyHtoD_v2": {"dst": 0x1000, "size": 64, "copy_kind": "h2d"},
    "cuMemsetD8_v2": {"ptr": 0x1000, "size": 256},
    "cuLaunchKernel": {"func": 0, "grid_x": 1, "grid_y": 1, "grid_z": 1, "block_x": 32, "block_y": 1, "block_z": 1,
                       "shmem": 0, "stream": 0},
    "cuStreamSynchronize": {"stream": 0},
    "cuCtxSynchronize": {},
    "cuMemFree_v2": {"ptr": 0x1000},
}  # fmt: skip


@pytest.mark.live
def test_calls_through_real_libraries_captured_with_return_codes(require_bpf, real_libamdhip64, real_libs_program,
                                                                 tmp_path):
    """One tracer, the same calls through each real driver (535, 550) and HIP,
    one process each: every probed call once, with its arguments and return code."""
    runs, unavailable = [], []  # (name, family, library, the catalog symbols it lacks)
    for driver in DRIVERS:
        try:
            runs.append((f"cuda{driver}", "cuda", Path(vendor_libcuda(driver)[0]), sorted(CUDA_ABSENT[driver])))
        except pytest.skip.Exception as e:
            unavailable.append(str(e))
    runs.append(("hip", "hip", real_libamdhip64, absent("hip", real_libamdhip64)))
    out = tmp_path / "cap"
    script = " && ".join(  # one process per run, its PID written down
        f"sh -c 'echo $$ > {tmp_path}/{run}.pid && exec {real_libs_program} {family} {lib} > {tmp_path}/{run}.out'"
        for run, family, lib, _ in runs
    )
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    assert cap.complete
    events = cap.events.sort("ts_ns").collect()
    cols = sorted({c for args in CUDA_ARGS.values() for c in args} | {"src"})
    for run, family, lib, lacks in runs:
        printed = json.loads((tmp_path / f"{run}.out").read_text())
        assert all(c["ret"] != 0 for c in printed), "expected 'no device' failures"
        called = [c for c in printed if c["api"] in expect.PROBED]
        got = events.filter(pl.col("pid") == int((tmp_path / f"{run}.pid").read_text()))
        if family == "cuda":
            assert [c["api"] for c in called] == list(CUDA_ARGS)
            want = [{"api": c["api"], "ret": c["ret"] if c["api"] in expect.WITH_RET else None}
                    | dict.fromkeys(cols) | CUDA_ARGS[c["api"]] | ({"src": c["src"]} if "src" in c else {})
                    for c in called]  # fmt: skip
            rows = got.select(pl.col("api").cast(pl.String), "ret", *[pl.col(k) for k in cols])
            assert rows.with_columns(pl.col("copy_kind").cast(pl.String)).to_dicts() == want, f"{run} ({lib})"
        else:
            want = [(c["api"], c["ret"] if c["api"] in expect.WITH_RET else None) for c in called]
            assert got.select(pl.col("api").cast(pl.String), "ret").rows() == want, f"{run} ({lib})"
        entry = [e for e in cap.manifest["libraries"] if e["inode"] == lib.stat().st_ino]
        assert len(entry) == 1, cap.manifest["libraries"]
        assert sorted(entry[0]["symbols_missing"]) == lacks == absent(family, lib), run
    if unavailable:
        pytest.skip(f"checked {', '.join(r[0] for r in runs)} only: {'; '.join(unavailable)}")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.live
def test_sigkill_leaves_readable_parquet(require_bpf, families, tmp_path, tracer):
    """kill -9 the tracer mid-run: the events writer takes over (capture.output.takeover) and completes the
    capture; the files hold every call made before the kill."""
    cuda = families[0]
    out, report, go = tmp_path / "cap", tmp_path / "report.json", tmp_path / "go"
    t = tracer(["-o", str(out), "--", str(cuda.workload), "--lib", str(cuda.stub), "--report", str(report),
                "--threads", "2", "--iters", "1", "--go-file", str(go)])
    try:
        wait_for_file(report.with_name(report.name + ".ready"), timeout=180)
        time.sleep(FLUSH_INTERVAL_S * 1.5)
        writer = [p for p in descendants(t.proc.pid) if b"capture.output.event_writer" in _cmdline(p)]
        assert len(writer) == 1
        t.proc.send_signal(signal.SIGKILL)
        # a killed tracer's uprobes are removed by the kernel as it exits, 0.1-0.25 s each
        t.proc.wait(timeout=300)
    finally:
        go.touch()  # the workload finishes (untraced) and writes its report, whatever happened
    wait_for_file(report, timeout=60)
    # the writer completes the manifest once it has drained the kernel's ring, then exits: not
    # before the tracer's end was seen, not necessarily before the tracer was reaped
    deadline = time.monotonic() + 120
    while _running(writer[0]) and time.monotonic() < deadline:
        time.sleep(0.05)
    cap = open_capture(out)
    assert cap.complete, cap.problems
    assert any("died during the capture" in n for n in cap.manifest["notes"])
    assert expect.mismatches(cap, [read_report(report)], {"setup", "before_go"}) == []
    assert [f for f in os.listdir(out) if f.endswith(".parquet") and f.startswith("events")]
