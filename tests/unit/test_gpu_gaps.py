"""The GPU gap tools (launch_gaps, gpu_idle) order each group's kernels with
numpy: exactly what the Polars sort by (keys, start) and window gave, which
stays for times too far apart for numpy's shifted ranges."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pasta_trace.tools import gpu


def _kernels(seed: int, n: int, spread: int) -> pl.DataFrame:
    """Kernels of 3 processes on 4 streams (one null) and 2 GPUs: starts with
    ties, overlapping and nested executions, rows in no particular order."""
    rng = np.random.default_rng(seed)
    start = 10**12 + rng.integers(0, spread, n)
    return pl.DataFrame({
        "pid": pl.Series(rng.integers(1, 4, n), dtype=pl.UInt32),
        "stream": pl.Series([None if s == 0 else int(s) for s in rng.integers(0, 4, n)], dtype=pl.UInt64),
        "device": pl.Series(rng.integers(0, 2, n), dtype=pl.UInt32),
        "ts_ns": pl.Series(start - rng.integers(0, 50, n), dtype=pl.Int64),
        "gpu_start_ns": pl.Series(start, dtype=pl.Int64),
        "gpu_end_ns": pl.Series(start + rng.integers(0, 40, n), dtype=pl.Int64),
    })


@pytest.mark.parametrize("keys", [["pid", "stream"], ["device"]])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_numpy_gaps_are_the_sorted_gaps(keys: list[str], seed: int) -> None:
    timed = _kernels(seed, 5000, 100_000).lazy()
    want = gpu._sorted_gaps(timed, keys).sort(keys).collect()
    got = gpu._gaps(timed, keys).sort(keys).collect()
    assert_frame_equal(got, want)
    assert want["idle_ns"].sum() > 0 and (want["busy_ns"] < want["span_ns"]).any()


def test_one_kernel_and_no_kernel() -> None:
    one = _kernels(1, 1, 10)
    assert gpu._gap_column(one, ["pid", "stream"]).to_list() == [0]
    assert gpu._gap_column(one.clear(), ["pid", "stream"]).to_list() == []


def test_times_too_far_apart_for_the_shifted_ranges_take_the_sort() -> None:
    rows = pl.DataFrame({"device": pl.Series([0, 0, 1, 1], dtype=pl.UInt32),
                         "ts_ns": pl.Series([0, 0, 0, 0], dtype=pl.Int64),
                         "gpu_start_ns": pl.Series([-(2**62), 2**62, 0, 10], dtype=pl.Int64),
                         "gpu_end_ns": pl.Series([-(2**62) + 5, 2**62 + 5, 4, 12], dtype=pl.Int64)})
    assert gpu._gap_column(rows, ["device"]) is None
    got = gpu._gaps(rows.lazy(), ["device"]).sort("device").collect()
    assert got.select("device", "kernels", "idle_ns", "max_gap_ns").rows() == [
        (0, 2, 2**63 - 5, 2**63 - 5), (1, 2, 6, 6)]
