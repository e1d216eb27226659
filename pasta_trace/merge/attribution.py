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
    pids: np.ndarray  # sorted distinct pids (uint64)
    kstart: np.ndarray  # sorted segment keys pid_index << 48 | start (uint64)
    kend: np.ndarray  # exclusive end key of each segment
    cover: pl.DataFrame  # seg_id, alloc_id, pid, alloc_ts_ns, free_ts_ns: instances covering each segment

    def lookup(self, pid: np.ndarray, addr: np.ndarray) -> np.ndarray:
        """Segment index of each (pid, address), -1 where none."""
        if self.kstart.size == 0:
            return np.full(addr.shape, -1, dtype=np.int64)
        pi = np.searchsorted(self.pids, pid)
        pi_c = np.minimum(pi, self.pids.size - 1)
        known = (self.pids[pi_c] == pid) & (addr < (1 << ADDRESS_BITS))
        key = (pi_c.astype(np.uint64) << np.uint64(ADDRESS_BITS)) | addr
        seg = np.searchsorted(self.kstart, key, side="right").astype(np.int64) - 1
        seg_c = np.maximum(seg, 0)
        inside = known & (seg >= 0) & (key < self.kend[seg_c])
        return np.where(inside, seg, -1)

    def expr(self, pid: str | pl.Expr, addr: pl.Expr) -> pl.Expr:
        """Polars expression: segment id (Int64, null where none)."""

        def f(s: list[pl.Series]) -> pl.Series:
            p = s[0].to_numpy().astype(np.uint64, copy=False)
            a = s[1].to_numpy().astype(np.uint64, copy=False)
            return pl.Series(self.lookup(p, a))

        seg = pl.map_batches([pl.col(pid) if isinstance(pid, str) else pid, addr], f,
                             return_dtype=pl.Int64, is_elementwise=True)
        return pl.when(seg >= 0).then(seg)


def segments(allocs: pl.DataFrame) -> Segments:
    """Cut each process's address space at every allocation start and end."""
    a = allocs.filter(pl.col("size") > 0).select(
        "alloc_id", "pid", "base", (pl.col("base") + pl.col("size")).alias("end"), "alloc_ts_ns", "free_ts_ns"
    )
    pids = np.sort(a["pid"].unique().to_numpy().astype(np.uint64))
    bounds = (
        pl.concat([a.select("pid", pl.col("base").alias("b")), a.select("pid", pl.col("end").alias("b"))])
        .unique().sort(["pid", "b"])
        .with_columns(pl.col("b").shift(-1).over("pid").alias("e"))
        .drop_nulls("e")
        .with_row_index("seg_id")
    )
    pidx = np.searchsorted(pids, bounds["pid"].to_numpy().astype(np.uint64)).astype(np.uint64)
    shift = np.uint64(ADDRESS_BITS)
    kstart = (pidx << shift) | bounds["b"].to_numpy().astype(np.uint64)
    kend = (pidx << shift) | bounds["e"].to_numpy().astype(np.uint64)
    # segments are cut at every boundary, so an instance covers the contiguous
    # run of segments from the one starting at its base to the one ending at its end
    apid = np.searchsorted(pids, a["pid"].to_numpy().astype(np.uint64)).astype(np.uint64)
    first = np.searchsorted(kstart, (apid << shift) | a["base"].to_numpy().astype(np.uint64))
    stop = np.searchsorted(kstart, (apid << shift) | a["end"].to_numpy().astype(np.uint64))
    cover = (
        a.select("alloc_id", "alloc_ts_ns", "free_ts_ns")
        .with_columns(pl.int_ranges(pl.Series(first, dtype=pl.Int64), pl.Series(stop, dtype=pl.Int64))
                      .alias("seg_id"))
        .explode("seg_id")
        .drop_nulls("seg_id")
        .select("seg_id", "alloc_id", "alloc_ts_ns", "free_ts_ns")
    )
    return Segments(pids, kstart, kend, cover)


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
