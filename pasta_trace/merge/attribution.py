"""Device addresses -> the allocation instance live there at that time.

The big side (pages, access samples: up to 1e8+ rows) is never sorted and
never joined to anything but small tables (reference/polars-merge.md §3.1,
§3.3):

1. The address space of each process is cut into *segments* at every
   allocation boundary, so each address falls in exactly one segment and each
   segment is covered by a few allocation instances over time (address reuse).
2. Each row finds its segment by a numpy `searchsorted` over the segment
   starts, keyed ``pid_index << 48 | address`` (user-space addresses fit in
   48 bits), inside an elementwise `map_batches`: it streams and runs on every
   core, and needs no sort and no `join_asof(by=)`.
3. Rows are aggregated to (pid, launch, segment, ...) *before* any time
   check; only then do the few distinct (pid, launch, segment) find the
   instance live at the launch's host time (a small equi-join + filter).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from ..read import Capture

ADDRESS_BITS = 48


@dataclass(frozen=True)
class Segments:
    """Every process's address space cut at every allocation start and end.

    The segments tile each process's span from its lowest boundary on; the
    last one of each process runs to the next process's first (a gap).  Gaps
    are segments that no instance covers, so the lookup is a bare
    searchsorted: no end check, no mask."""

    pids: np.ndarray  # sorted distinct pids
    kstart: np.ndarray  # sorted segment starts, keyed pid_index << 48 | address (uint64)
    cover: pl.DataFrame  # seg_id, alloc_id, alloc_ts_ns, free_ts_ns: instances covering each segment

    def lookup(self, key: np.ndarray) -> np.ndarray:
        """Segment index of each key; -1 below the first segment."""
        return np.searchsorted(self.kstart, key, side="right").astype(np.int64) - 1

    def key(self, pid: pl.Expr, addr: pl.Expr) -> pl.Expr:
        """pid_index << 48 | address as a native Polars expression (UInt64;
        2^64-1 for a pid without allocations or an address beyond 48 bits,
        which lands in the last gap).  A when/then chain, not replace_strict:
        that one buffers the whole column in the streaming engine
        (polars-merge.md §3.3)."""
        idx: pl.Expr = pl.lit(None, pl.UInt64)
        for i, p in enumerate(self.pids.tolist()):
            idx = pl.when(pid == p).then(pl.lit(i << ADDRESS_BITS, pl.UInt64)).otherwise(idx)
        return pl.when(addr < (1 << ADDRESS_BITS)).then(idx + addr).fill_null(np.iinfo(np.uint64).max)

    def expr(self, pid: str | pl.Expr, addr: pl.Expr) -> pl.Expr:
        """Polars expression: segment id (Int64).  An elementwise numpy UDF:
        it streams and runs on every core (np.searchsorted releases the GIL)."""
        if self.kstart.size == 0:
            return pl.lit(-1, pl.Int64)
        key = self.key(pl.col(pid) if isinstance(pid, str) else pid, addr)
        return key.map_batches(lambda s: pl.Series(self.lookup(s.to_numpy())), return_dtype=pl.Int64,
                               is_elementwise=True)


def segments(allocs: pl.DataFrame) -> Segments:
    """Cut each process's address space at every allocation start and end."""
    a = allocs.filter(pl.col("size") > 0).select(
        "alloc_id", "pid", "base", (pl.col("base") + pl.col("size")).alias("end"), "alloc_ts_ns", "free_ts_ns"
    )
    pids = np.sort(a["pid"].unique().to_numpy())
    shift = np.uint64(ADDRESS_BITS)
    pidx = np.searchsorted(pids, a["pid"].to_numpy()).astype(np.uint64) << shift
    kbase = pidx | a["base"].to_numpy().astype(np.uint64)
    kend = pidx | a["end"].to_numpy().astype(np.uint64)
    kstart = np.unique(np.concatenate([kbase, kend]))
    # an instance covers the contiguous run of segments from its base to its end
    first, stop = np.searchsorted(kstart, kbase), np.searchsorted(kstart, kend)
    cover = (
        a.select("alloc_id", "alloc_ts_ns", "free_ts_ns")
        .with_columns(pl.int_ranges(pl.Series(first, dtype=pl.Int64), pl.Series(stop, dtype=pl.Int64))
                      .alias("seg_id"))
        .explode("seg_id")
        .drop_nulls("seg_id")
        .select("seg_id", "alloc_id", "alloc_ts_ns", "free_ts_ns")
    )
    return Segments(pids, kstart, cover)


def resolve(keys: pl.LazyFrame, segs: Segments) -> pl.LazyFrame:
    """For distinct (pid, launch_id, seg_id, t): the instance covering the
    segment that was live at host time t (alloc <= t < free).  Where the
    launch time is unknown (t null), the latest instance covering it."""
    live = (pl.col("alloc_ts_ns") <= pl.col("t")) & (
        pl.col("free_ts_ns").is_null() | (pl.col("t") < pl.col("free_ts_ns"))
    )
    return (
        keys.join(segs.cover.lazy(), on="seg_id", how="inner")
        .filter(live | pl.col("t").is_null())
        .sort("alloc_ts_ns")
        .group_by(["pid", "launch_id", "seg_id"])
        .agg(pl.col("alloc_id").last())
    )
