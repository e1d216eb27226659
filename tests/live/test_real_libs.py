"""The real vendor libraries, no GPU: NVIDIA's libcuda.so.1 (Debian non-free
`libcuda1`, unpacked into a cache by scripts/fetch_vendor_libs.sh, never
installed) and Debian's libamdhip64.so.5.  Their calls fail ("no device"),
which is exactly what lets us check the return codes the probes capture.
Plus: a tracer killed with SIGKILL leaves readable Parquet files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import warnings
from pathlib import Path

import polars as pl
import pytest
from elftools.elf.elffile import ELFFile

import expect
from pasta_run import read_report, run_pasta, wait_for_file
from pasta_trace.probes.catalog import APIS
from pasta_trace.read import open_capture

ROOT = Path(__file__).resolve().parents[2]
HIP_REAL = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5")
#: the kernel flushes row groups at least this often (issue 2, point 7)
FLUSH_INTERVAL_S = 2.0


@pytest.fixture(scope="session")
def real_libcuda() -> tuple[Path, str]:
    r = subprocess.run([str(ROOT / "scripts" / "fetch_vendor_libs.sh")], capture_output=True, text=True, timeout=600)
    if r.returncode == 3:
        pytest.skip(f"NVIDIA's libcuda1 package is unavailable: {r.stderr.strip()}")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.strip().splitlines()[-1])
    stamp = next((p / "VERSION" for p in path.parents if (p / "VERSION").exists()), None)
    return path, stamp.read_text().strip() if stamp else "unknown version"


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


def test_probed_symbols_in_real_libcuda(real_libcuda):
    path, version = real_libcuda
    missing = absent("cuda", path)
    present = len([a for a in APIS if a.family == "cuda"]) - len(missing)
    # the core of every category exists in any driver we support
    assert {"cuLaunchKernel", "cuMemAlloc_v2", "cuMemFree_v2", "cuMemcpyHtoD_v2", "cuStreamSynchronize",
            "cuModuleGetFunction", "cuGetProcAddress_v2"}.isdisjoint(missing), f"libcuda {version}"
    warnings.warn(f"NVIDIA libcuda {version}: {present} probed entry points present, "
                  f"{len(missing)} absent: {', '.join(missing) or 'none'}")


def test_probed_symbols_in_real_libamdhip64(real_libamdhip64):
    missing = absent("hip", real_libamdhip64)
    assert {"hipLaunchKernel", "hipMalloc", "hipFree", "hipMemcpy", "hipStreamSynchronize",
            "hipModuleGetFunction"}.isdisjoint(missing)
    warnings.warn(f"Debian {real_libamdhip64.name}: {len(missing)} probed entry points absent: "
                  f"{', '.join(missing) or 'none'}")


@pytest.mark.live
def test_calls_through_real_libraries_captured_with_return_codes(require_bpf, real_libcuda, real_libamdhip64,
                                                                 real_libs_program, tmp_path):
    libcuda, version = real_libcuda
    out = tmp_path / "cap"
    script = (f"{real_libs_program} cuda {libcuda} > {tmp_path}/cuda.out && "
              f"{real_libs_program} hip {real_libamdhip64} > {tmp_path}/hip.out")
    r = run_pasta(["-o", str(out), "--", "sh", "-c", script], timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    assert cap.complete
    events = cap.events.sort("ts_ns").collect()
    for family, lib in (("cuda", libcuda), ("hip", real_libamdhip64)):
        printed = json.loads((tmp_path / f"{family}.out").read_text())
        assert all(c["ret"] != 0 for c in printed), "expected 'no device' failures"
        want = [(c["api"], c["ret"] if c["api"] in expect.WITH_RET else None)
                for c in printed if c["api"] in expect.PROBED]
        fam_apis = [a.symbol for a in APIS if a.family == family]
        got = events.filter(pl.col("api").cast(pl.String).is_in(fam_apis)).select(
            pl.col("api").cast(pl.String), "ret").rows()
        assert got == want, f"{family} ({lib})"
        entry = [e for e in cap.manifest["libraries"] if e["inode"] == lib.stat().st_ino]
        assert len(entry) == 1, cap.manifest["libraries"]
        assert sorted(entry[0]["symbols_missing"]) == absent(family, lib), (
            f"{lib.name} {version if family == 'cuda' else ''}: manifest and pyelftools disagree on absent symbols")


@pytest.mark.live
def test_sigkill_leaves_readable_parquet(require_bpf, families, tmp_path, tracer):
    """kill -9 the tracer mid-run: the files left hold every call made more than one flush interval earlier."""
    cuda = families[0]
    out, report, go = tmp_path / "cap", tmp_path / "report.json", tmp_path / "go"
    t = tracer(["-o", str(out), "--", str(cuda.workload), "--lib", str(cuda.stub), "--report", str(report),
                "--threads", "2", "--iters", "1", "--go-file", str(go)])
    try:
        wait_for_file(report.with_name(report.name + ".ready"), timeout=180)
        time.sleep(FLUSH_INTERVAL_S * 1.5)
        t.proc.send_signal(signal.SIGKILL)
        # a killed tracer's uprobes are removed by the kernel as it exits, 0.1-0.25 s each
        t.proc.wait(timeout=300)
    finally:
        go.touch()  # the workload finishes (untraced) and writes its report, whatever happened
    wait_for_file(report, timeout=60)
    cap = open_capture(out)
    assert not cap.complete
    assert expect.mismatches(cap, [read_report(report)], {"setup", "before_go"}) == []
    assert [f for f in os.listdir(out) if f.endswith(".parquet") and f.startswith("events")]
