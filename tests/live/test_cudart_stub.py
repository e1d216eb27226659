"""The CUDA runtime over the driver, with stand-ins for both (tests/fixtures/
cudart_stub.c over cuda_stub.c) and a real nvcc-built program: a runtime call
and the driver call made inside it are one call seen at two layers.

The stand-in runtime behaves as the real one does on a GPU: a <<<>>> launch
passes a CUkernel (from __cudaGetKernel), not the host stub, and each launch
reaches cuLaunchKernel with a CUfunction, through cuGetProcAddress pointers."""

from __future__ import annotations

import os
import subprocess

import polars as pl
import pytest

import cudart_expect as ce
from pasta_run import run_pasta, wait_for_file
from pasta_trace import schema
from pasta_trace.read import open_capture

ROUNDS = 2
#: per round: four <<<>>>, one cudaLaunchKernel, one cuLaunchKernel through the driver alone
LAUNCHES_PER_ROUND = 6
#: runtime call -> the driver call the stand-in makes inside it (each counted once, as the runtime call)
MEMORY = {"cudaMalloc": "cuMemAlloc_v2", "cudaMemcpy": "cuMemcpyHtoD_v2", "cudaMemset": "cuMemsetD8_v2",
          "cudaDeviceSynchronize": "cuCtxSynchronize_v2", "cudaFree": "cuMemFree_v2"}
KERNELS = ["_Z6vecAddPKfS0_Pfi", "_Z5scaleIfEvPT_S0_i", "plain_c_kernel", "_ZN2ns5innerEPd"]


@pytest.fixture
def stub_env(cudart_stub, cuda_stub) -> dict[str, str]:
    return {"LD_LIBRARY_PATH": f"{cudart_stub.parent}:{cuda_stub.parent}"}


def _check(cap, report: dict, phases: set[str]) -> None:
    pid = report["pid"]
    ev = cap.events.filter(pl.col("pid") == pid).sort("ts_ns").collect()
    api, kind = pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String)
    # one counted launch per launch, named after its kernel, with its shape
    assert ce.captured_launches(cap, pid) == ce.reported_launches(report, phases)
    assert len(ce.reported_launches(report, phases)) == ROUNDS * LAUNCHES_PER_ROUND
    launches = ev.filter(kind == "launch")
    assert launches.group_by(api, "layer").len().sort("api").rows() == [
        ("__cudaLaunchKernel", "runtime", 4 * ROUNDS), ("cuLaunchKernel", "driver", ROUNDS),
        ("cudaLaunchKernel", "runtime", ROUNDS)]
    # a <<<>>> launch holds the cudaLaunchKernel that __cudaLaunchKernel calls, each time; the
    # driver launch inside a runtime launch is written the first time its thread pairs that
    # runtime function with that handle, and folded after (counted, no event), unless another
    # runtime function of the same table slot took the slot in between (pasta.h, pt_inner)
    nested = ev.filter(kind == "nested")
    runtime = launches.filter(pl.col("layer") == "runtime")
    funcs = runtime["func"].unique().to_list()
    slots = [schema.fold_slot(f) for f in funcs]
    folding = {f for f, s in zip(funcs, slots) if slots.count(s) == 1}
    assert len(funcs) == 5  # four CUkernels and the vecAdd stub cudaLaunchKernel is given
    inner = runtime.join(
        nested.select("tid", pl.col("outer_ts_ns").alias("ts_ns"), api.alias("inner")), on=["tid", "ts_ns"],
        how="left").group_by(api, "inner").len().sort("api", "inner", nulls_last=True).rows()
    kept = {rt: sum(1 if f in folding else ROUNDS for f in runtime.filter(api == rt)["func"].unique())
            for rt in ("__cudaLaunchKernel", "cudaLaunchKernel")}
    expected = [("__cudaLaunchKernel", "cuLaunchKernel", kept["__cudaLaunchKernel"]),
                ("__cudaLaunchKernel", "cudaLaunchKernel", 4 * ROUNDS),
                ("cudaLaunchKernel", "cuLaunchKernel", kept["cudaLaunchKernel"]),
                ("cudaLaunchKernel", None, ROUNDS - kept["cudaLaunchKernel"])]
    assert inner == [row for row in expected if row[2]], (inner, funcs, slots)
    assert cap.manifest["counts"]["folded_launches"] == (ROUNDS - 1) * len(folding)
    # a <<<>>> launch passes the CUkernel: its name came from where it was called (caller_fp:
    # read for the first launch from each place, at least)
    cuda13 = launches.filter(api == "__cudaLaunchKernel")
    first = cuda13.group_by("func", maintain_order=True).first()
    assert (cuda13["caller"].null_count(), first.height, first["caller_fp"].null_count()) == (0, 4, 0)
    # memory and syncs: the runtime call counts, the driver call inside it is nested in it
    assert ce.reported_calls(report, phases) == {**{a: ROUNDS for a in MEMORY}, "cudaGetFuncBySymbol": ROUNDS}
    for rt, drv in MEMORY.items():
        outer = ev.filter(api == rt)
        assert (outer.height, outer["layer"].unique().to_list(), outer["kind"].cast(pl.String).unique().to_list()) \
            == (ROUNDS, ["runtime"], [{"cudaMalloc": "alloc", "cudaMemcpy": "memcpy", "cudaMemset": "memset",
                                      "cudaDeviceSynchronize": "sync", "cudaFree": "free"}[rt]])
        inside = ev.filter(api == drv)
        assert (inside["kind"].cast(pl.String).to_list(), sorted(inside["outer_ts_ns"].to_list())) == (
            ["nested"] * ROUNDS, sorted(outer["ts_ns"].to_list())), drv
    # the driver handles launched inside named runtime launches got their names: the
    # driver-only launch of scale<float> (its CUfunction) is named by them
    paired = cap.names.filter((pl.col("pid") == pid) & (pl.col("source") == "runtime_launch")).collect()
    assert sorted(paired["name"].to_list()) == sorted(KERNELS)


