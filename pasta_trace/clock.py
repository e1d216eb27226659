"""Map the GPU's %globaltimer onto the host's CLOCK_MONOTONIC.

A sample brackets one GPU timer read between two host reads (CLOCK_SYNC
records), or pins a GPU time to a host time exactly (CUPTI kernel records in
CLOCK_MONOTONIC against the same kernel's %globaltimer: ``host_before ==
host_after``).  The fit is ``mono = a * gpu + b``.

Both clocks run near 1.8e18 ns, where float64 steps by 256 ns, so everything is
computed on int64 deltas from the first kept sample and only the small
correction ``(a - 1) * dx + b`` ever touches floating point.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

#: Samples are grouped into windows of this much GPU time and only the
#: tightest bracket of each window is kept: wide brackets (the host thread was
#: preempted between its two reads) carry microseconds of noise.
WINDOW_NS = 1_000_000_000


@dataclass(frozen=True)
class ClockMap:
    """``mono = mono0 + dx + round(slope_m1 * dx + offset)`` with ``dx = gpu - gpu0``."""

    gpu0: int
    mono0: int
    slope_m1: float  # a - 1 (drift; 50 ppm is 5e-5)
    offset: float  # ns, at gpu0
    samples: int  # samples the fit used
    max_half_width: int  # ns: largest half bracket among them (the sample's own uncertainty)

    def to_host(self, gpu: pl.Expr) -> pl.Expr:
        """Polars expression: GPU ns (any integer type) -> CLOCK_MONOTONIC ns (Int64)."""
        dx = gpu.cast(pl.Int64) - self.gpu0
        corr = (dx.cast(pl.Float64) * self.slope_m1 + self.offset).round().cast(pl.Int64)
        return dx + corr + self.mono0

    def to_host_np(self, gpu: np.ndarray) -> np.ndarray:
        dx = gpu.astype(np.int64) - self.gpu0
        return dx + np.rint(dx * self.slope_m1 + self.offset).astype(np.int64) + self.mono0


def _tightest_per_window(gpu: np.ndarray, width: np.ndarray, window_ns: int) -> np.ndarray:
    """Indices of the narrowest bracket in each window of GPU time."""
    win = (gpu - gpu.min()) // window_ns
    order = np.lexsort((width, win))  # by window, then width
    first = np.ones(order.size, dtype=bool)
    first[1:] = win[order][1:] != win[order][:-1]
    return order[first]


def fit(host_before: np.ndarray, gpu: np.ndarray, host_after: np.ndarray,
        window_ns: int = WINDOW_NS) -> ClockMap | None:
    """Fit the map from bracketed samples; ``None`` without any sample.

    One sample (or all in one window) gives an offset with slope 1."""
    hb = np.asarray(host_before, dtype=np.int64)
    g = np.asarray(gpu, dtype=np.int64)
    ha = np.asarray(host_after, dtype=np.int64)
    ok = ha >= hb
    hb, g, ha = hb[ok], g[ok], ha[ok]
    if g.size == 0:
        return None
    width = ha - hb
    keep = _tightest_per_window(g, width, window_ns)
    keep = keep[np.argsort(g[keep], kind="stable")]
    hb, g, width = hb[keep], g[keep], width[keep]
    gpu0 = int(g[0])
    # the midpoint, kept in integers until it is a small delta
    mid = hb + width // 2
    mono0 = int(mid[0])
    dx = (g - gpu0).astype(np.float64)
    dy = (mid - mono0 - (g - gpu0)).astype(np.float64)  # mono - gpu, relative: ns-scale, drift-sized
    if g.size == 1 or dx[-1] == dx[0]:
        slope_m1, offset = 0.0, float(np.median(dy))
    else:
        # narrower brackets locate the GPU read better: weight by 1 / half-width^2
        w = 1.0 / np.maximum(width.astype(np.float64) / 2.0, 1.0) ** 2
        sw = w.sum()
        mx, my = (w * dx).sum() / sw, (w * dy).sum() / sw
        cov = (w * (dx - mx) * (dy - my)).sum()
        var = (w * (dx - mx) ** 2).sum()
        slope_m1 = float(cov / var)
        offset = float(my - slope_m1 * mx)
    return ClockMap(gpu0, mono0, slope_m1, offset, int(g.size), int(width.max() // 2))


def fit_frame(samples: pl.DataFrame, keys: list[str], window_ns: int = WINDOW_NS) -> pl.DataFrame:
    """One map per group of `keys` (e.g. pid, device) from a frame with columns
    host_mono_before, gpu_globaltimer, host_mono_after.  Returns the keys plus
    gpu0, mono0, slope_m1, offset, samples: join it and apply `to_host_expr`."""
    out_schema = {**{k: samples.schema[k] for k in keys}, "gpu0": pl.Int64, "mono0": pl.Int64,
                  "slope_m1": pl.Float64, "offset": pl.Float64, "samples": pl.UInt32}
    rows = []
    # one numpy fit per (process, device): a handful of groups, not rows
    for key, part in samples.group_by(keys, maintain_order=True):
        m = fit(part["host_mono_before"].to_numpy(), part["gpu_globaltimer"].to_numpy(),
                part["host_mono_after"].to_numpy(), window_ns)
        if m is not None:
            rows.append((*key, m.gpu0, m.mono0, m.slope_m1, m.offset, m.samples))
    return pl.DataFrame(rows, schema=out_schema, orient="row")


def to_host_expr(gpu: pl.Expr) -> pl.Expr:
    """Like ClockMap.to_host, reading the map from columns gpu0, mono0,
    slope_m1, offset (a frame joined with `fit_frame`'s output).  Null where
    no map joined."""
    dx = gpu.cast(pl.Int64) - pl.col("gpu0")
    corr = (dx.cast(pl.Float64) * pl.col("slope_m1") + pl.col("offset")).round().cast(pl.Int64)
    return dx + corr + pl.col("mono0")
