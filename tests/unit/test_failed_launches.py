"""A launch call that returned an error ran no kernel: the kernels tools and
the process overview count it apart from the launches, the merged kernel rows
carry its code, and the API-errors tool names it."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pasta_trace import merge
from pasta_trace.read import open_capture
from pasta_trace.tools import REGISTRY
from test_tools_capture import write_capture

CUDA_ERROR_INVALID_VALUE = 1
LAUNCH = {"stream": 0x5, "grid": (2, 1, 1), "block": (128, 1, 1)}
ROWS = [  # axpy: 3 launch calls, 1 failed; reduce: its only launch failed
    (1000, 20, 100, 101, "cuLaunchKernel", "launch", {**LAUNCH, "func": 0xF1}),
    (2000, 20, 100, 101, "cuLaunchKernel", "launch", {**LAUNCH, "func": 0xF1, "ret": CUDA_ERROR_INVALID_VALUE}),
    (3000, 20, 100, 101, "cuLaunchKernel", "launch", {**LAUNCH, "func": 0xF1}),
    (4000, 20, 100, 101, "cuLaunchKernel", "launch", {**LAUNCH, "func": 0xF2, "ret": CUDA_ERROR_INVALID_VALUE}),
]


def _cap(tmp_path: Path):
    return open_capture(write_capture(tmp_path / "c", rows=ROWS,
                                      names=[(100, 0xF1, "axpy"), (100, 0xF2, "reduce")],
                                      processes=[(100, "train", "python train.py")]))


def test_kernels_count_failed_launches_apart(tmp_path: Path) -> None:
    cap = _cap(tmp_path)
    df = REGISTRY["kernels"].compute(cap)
    assert df.select("name", "launches", "failed_launches").rows() == [("axpy", 2, 1), ("reduce", 0, 1)]
    sites = REGISTRY["kernel_call_sites"].compute(cap)
    assert sites.select("name", "launches", "failed_launches").rows() == [("axpy", 2, 1), ("reduce", 0, 1)]


def test_merged_kernel_rows_carry_the_return_code(tmp_path: Path) -> None:
    rows = merge.kernel_executions(_cap(tmp_path)).select("name", "ret").collect().rows()
    assert rows == [("axpy", 0), ("axpy", CUDA_ERROR_INVALID_VALUE), ("axpy", 0), ("reduce", CUDA_ERROR_INVALID_VALUE)]


def test_overview_and_api_errors(tmp_path: Path) -> None:
    cap = _cap(tmp_path)
    proc = REGISTRY["processes"].compute(cap)
    assert proc.select("launches", "failed_calls", "kernels").rows() == [(2, 2, 2)]
    errors = REGISTRY["api_errors"].compute(cap).filter(pl.col("api") == "cuLaunchKernel")
    assert errors.select("error", "failed", "calls").rows() == [("CUDA_ERROR_INVALID_VALUE", 2, 4)]


def test_exported_trace_draws_only_the_kernels_that_ran(tmp_path: Path) -> None:
    """Perfetto and Chrome JSON are drawn from one model: a kernel slice and a
    flow from its launch call for each launch that did not fail; the failed
    call stays an API slice with its code."""
    from pasta_trace.export import trace_model

    cap = _cap(tmp_path)
    merge.write_timeline(cap, tmp_path / "timeline")
    # from the calls (a host-only capture) and from a merged timeline's kernel rows
    for model in (trace_model.build(cap), trace_model.build(merge.load(tmp_path / "timeline"))):
        assert model.kernels.select("name", "corr").rows() == [("axpy", 1), ("axpy", 2)]
        launches = model.api.filter(pl.col("kind") == "launch").sort("ts_ns")
        assert launches.select("ret", "corr").rows() == [(0, 1), (CUDA_ERROR_INVALID_VALUE, None), (0, 2),
                                                          (CUDA_ERROR_INVALID_VALUE, None)]
