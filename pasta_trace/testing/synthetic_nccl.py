"""NCCL calls a synthetic capture can hold (pasta_trace.testing.synthetic,
Spec.collectives): every process is one rank of one communicator, calls
ncclCommInitRank, then AllReduce after AllReduce, each launching one kernel
inside the call.  Every fifth collective (seq 2, 7, ...) rank 1 enters
LATE_NS late; the last rank never enters the last one (a hang).  Drawn from
their own random stream, so captures without them are unchanged."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import schema

COMM_HANDLE = 0x5600_00C0_0000
COMM_ID = 0x5EED_0000_0000_0001
KERNEL = 0x5555_00FF_0000  # the NCCL kernel every collective launches
LATE_NS = 2_000_000
CALL_NS = 60_000
COUNT = 1 << 20  # float32 elements per AllReduce


def calls(n: int, pids: np.ndarray, t0: int, span_ns: int, rng: np.random.Generator
          ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(events as schema.EVENTS_SCHEMA rows, the kernel launches in
    synthetic._launches' columns without launch_id, communicators.parquet rows)."""
    ranks = pids.size
    rank, seq = np.meshgrid(np.arange(ranks), np.arange(n), indexing="ij")
    rank, seq = rank.ravel(), seq.ravel()
    keep = ~((rank == ranks - 1) & (seq == n - 1))  # the last rank hangs
    rank, seq = rank[keep], seq[keep]
    step = (span_ns // 2) // max(n, 1)
    ts = t0 + span_ns // 4 + seq * step + rng.integers(0, 20_000, rank.size)
    ts = ts + np.where((rank == 1 % ranks) & (seq % 5 == 2), LATE_NS, 0)
    pid = pids[rank]
    coll = pl.DataFrame({
        "ts_ns": ts.astype(np.int64), "dur_ns": np.full(rank.size, CALL_NS, np.int64), "pid": pid, "tid": pid + 1,
        "api": "ncclAllReduce", "kind": "collective", "layer": "nccl", "ret": np.zeros(rank.size, np.int32),
        "stream": (0x7000_0000 + rank).astype(np.uint64), "communicator": np.full(rank.size, COMM_HANDLE, np.uint64),
        "seq": seq.astype(np.int64), "count": np.full(rank.size, COUNT, np.uint64), "datatype": "float32",
        "op": "sum", "size": np.full(rank.size, 4 * COUNT, np.uint64),
    })
    made_ts = t0 + 1_000_000 + np.arange(ranks) * 1_000
    init = pl.DataFrame({
        "ts_ns": made_ts.astype(np.int64), "dur_ns": np.full(ranks, 500_000, np.int64), "pid": pids, "tid": pids + 1,
        "api": "ncclCommInitRank", "kind": "comm", "layer": "nccl", "ret": np.zeros(ranks, np.int32),
        "communicator": np.full(ranks, COMM_HANDLE, np.uint64), "comm_id": np.full(ranks, COMM_ID, np.uint64),
        "rank": np.arange(ranks, dtype=np.int32), "nranks": np.full(ranks, ranks, np.int32),
    })
    ev = pl.concat([init, coll], how="diagonal_relaxed").with_columns(comm=pl.lit("worker"))
    events = ev.select([pl.col(c).cast(t) if c in ev.columns else pl.lit(None, t).alias(c)
                        for c, t in schema.EVENTS_SCHEMA.items()])
    launches = coll.select(
        (pl.col("ts_ns") + 10_000).alias("ts_ns"), "pid", pl.col("tid").cast(pl.UInt32),
        pl.lit(KERNEL, pl.UInt64).alias("func"), pl.lit(32, pl.UInt32).alias("grid_x"),
        pl.lit(256, pl.UInt32).alias("block_x"), "stream", pl.lit(5_000, pl.Int64).alias("dur_ns"))
    comms = pl.DataFrame({
        "host": "synthetic", "pid": pids, "communicator": np.full(ranks, COMM_HANDLE, np.uint64),
        "comm_id": np.full(ranks, COMM_ID, np.uint64), "rank": np.arange(ranks, dtype=np.int32),
        "nranks": np.full(ranks, ranks, np.int32), "api": "ncclCommInitRank", "ts_ns": made_ts.astype(np.int64),
        "end_ts_ns": [None] * ranks,
    }, schema=schema.COMMUNICATORS_SCHEMA)
    return events, launches, comms
