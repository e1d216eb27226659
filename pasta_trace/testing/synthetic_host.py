"""Copies a synthetic capture can add beside its launches, allocations and
syncs (pasta_trace.testing.synthetic): some of the same host range again, some in a
storm of small copies.  Drawn from their own random stream, so captures
without them are unchanged."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import schema

#: host buffers the copies read and write: few, so ranges repeat
HOST_BUFFERS = 8
#: small copies in the one storm a capture with copies holds
STORM_COPIES = 40


def copies(n_copies: int, pids: np.ndarray, span_ns: int, t0: int, rng: np.random.Generator) -> pl.DataFrame:
    """Copies (h2d and d2h of HOST_BUFFERS host buffers, of a few fixed sizes,
    so the same range is copied again) and one storm of STORM_COPIES small
    copies, as schema.EVENTS_SCHEMA rows."""
    pid = pids[rng.integers(0, pids.size, n_copies)]
    base = {"ts_ns": t0 + rng.integers(span_ns // 100, span_ns, n_copies), "pid": pid, "tid": pid + 1,
            "dur_ns": rng.integers(1_000, 500_000, n_copies), "ret": np.zeros(n_copies, np.int32)}
    h2d = rng.random(n_copies) < 0.6
    host = (0x5600_0000_0000 + rng.integers(0, HOST_BUFFERS, n_copies) * 0x10_0000).astype(np.uint64)
    dev = (0x7F00_0000_0000 + rng.integers(0, HOST_BUFFERS, n_copies) * 0x40_0000).astype(np.uint64)
    every = pl.DataFrame(base).with_columns(
        api=pl.Series(np.where(h2d, "cuMemcpyHtoD_v2", "cuMemcpyDtoH_v2")), kind=pl.lit("memcpy"),
        copy_kind=pl.Series(np.where(h2d, "h2d", "d2h")),
        src=pl.Series(np.where(h2d, host, dev)), dst=pl.Series(np.where(h2d, dev, host)),
        size=pl.Series(rng.choice([4096, 65536, 1 << 20], n_copies).astype(np.uint64)),
    )
    # one storm: STORM_COPIES small h2d copies 10 µs apart on one thread, mid-capture
    storm = pl.DataFrame({
        "ts_ns": t0 + span_ns // 2 + 10_000 * np.arange(STORM_COPIES), "pid": np.full(STORM_COPIES, pids[0]),
        "tid": np.full(STORM_COPIES, pids[0] + 1), "dur_ns": np.full(STORM_COPIES, 2_000),
        "ret": np.zeros(STORM_COPIES, np.int32)}).with_columns(
        api=pl.lit("cuMemcpyHtoD_v2"), kind=pl.lit("memcpy"), copy_kind=pl.lit("h2d"),
        src=pl.lit(0x5700_0000_0000, pl.UInt64), dst=pl.lit(0x7F10_0000_0000, pl.UInt64), size=pl.lit(512, pl.UInt64))
    ev = pl.concat([every, storm], how="diagonal_relaxed").with_columns(comm=pl.lit("worker"))
    return ev.select([pl.col(c).cast(t) if c in ev.columns else pl.lit(None, t).alias(c)
                      for c, t in schema.EVENTS_SCHEMA.items()])
