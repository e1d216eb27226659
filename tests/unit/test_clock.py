"""GPU %globaltimer -> CLOCK_MONOTONIC fit (pasta_trace.clock)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pasta_trace import clock

MONO0 = 5_000_000_000_000
GPU0 = 1_764_000_000_000_000_000
SPAN = 600 * 10**9  # 10 minutes


def _gpu(mono: np.ndarray, ppm: float, offset_ns: int) -> np.ndarray:
    d = mono - MONO0
    return GPU0 + offset_ns + d + np.rint(d * ppm * 1e-6).astype(np.int64)


def _samples(ppm: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A CLOCK_SYNC round every second, 16 brackets each: most 0.5-3 us wide,
    one in ten preempted (20-500 us); the GPU read lands anywhere inside the
    bracket and the timer ticks in 32 ns steps."""
    rng = np.random.default_rng(seed)
    t = MONO0 + np.repeat(np.arange(0, SPAN, 10**9), 16) + rng.integers(0, 10**8, 600 * 16)
    width = rng.integers(500, 3_000, t.size)
    slow = rng.random(t.size) < 0.1
    width[slow] = rng.integers(20_000, 500_000, slow.sum())
    read = t + (rng.random(t.size) * width).astype(np.int64)
    g = _gpu(read, ppm, 123_456_789) // 32 * 32
    return t, g, t + width


@pytest.mark.parametrize("ppm,seed", [(50.0, 1), (-50.0, 2), (0.0, 3), (13.7, 4)])
def test_fit_error_within_1us_over_10_minutes(ppm: float, seed: int) -> None:
    before, g, after = _samples(ppm, seed)
    m = clock.fit(before, g, after)
    assert m is not None
    assert m.samples == 600  # the tightest bracket of each 1 s window
    # a GPU timer fast by ppm maps back with slope 1 / (1 + ppm)
    assert abs(m.slope_m1 - (1 / (1 + ppm * 1e-6) - 1)) < 1e-9
    # the error of a line against a line is largest at an end of the span: a
    # 1 ms grid that includes both ends checks "everywhere"
    truth_mono = MONO0 + np.arange(0, SPAN + 1, 1_000_000, dtype=np.int64)
    fitted = m.to_host_np(_gpu(truth_mono, ppm, 123_456_789))
    err = np.abs(fitted - truth_mono)
    assert err.max() <= 1_000, f"max error {err.max()} ns"


def test_float64_on_absolute_values_would_not_do() -> None:
    # why the fit runs on int64 deltas: 1.76e18 ns in float64 steps by 256 ns
    assert float(GPU0 + 100) == float(GPU0)
    assert np.spacing(float(GPU0)) == 256.0


def test_polars_expression_equals_numpy() -> None:
    before, g, after = _samples(50.0, 7)
    m = clock.fit(before, g, after)
    gpu = _gpu(MONO0 + np.arange(0, SPAN, 997_003_001, dtype=np.int64), 50.0, 123_456_789).astype(np.uint64)
    df = pl.DataFrame({"g": gpu}).select(m.to_host(pl.col("g")).alias("mono"))
    assert df["mono"].dtype == pl.Int64
    assert df["mono"].to_list() == m.to_host_np(gpu).tolist()


def test_one_sample_gives_an_offset_and_none_gives_none() -> None:
    m = clock.fit(np.array([MONO0]), np.array([GPU0]), np.array([MONO0 + 2_000]))
    assert (m.slope_m1, m.offset, m.samples) == (0.0, 0.0, 1)
    assert m.mono0 == MONO0 + 1_000 and m.gpu0 == GPU0
    assert m.to_host_np(np.array([GPU0 + 5_000])).tolist() == [MONO0 + 6_000]
    assert clock.fit(np.array([], np.int64), np.array([], np.int64), np.array([], np.int64)) is None
    # a bracket whose host reads went backwards is not a sample
    assert clock.fit(np.array([MONO0]), np.array([GPU0]), np.array([MONO0 - 1])) is None


def test_fit_frame_per_process_and_to_host_expr() -> None:
    b1, g1, a1 = _samples(50.0, 11)
    b2, g2, a2 = _samples(-20.0, 12)
    samples = pl.DataFrame({
        "pid": np.r_[np.full(b1.size, 1, np.uint32), np.full(b2.size, 2, np.uint32)],
        "device": np.zeros(b1.size + b2.size, np.uint32),
        "host_mono_before": np.r_[b1, b2].astype(np.uint64), "gpu_globaltimer": np.r_[g1, g2].astype(np.uint64),
        "host_mono_after": np.r_[a1, a2].astype(np.uint64),
    })
    maps = clock.fit_frame(samples, ["pid", "device"])
    assert maps["pid"].to_list() == [1, 2]
    assert maps["samples"].to_list() == [600, 600]
    t = MONO0 + 300 * 10**9
    probe = pl.DataFrame({"pid": np.array([1, 2, 3], np.uint32), "device": np.zeros(3, np.uint32),
                          "g": np.array([_gpu(np.array([t]), 50.0, 123_456_789)[0],
                                         _gpu(np.array([t]), -20.0, 123_456_789)[0], GPU0], np.uint64)})
    out = probe.join(maps, on=["pid", "device"], how="left").sort("pid").select(
        clock.to_host_expr(pl.col("g")).alias("mono"))["mono"].to_list()
    assert abs(out[0] - t) <= 1_000 and abs(out[1] - t) <= 1_000
    assert out[2] is None  # no map for pid 3: null, not a guess
