"""Host launches numbered within their process (launch_seq), for captures of
millions of launches.

Each launch's number is its rank by (pid, ts_ns, tid).  It is worked out once
per capture on a narrow table (launch_order) and put onto the wide launch rows
by a gather per batch (by_row), because on millions of rows each reordering
of the wide rows, and each multi-key Polars sort, costs seconds:
launches are stored roughly in time order, so a stable numpy argsort by time
(timsort: linear on sorted runs) then by process (a radix sort of 16-bit
ranks) orders them in a few passes.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import schema
from ..read import Capture
from .graphs import graph_kernel_launches, precaptured_launches


def launch_events(cap: Capture) -> pl.LazyFrame:
    """The capture's launch events, `_row` numbering them in scan order;
    without the columns only tensor events carry (their `device` is not the
    GPU index the device data calls `device`).  Then one row per kernel each
    CUDA graph launch ran (graphs.py: via_graph true, graph_exec its exec);
    captured launches (kind `captured`) ran only there and are not rows."""
    launches = cap.events.filter(pl.col("kind") == "launch").drop(*schema.TENSOR_PAYLOAD.values()).with_columns(
        pl.lit(False).alias("via_graph"), pl.lit(None, pl.UInt64).alias("graph_exec"))
    pre = precaptured_launches(cap)
    if pre.height:  # made under a capture that began before the trace: recorded, not run
        launches = launches.join(pre.lazy(), on=["pid", "stream", "ts_ns"], how="anti", maintain_order="left")
    key = ("graph_kernel_launches",)
    if key not in cap.cache:
        cap.cache[key] = graph_kernel_launches(cap, launches.collect_schema())
    graph = cap.cache[key]
    if graph.height:
        launches = pl.concat([launches, graph.lazy()], how="vertical")
    return launches.with_row_index("_row")


def launch_order(cap: Capture) -> pl.DataFrame:
    """_row, pid, tid, ts_ns, func, stack_id and launch_seq (0-based order
    within the process, by time then thread) of every host launch, sorted by
    (pid, ts_ns, tid); launches alike in all three stay in scan order.
    Computed once per capture."""
    key = ("launch_order",)
    if key not in cap.cache:
        df = launch_events(cap).select("_row", "pid", "tid", "ts_ns", "func", "stack_id").collect()
        perm = _pid_time_order(df)
        if perm is None:
            df = df.sort(["pid", "ts_ns", "tid", "_row"])
        else:
            df = df[perm]
        cap.cache[key] = df.with_columns(_seq_within(df["pid"].to_numpy()).alias("launch_seq"))
    return cap.cache[key]


def run_starts(pids: np.ndarray) -> np.ndarray:
    """The first index of each run of equal values of `pids`."""
    return np.flatnonzero(np.r_[True, pids[1:] != pids[:-1]]) if pids.size else np.empty(0, np.int64)


def _seq_within(pids: np.ndarray) -> pl.Series:
    """0, 1, 2, ... within each run of equal values of `pids` (sorted by
    process): a subtraction, where a window over millions of rows hashes."""
    starts = run_starts(pids)
    first = np.repeat(starts, np.diff(np.r_[starts, pids.size]))
    return pl.Series("launch_seq", np.arange(pids.size, dtype=np.int64) - first, dtype=pl.Int64)


def order_position(order: pl.DataFrame, pid: pl.Expr | pl.Series,
                   launch_seq: pl.Expr | pl.Series) -> pl.Expr | pl.Series:
    """The row of launch_order of the launch (pid, launch_seq), Int64, null
    where there is none: launch_order holds each process's launches in
    launch_seq order, so it is the first row of the process plus launch_seq,
    found without a join of millions of rows on (pid, launch_seq)."""
    pids = order["pid"].to_numpy()
    first = run_starts(pids)
    return pid.replace_strict(pl.Series(pids[first], dtype=order["pid"].dtype), pl.Series(first, dtype=pl.Int64),
                              default=None, return_dtype=pl.Int64) + launch_seq


def _pid_time_order(df: pl.DataFrame) -> np.ndarray | None:
    """The permutation sorting `df` by (pid, ts_ns, tid), stable; None where
    it cannot be found this way (nulls, more than 2^16 processes)."""
    if df["pid"].null_count() or df["ts_ns"].null_count() or df["tid"].null_count():
        return None
    pids = df["pid"].unique().sort().to_numpy()
    if pids.size > 1 << 16:
        return None
    ts = df["ts_ns"].to_numpy()
    by_time = np.argsort(ts, kind="stable")
    rank = np.searchsorted(pids, df["pid"].to_numpy()[by_time]).astype(np.uint16)
    perm = by_time[np.argsort(rank, kind="stable")]
    t, p = ts[perm], df["pid"].to_numpy()[perm]
    tied = (t[1:] == t[:-1]) & (p[1:] == p[:-1])
    if np.any(tied):
        # launches of one process in the same ns (a few in millions): only those rows
        # are sorted again, by thread within each run of them
        at = np.flatnonzero(np.r_[tied, False] | np.r_[False, tied])
        run = np.cumsum(~np.r_[False, tied][at]).astype(np.int64)  # a new run where not tied to the row above
        tid = df["tid"].to_numpy()[perm[at]].astype(np.int64)
        perm[at] = perm[at][np.argsort((run << 32) | tid, kind="stable")]
    return perm
def host_launches(cap: Capture) -> pl.LazyFrame:
    """Host launch events with launch_seq (see launch_order), in scan order."""
    order = launch_order(cap)
    return launch_events(cap).with_columns(by_row(order, order["launch_seq"]).alias("launch_seq")).drop("_row")


def by_row(order: pl.DataFrame, values: pl.Series) -> pl.Expr:
    """`values` (one per row of `order`, which has `_row`) as a column of
    launch_events: put in place by `_row`, a gather per batch rather than a
    join of millions of rows."""
    at = np.empty(order.height, dtype=np.int64)
    at[order["_row"].to_numpy()] = np.arange(order.height)
    return pl.col("_row").map_batches(lambda r: values.gather(at[r.to_numpy()]), return_dtype=values.dtype,
                                      is_elementwise=True)


def time_rank(order: pl.DataFrame) -> pl.Series:
    """Per row of launch_order: its position in (ts_ns, pid, launch_seq)
    order.  launch_order is in (pid, launch_seq) order, so a stable sort by
    time alone gives it."""
    if order["ts_ns"].null_count():
        perm = order.with_row_index("_i").sort(["ts_ns", "pid", "launch_seq"])["_i"].to_numpy()
    else:
        perm = np.argsort(order["ts_ns"].to_numpy(), kind="stable")
    rank = np.empty(order.height, dtype=np.uint32)
    rank[perm] = np.arange(order.height, dtype=np.uint32)
    return pl.Series("_rank", rank)
