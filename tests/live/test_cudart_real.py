"""The CUDA runtime, real parts: an nvcc-built program (real host stubs, a
real fatbin) on the toolkit's libcudart.so.13, shared or linked into the
executable (libcudart_static, kept in its .symtab), over NVIDIA's real 535
libcuda.so.1.  There is no GPU (and 535 is older than the runtime needs), so
every call fails, but each <<<>>> still enters the runtime's launch entry
point: exactly one launch event per <<<>>>, each with its kernel's name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

import cudart_expect as ce
from pasta_run import run_pasta, wait_for_file
from pasta_trace.read import open_capture

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_probe_catalog import vendor_libcuda  # noqa: E402

ROUNDS = 3
#: per round, without a GPU: four <<<>>> and one cudaLaunchKernel (cudaGetFuncBySymbol fails:
#: no launch through the driver alone)
LAUNCHES_PER_ROUND = 5
#: libcudart 13's __cudaLaunchKernel only jumps to cudaLaunchKernel: its launches are reported under it
FORWARDERS = {"__cudaLaunchKernel": "cudaLaunchKernel", "__cudaLaunchKernel_ptsz": "cudaLaunchKernel_ptsz"}
#: cudaErrorInsufficientDriver: the 535 driver is CUDA 12.2
INSUFFICIENT_DRIVER = 35


@pytest.fixture(scope="module")
def real_driver_env() -> dict[str, str]:
    return {"LD_LIBRARY_PATH": str(Path(vendor_libcuda()[0]).parent)}


def _check(cap, report: dict, library: Path) -> None:
    pid = report["pid"]
    assert len(ce.reported_launches(report, {"run"})) == ROUNDS * LAUNCHES_PER_ROUND
    assert ce.captured_launches(cap, pid) == ce.reported_launches(report, {"run"})
    ev = cap.events.filter(pl.col("pid") == pid).collect()
    launches = ev.filter(pl.col("kind") == "launch")
    assert launches.group_by(pl.col("api").cast(pl.String), "layer").len().rows() == [
        ("cudaLaunchKernel", "runtime", ROUNDS * LAUNCHES_PER_ROUND)]
    assert ev.filter(pl.col("kind") == "nested").height == 0  # nothing reached the driver's launch
    # the runtime's memory calls are seen, and fail as the program saw
    calls = ev.filter(pl.col("api").cast(pl.String).is_in(["cudaMalloc", "cudaDeviceSynchronize"])).select(
        pl.col("api").cast(pl.String), "ret").unique().sort("api").rows()
    assert calls == [("cudaDeviceSynchronize", INSUFFICIENT_DRIVER), ("cudaMalloc", INSUFFICIENT_DRIVER)]
    entry = [e for e in cap.manifest["libraries"] if e["inode"] == library.stat().st_ino]
    assert [(e["family"], e["symbols_missing"], e["aliases"]) for e in entry] == [("cudart", [], FORWARDERS)]


@pytest.mark.live
def test_launched_static_runtime(require_bpf, cudart_launcher, real_driver_env, tmp_path):
    """libcudart_static linked into the executable: probed in the executable itself."""
    launcher = cudart_launcher("static")
    out, report = tmp_path / "cap", tmp_path / "report.json"
    r = run_pasta(["-o", str(out), "--", str(launcher), "--report", str(report), "--rounds", str(ROUNDS)],
                  timeout=180, env=real_driver_env)
    assert r.returncode == 0, r.stderr
    _check(open_capture(out), ce.read(report), launcher)


@pytest.mark.live
def test_attached_shared_and_static_runtime(require_bpf, cudart_launcher, real_driver_env, tracer, tmp_path):
    """Attached mid-run (one tracer, -p both) to a program on the toolkit's
    libcudart.so.13 and to one with the runtime linked in."""
    go = tmp_path / "go"
    procs, reports, libraries = [], [], []
    try:
        for cudart in ("shared", "static"):
            report = tmp_path / f"{cudart}.json"
            procs.append(subprocess.Popen([str(cudart_launcher(cudart)), "--report", str(report), "--rounds",
                                           str(ROUNDS), "--go-file", str(go)], env={**os.environ, **real_driver_env}))
            reports.append(report)
        for p, report in zip(procs, reports):
            wait_for_file(report.with_name(report.name + ".ready"), timeout=60, proc=p)
        maps = Path(f"/proc/{procs[0].pid}/maps").read_text().splitlines()
        libraries = [next(Path(line.split()[5]) for line in maps if "libcudart.so" in line), cudart_launcher("static")]
        t = tracer(["-o", str(tmp_path / "cap"), "-p", ",".join(str(p.pid) for p in procs)])
        t.wait_ready(timeout=120)
        go.touch()
        assert [p.wait(timeout=60) for p in procs] == [0, 0]
        assert t.finish(timeout=120) == 0, t.stderr()
    finally:
        go.touch()
        for p in procs:
            if p.poll() is None:
                p.kill()
    cap = open_capture(tmp_path / "cap")
    for report, library in zip(reports, libraries):
        _check(cap, ce.read(report), library)
