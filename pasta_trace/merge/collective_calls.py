"""NCCL calls with the communicator they were made on, across ranks.

A collective's rank and cross-rank communicator id (comm_id) come from
communicators.parquet, through the (pid, communicator handle) the call was
made on while that communicator was alive.  Rows of several processes (one
capture of many ranks, or a cluster timeline of many captures) line up by
(comm_id, seq): every rank calls a communicator's collectives in one order.
The tools count them; the cluster merge aligns clocks with them."""

from __future__ import annotations

import polars as pl

from ..read import Capture


def collective_calls(cap: Capture) -> pl.LazyFrame:
    """Collective and p2p calls with the host, comm_id, rank and nranks of
    the communicator they were made on (null where its creation was not seen).
    `api` is categorical or a string: cast it where its type matters."""
    return calls_on_communicators(cap.events, cap.communicators)


def calls_on_communicators(events: pl.LazyFrame, communicators: pl.LazyFrame) -> pl.LazyFrame:
    """collective_calls from the events (all, or some processes' whole
    histories: pasta_trace.dask_cluster runs it per partition) and communicators."""
    comms = communicators.select(
        "pid", "communicator", "host", "comm_id", "rank", "nranks",
        pl.col("ts_ns").alias("_made"), pl.col("end_ts_ns").alias("_end")).collect()
    calls = events.filter(pl.col("kind").is_in(["collective", "p2p"])).drop("comm_id", "rank", "nranks")
    alive = (pl.col("ts_ns") >= pl.col("_made")) & (pl.col("_end").is_null() | (pl.col("ts_ns") <= pl.col("_end")))
    if comms.select(pl.struct("pid", "communicator").is_unique().all()).item():
        # each handle made once (the usual case): one left join, no second pass over the calls
        joined = calls.join(comms.lazy(), on=["pid", "communicator"], how="left")
        # `api` stays categorical here: as strings, 6.4 M of them cost the grouping tools a third of their time
        return joined.with_columns(pl.when(alive).then(pl.col(c)).alias(c) for c in ("host", "comm_id", "rank", "nranks")
                                   ).drop("_made", "_end")
    # a handle reused after ncclCommDestroy: the communicator alive at each call
    matched = calls.join(comms.lazy(), on=["pid", "communicator"], how="inner").filter(alive)
    unmatched = calls.join(matched.select("pid", "ts_ns", "tid"), on=["pid", "ts_ns", "tid"], how="anti")
    return pl.concat([matched.drop("_made", "_end"), unmatched], how="diagonal_relaxed").with_columns(
        pl.col("api").cast(pl.String))


def collective_entries(cap: Capture) -> pl.LazyFrame:
    """One row per rank that entered each numbered collective (comm_id, seq)."""
    return entered(collective_calls(cap))


def entered(calls: pl.LazyFrame) -> pl.LazyFrame:
    """collective_calls' rows that are numbered collectives of a known communicator and rank."""
    return calls.filter(
        (pl.col("kind") == "collective") & pl.col("seq").is_not_null() & pl.col("comm_id").is_not_null()
        & pl.col("rank").is_not_null())
