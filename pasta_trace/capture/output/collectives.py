"""NCCL state carried from one decoded batch of events to the next.

`seq` numbers each process's collectives per communicator, in call order, from
0.  Every rank calls the collectives of a communicator in the same order (NCCL
requires it), so (comm_id, seq) names one collective across ranks and hosts.
Numbered here, at decode, rather than in BPF: a call that failed (a bad
argument, `ret` != 0) took no part in the communicator's sequence and gets no
number, which only its return code can tell; and a communicator made again at
a freed handle's address starts again from 0.  The numbers count from the
first collective the probes saw: ranks must be traced from the communicator's
creation (or from the same collective) for their numbers to agree.

`CommunicatorTable` keeps one row per communicator made (communicators.parquet).
"""

from __future__ import annotations

import polars as pl

from ... import schema
from ...call_result import done

#: calls that make a communicator (its handle in `communicator`)
CREATES = ("ncclCommInitRank", "ncclCommInitRankConfig", "ncclCommInitAll", "ncclCommSplit")
#: calls after which the handle is gone (ncclCommFinalize only flushes)
ENDS = ("ncclCommDestroy", "ncclCommAbort")
KEY = ["pid", "communicator"]
_NEXT = {"pid": pl.UInt32, "communicator": pl.UInt64, "_base": pl.Int64}


def _made(ok: pl.Expr = pl.col("ret") == 0) -> pl.Expr:
    return (pl.col("kind") == "comm") & pl.col("api").cast(pl.String).is_in(CREATES) & ok \
        & pl.col("communicator").is_not_null()


class Sequencer:
    """Numbers collectives per (pid, communicator) across batches."""

    def __init__(self) -> None:
        self._next = pl.DataFrame(schema=_NEXT)  # the next number of each communicator

    def number(self, events: pl.DataFrame) -> pl.DataFrame:
        """``events`` (schema.EVENTS_SCHEMA, one batch) with `seq` filled in."""
        if not events["kind"].is_in(["collective", "comm"]).any():  # most batches: a scan of the kind codes only
            return events
        coll = (pl.col("kind") == "collective") & done() & pl.col("communicator").is_not_null()
        marks = events.with_row_index("_row").filter(coll | _made()).select(
            "_row", *KEY, "ts_ns", coll.alias("_coll"), _made().alias("_new"))
        if marks.is_empty():
            return events
        # a communicator made in this batch starts an epoch numbered from 0;
        # epoch 0 goes on from the previous batches
        marks = (
            marks.sort("ts_ns", "_row")
            .with_columns(pl.col("_new").cast(pl.Int64).cum_sum().over(KEY).alias("_epoch"))
            .with_columns(pl.col("_coll").cast(pl.Int64).cum_sum().over([*KEY, "_epoch"]).alias("_n"))
            .join(self._next, on=KEY, how="left")
            .with_columns(
                (pl.col("_n") + pl.when(pl.col("_epoch") == 0).then(pl.col("_base").fill_null(0)).otherwise(0))
                .alias("_upto")
            )
            .with_columns(pl.when(pl.col("_coll")).then(pl.col("_upto") - 1).alias("seq"))
        )
        last = marks.group_by(KEY).agg(pl.col("_upto").last().alias("_base"))
        self._next = pl.concat([self._next.join(last, on=KEY, how="anti"), last.select(list(_NEXT))])
        seq = pl.repeat(None, events.height, dtype=pl.Int64, eager=True).scatter(marks["_row"], marks["seq"])
        return events.with_columns(seq.alias("seq"))


class CommunicatorTable:
    """The communicators seen so far: made by a successful CREATES call, ended
    by a successful ENDS call on the same handle."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.rows = schema.empty_frame(schema.COMMUNICATORS_SCHEMA)

    def add(self, events: pl.DataFrame) -> bool:
        """Take in one batch of events; True if the table changed."""
        made = events.filter(_made()).select(
            pl.lit(self.host).alias("host"), *KEY, "comm_id", "rank", "nranks", pl.col("api").cast(pl.String),
            "ts_ns", pl.lit(None, pl.Int64).alias("end_ts_ns"),
        ).cast(schema.COMMUNICATORS_SCHEMA)
        ended = events.filter(
            pl.col("api").cast(pl.String).is_in(ENDS) & done() & pl.col("communicator").is_not_null()
        ).group_by(KEY).agg(pl.col("ts_ns").min().alias("_end"))
        if made.is_empty() and ended.is_empty():
            return False
        rows = pl.concat([self.rows, made]).join(ended, on=KEY, how="left", maintain_order="left")
        open_before = pl.col("end_ts_ns").is_null() & (pl.col("ts_ns") <= pl.col("_end"))
        self.rows = rows.with_columns(
            pl.when(open_before).then(pl.col("_end")).otherwise(pl.col("end_ts_ns")).alias("end_ts_ns")
        ).select(list(schema.COMMUNICATORS_SCHEMA))
        return True
