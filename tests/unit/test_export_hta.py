"""The Chrome export read by Holistic Trace Analysis (HTA), the trace-analysis
library made for PyTorch profiler traces: its kernel and temporal breakdowns
of a synthetic capture with device timing equal the ones computed here from
the merge's kernel executions, exactly.

HTA reads ns-precision traces by rounding each event's start up and its end
down to whole µs (hta.common.trace_parser.round_down_time_stamps); the
expected values apply the same rounding."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import merge
from pasta_trace.testing import synthetic
from pasta_trace.cli import main
from pasta_trace.read import open_capture

trace_analysis = pytest.importorskip(
    "hta.trace_analysis", reason="HolisticTraceAnalysis is not installed (pip install -e .[dev])")

#: HTA 0.5 calls pandas APIs that pandas 3 deprecates; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore:.*inplace keyword.*")

SPEC = synthetic.Spec(pids=1, launches=300, allocations=8, accesses=100, kernels=6, threads=2, seed=3)


def _kernels_us(cap_path: Path) -> pl.DataFrame:
    """name, ts, end in whole µs as HTA rounds them (start up, end down)."""
    ex = merge.kernel_executions(open_capture(cap_path)).collect()
    assert ex["gpu_start_ns"].null_count() == 0 and ex.height == SPEC.launches  # every launch timed
    return ex.select(
        "name",
        ts=pl.col("gpu_start_ns").map_elements(lambda ns: math.ceil(ns / 1000), return_dtype=pl.Int64),
        end=pl.col("gpu_end_ns").map_elements(lambda ns: math.floor(ns / 1000), return_dtype=pl.Int64),
    ).with_columns(dur=pl.col("end") - pl.col("ts"))


def _union_us(k: pl.DataFrame) -> int:
    """Total length of the union of the [ts, end] intervals."""
    total, cur_start, cur_end = 0, None, None
    for ts, end in k.sort("ts").select("ts", "end").iter_rows():  # a few hundred intervals
        if cur_end is None or ts > cur_end:
            total += 0 if cur_end is None else cur_end - cur_start
            cur_start, cur_end = ts, end
        else:
            cur_end = max(cur_end, end)
    return total + (cur_end - cur_start)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("hta")
    cap = d / "cap"
    synthetic.write_capture(cap, SPEC)
    (d / "traces").mkdir()
    assert main(["export", str(cap), "--format", "chrome", "-o", str(d / "traces" / "rank0.json")]) == 0
    return trace_analysis.TraceAnalysis(trace_dir=str(d / "traces")), _kernels_us(cap)


def test_rank_from_distributed_info(analysed) -> None:
    analysis, _ = analysed
    assert list(analysis.t.traces) == [0]


def test_kernel_breakdown(analysed) -> None:
    analysis, k = analysed
    by_type, by_kernel = analysis.get_gpu_kernel_breakdown(visualize=False)
    assert [tuple(r) for r in by_type[["kernel_type", "sum", "percentage"]].itertuples(index=False)] == [
        ("COMPUTATION", k["dur"].sum(), 100.0)]
    # only kernels: the launch calls on the CPU threads are not GPU work
    want = (k.group_by("name").agg(pl.col("dur").sum().alias("sum"), pl.col("dur").max().alias("max"),
                                    pl.col("dur").min().alias("min"), pl.len().alias("n"))
            .sort("name").rows())
    got = by_kernel.sort_values("name")
    assert got[["name", "sum (us)", "max (us)", "min (us)"]].values.tolist() == [list(w[:4]) for w in want]
    assert set(got["rank"]) == {0} and set(got["kernel_type"]) == {"COMPUTATION"}
    assert k["dur"].min() > 0  # no zero-length or negative kernel reached HTA


def test_temporal_breakdown(analysed) -> None:
    analysis, k = analysed
    t = analysis.get_temporal_breakdown(visualize=False)
    span = k["end"].max() - k["ts"].min()
    busy = _union_us(k)
    assert t[["rank", "idle_time(us)", "compute_time(us)", "non_compute_time(us)", "kernel_time(us)"]].values.tolist() == [
        [0, span - busy, busy, 0, span]]