@pytest.mark.live
def test_launched_runtime_program_counts_each_call_once(require_bpf, cudart_launcher, cudart_stub, stub_env,
                                                        tmp_path):
    launcher = cudart_launcher("shared")
    out, report = tmp_path / "cap", tmp_path / "report.json"
    r = run_pasta(["-o", str(out), "--", str(launcher), "--report", str(report), "--rounds", str(ROUNDS)],
                  timeout=180, env=stub_env)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    assert cap.complete
    stub = [e for e in cap.manifest["libraries"] if e["inode"] == cudart_stub.stat().st_ino]
    assert [(e["family"], e["symbols_missing"], e["aliases"]) for e in stub] == [("cudart", [], {})]
    _check(cap, ce.read(report), {"run"})


@pytest.mark.live
def test_attached_runtime_program_names_launches_from_their_call_sites(require_bpf, cudart_launcher, stub_env,
                                                                       tracer, tmp_path):
    """Attached after every kernel was looked up (__cudaGetKernel ran before):
    the launches are still named, through where they were called from."""
    launcher = cudart_launcher("shared")
    report, go = tmp_path / "report.json", tmp_path / "go"
    proc = subprocess.Popen([str(launcher), "--report", str(report), "--rounds", str(ROUNDS), "--go-file", str(go)],
                            env={**os.environ, **stub_env})
    try:
        wait_for_file(report.with_name(report.name + ".ready"), timeout=60, proc=proc)
        t = tracer(["-o", str(tmp_path / "cap"), "-p", str(proc.pid)])
        t.wait_ready(timeout=120)
        go.touch()
        assert proc.wait(timeout=60) == 0
        assert t.finish(timeout=120) == 0, t.stderr()
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    cap = open_capture(tmp_path / "cap")
    _check(cap, ce.read(report), {"run"})
    # nothing named these CUkernels at run time: the lookups happened before the attach
    assert cap.names.filter(pl.col("source").cast(pl.String).is_in(["library_get_kernel", "host_stub"])
                            & pl.col("api").cast(pl.String).is_in(["cuLibraryGetKernel", "__cudaGetKernel"])
                            ).collect().height == 0
