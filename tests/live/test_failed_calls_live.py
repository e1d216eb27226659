"""Every failure visible (issue 20, item 3): launches, copies, memsets and
frees return their codes (bpf/pasta.h, PT_RET_SAVED), cuInit and the device
calls are probed, and a failed copy or allocation counts as no bytes in the
summary, the transfers and memory tools and --aggregate (top's counts:
tests/unit/test_top_counts.py).

The workload (tests/fixtures/failed_calls.c) makes each call once or twice
with good arguments and once with a null pointer or handle, through the
stand-in driver (PASTA_STUB_STRICT=1: null arguments fail as the real
driver's do; PASTA_STUB_NO_DEVICE=1: cuInit fails with CUDA_ERROR_NO_DEVICE),
the stand-in runtime, and NVIDIA's real 535 and 550 drivers, where with no
GPU cuInit returns 100 and every call after it fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_run import run_pasta
from pasta_trace.probes.catalog import API_ID, APIS
from pasta_trace.read import open_capture
from pasta_trace.tools.kernels import kernel_summary
from pasta_trace.tools.memory import memory_timeline
from pasta_trace.tools.overview import api_errors
from pasta_trace.tools.transfers import transfers_by_direction

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_probe_catalog import DRIVERS, vendor_libcuda  # noqa: E402

MIB = 1 << 20
#: the return codes' names (cuda.h, driver_types.h)
NAMES = {("cu", 1): "CUDA_ERROR_INVALID_VALUE", ("cu", 3): "CUDA_ERROR_NOT_INITIALIZED",
         ("cu", 100): "CUDA_ERROR_NO_DEVICE", ("cu", 400): "CUDA_ERROR_INVALID_HANDLE",
         ("cuda", 1): "cudaErrorInvalidValue", ("cuda", 98): "cudaErrorInvalidDeviceFunction"}


@pytest.fixture(scope="module")
def failed_calls_program(build_dir) -> Path:
    from conftest import _built
    return _built("failed_calls", build_dir)


def _runs(cuda_stub: Path, cudart_stub: Path) -> list[tuple[str, str, Path, str]]:
    """(name, family, library, environment) of each process; the real drivers that are cached."""
    strict = "PASTA_STUB_STRICT=1"
    runs = [("stub", "cuda", cuda_stub, strict), ("nodevice", "cuda", cuda_stub, f"{strict} PASTA_STUB_NO_DEVICE=1"),
            ("cudart", "cudart", cudart_stub, f"{strict} LD_LIBRARY_PATH={cuda_stub.parent}")]
    for driver in DRIVERS:
        try:
            runs.append((f"cuda{driver}", "cuda", Path(vendor_libcuda(driver)[0]), ""))
        except pytest.skip.Exception:
            pass
    return runs


def _capture(tmp_path: Path, program: Path, runs, extra: list[str]):
    out = tmp_path / "cap"
    script = " && ".join(
        f"sh -c 'echo $$ > {tmp_path}/{name}.pid && exec env {env} {program} {family} {lib} > {tmp_path}/{name}.out'"
        for name, family, lib, env in runs)
    r = run_pasta(["-o", str(out), *extra, "--", "sh", "-c", script], timeout=400)
    assert r.returncode == 0, r.stderr
    pids = {name: int((tmp_path / f"{name}.pid").read_text()) for name, *_ in runs}
    printed = {name: json.loads((tmp_path / f"{name}.out").read_text()) for name, *_ in runs}
    return r, open_capture(out), pids, printed


def _want_errors(pids, printed) -> list[tuple]:
    """(pid, api, error, ret, failed, calls) of every call the program saw fail, as api_errors gives them."""
    rows = {}
    for name, calls in printed.items():
        for c in calls:
            key = (pids[name], c["api"])
            rows.setdefault(key, []).append(c["ret"])
    out = []
    for (pid, api), rets in rows.items():
        for ret in sorted({r for r in rets if r}):
            out.append((pid, api, NAMES[("cuda" if api.startswith("cuda") else "cu", ret)], ret,
                        rets.count(ret), len(rets)))
    return sorted(out)


def _copied(printed, name: str) -> int:
    return sum(c["size"] for c in printed[name] if c["api"] in ("cuMemcpyHtoD_v2", "cudaMemcpy") and c["ret"] == 0)


@pytest.mark.live
def test_failed_calls_are_seen_and_count_no_bytes(require_bpf, failed_calls_program, cuda_stub, cudart_stub,
                                                   tmp_path):
    runs = _runs(cuda_stub, cudart_stub)
    r, cap, pids, printed = _capture(tmp_path, failed_calls_program, runs, [])
    assert cap.complete
    # what the program printed: the stand-in fails the null-argument calls only, a real driver every call
    assert [c["ret"] for c in printed["stub"]] == [0, 0, 0, 1, 0, 0, 1, 0, 1, 0, 400, 0, 1]
    assert [c["ret"] for c in printed["nodevice"]] == [100, 100, 0, 1, 0, 0, 1, 0, 1, 0, 400, 0, 1]
    assert [c["ret"] for c in printed["cudart"]] == [0, 0, 0, 1, 0, 0, 1, 0, 1, 98, 0, 1]
    for name, *_ in runs[3:]:
        assert [c["ret"] for c in printed[name]] == [100] + [3] * 8 + [400, 3, 3], name

    events = cap.events.sort("ts_ns").collect()
    for name, family, *_ in runs:
        # each call once at its own layer, with the code it returned
        got = events.filter((pl.col("pid") == pids[name]) & (pl.col("kind") != "nested")
                            & pl.col("api").cast(pl.String).str.starts_with("cuda" if family == "cudart" else "cu"))
        if family == "cudart":
            got = got.filter(pl.col("layer") == "runtime")
        assert got.select(pl.col("api").cast(pl.String), "ret").rows() == [
            (c["api"], c["ret"]) for c in printed[name]], name
        sizes = got.filter(pl.col("kind").is_in(["memcpy", "memset"])).get_column("size").to_list()
        assert sizes == [c["size"] for c in printed[name] if "Memcpy" in c["api"] or "Memset" in c["api"]
                         or c["api"] in ("cudaMemcpy", "cudaMemset")], name

    # the API-errors tool: every failed call by name (driver calls nested in a runtime call are the driver's own)
    errors = api_errors(cap).filter(pl.col("api").str.starts_with("cuda") | (pl.col("pid") != pids["cudart"]))
    assert sorted(errors.select("pid", "api", "error", "ret", "failed", "calls").rows()) == _want_errors(pids, printed)

    # the kernels tool: a launch call that failed ran no kernel, and is counted apart
    kernels = kernel_summary(cap).group_by("pid").agg(pl.col("launches").sum(), pl.col("failed_launches").sum())
    launched = {name: [c["ret"] for c in printed[name] if c["api"] in ("cuLaunchKernel", "cudaLaunchKernel")]
                for name, *_ in runs}
    assert sorted(kernels.rows()) == sorted(
        (pids[n], rets.count(0), len(rets) - rets.count(0)) for n, rets in launched.items() if rets)
    assert {n: (rets.count(0), len(rets)) for n, rets in launched.items()}["stub"] == (1, 2)

    # no failed copy or allocation counts anywhere: 1 MiB allocated and 2 MiB copied by each stand-in process
    stand_ins = [n for n, *_ in runs[:3]]
    transfers = transfers_by_direction(cap).sort("pid")
    assert transfers.select("pid", "direction", "copies", "bytes").rows() == sorted(
        (pids[n], "h2d", 2, _copied(printed, n)) for n in stand_ins)
    assert {_copied(printed, n) for n in stand_ins} == {2 * MIB}
    memory = memory_timeline(cap).sort("pid", "ts_ns")
    assert memory.select("pid", "api", "delta_bytes").rows() == [
        row for n in sorted(stand_ins, key=pids.get) for row in
        ((pids[n], "cudaMalloc" if n == "cudart" else "cuMemAlloc_v2", MIB),
         (pids[n], "cudaMalloc" if n == "cudart" else "cuMemAlloc_v2", -MIB))]
    summary = r.stderr
    assert "device memory: allocated 3.0 MiB in 3 allocations, freed 3.0 MiB, held at the end 0 B" in summary
    assert "copied: 6.0 MiB" in summary
    # cuInit: once per driver process, and inside each of the runtime's two device calls
    reals = len(runs) - 3
    assert f"{1 + reals} of {4 + reals} cuInit calls failed: CUDA_ERROR_NO_DEVICE" in summary, summary

    # the key findings open the report with the processes whose cuInit failed
    rep = run_pasta(["report", str(cap.path)], timeout=300)
    assert rep.returncode == 0, rep.stderr
    no_dev = sorted([pids["nodevice"]] + [pids[n] for n, *_ in runs[3:]])
    assert (f"cuInit failed with CUDA_ERROR_NO_DEVICE (100) in {len(no_dev)} processes "
            f"(pid {', '.join(map(str, no_dev))})") in " ".join(rep.stdout.split()), rep.stdout  # unwrapped


@pytest.mark.live
def test_failed_calls_count_no_bytes_in_aggregate(require_bpf, failed_calls_program, cuda_stub, cudart_stub,
                                                  tmp_path):
    runs = _runs(cuda_stub, cudart_stub)
    r, cap, pids, printed = _capture(tmp_path, failed_calls_program, runs, ["--aggregate"])
    agg = cap.aggregate.collect()
    for name, family, *_ in runs:
        rows = agg.filter(pl.col("pid") == pids[name])
        for api in {c["api"] for c in printed[name]}:
            if family == "cudart" and not api.startswith("cuda"):
                continue
            mine = rows.filter((pl.col("api").cast(pl.String) == api) & (pl.col("kind") != "nested"))
            want = {}
            for c in printed[name]:
                if c["api"] == api:
                    ok = c["ret"] == 0
                    n, b = want.get(c["ret"] if not ok else 0, (0, 0))
                    moved = c.get("size", 0) if ok and ("Memcpy" in api or "Memset" in api or "Malloc" in api
                                                         or "MemAlloc" in api) else 0
                    want[c["ret"]] = (n + 1, b + moved)
            got = {ret or 0: (cnt, b) for ret, cnt, b in mine.group_by("ret").agg(
                pl.col("count").sum(), pl.col("bytes").sum()).rows()}
            assert got == want, (name, api)
    assert "copied: 6.0 MiB (--aggregate keeps no per-free sizes)" in r.stderr, r.stderr
