"""Across ranks: who entered each collective last (stragglers), and which
collectives some ranks entered and others never did (hangs).

A collective is one (comm_id, seq) on every rank of the communicator
(merge.collective_calls).  Entering is the host call: NCCL's
collectives return once enqueued, so a rank that calls late holds up every
rank's kernel of that collective, and a rank that never calls hangs them."""

from __future__ import annotations

import polars as pl

from ..read import Capture
from ..merge import collective_entries as _entries
from .common import bounds
from .registry import columns, tool

_COLL = (
    ("comm_id", pl.UInt64, "handle", "the communicator across ranks (hash of its ncclUniqueId)"),
    ("seq", pl.Int64, "", "the collective's number on it (the same on every rank)"),
    ("api", pl.String, "", "the collective"),
)


STRAGGLERS = columns(
    *_COLL,
    ("ranks", pl.UInt32, "count", "ranks that entered it"),
    ("first_ts_ns", pl.Int64, "ts", "the first rank's entry"),
    ("last_rank", pl.Int32, "", "the rank that entered last"),
    ("last_pid", pl.UInt32, "", "its process"),
    ("late_ns", pl.Int64, "ns", "how much later than the rank before it: the wait that rank alone caused"),
    ("spread_ns", pl.Int64, "ns", "last entry minus first"),
)


#: ranks and pids are below this (int32 never negative, u32), so that
#: (entry ns x this + rank) x this + pid orders by time, then rank; entry ns
#: stay below 2^62 (146 years), inside Int128
_SPAN = 1 << 32


def per_collective(entries: pl.LazyFrame) -> pl.LazyFrame:
    """STRAGGLERS' columns, unsorted, from merge.collective_entries rows (or
    any part of them holding whole collectives: pasta_trace.cluster runs it
    on each partition)."""
    ts = pl.col("ts_ns")
    # the entry time, rank and pid in one number, so that a plain max() finds the last rank (of
    # ranks in at the same ns, the highest) without sorting each collective's rows
    last = (ts.cast(pl.Int128) * _SPAN + pl.col("rank").cast(pl.Int128)) * _SPAN + pl.col("pid").cast(pl.Int128)
    return (
        entries
        .group_by("comm_id", "seq")
        .agg(
            pl.col("api").first(),
            pl.len().alias("ranks"),
            ts.min().alias("first_ts_ns"),
            last.max().alias("_last"),
            ts.top_k(2).min().alias("_before"),
        )
        .filter(pl.col("ranks") >= 2)
        .with_columns((pl.col("_last") // (_SPAN * _SPAN)).cast(pl.Int64).alias("_last_ts"),
                      (pl.col("_last") // _SPAN % _SPAN).cast(pl.Int32).alias("last_rank"),
                      (pl.col("_last") % _SPAN).cast(pl.UInt32).alias("last_pid"))
        .with_columns((pl.col("_last_ts") - pl.col("_before")).alias("late_ns"),
                      (pl.col("_last_ts") - pl.col("first_ts_ns")).alias("spread_ns"))
        .drop("_last", "_last_ts", "_before")
    )


@tool("stragglers", "NCCL stragglers (last rank into each collective)", STRAGGLERS,
      description="per collective (comm_id, seq): the rank that entered last and how much later, in order")
def stragglers(cap: Capture) -> pl.DataFrame:
    """Per collective entered by two ranks or more, in order: the rank that
    entered last, and by how much."""
    return finish_stragglers(per_collective(_entries(cap)))


def finish_stragglers(per: pl.LazyFrame) -> pl.DataFrame:
    return (
        per.sort("comm_id", "seq")
        .select([pl.col(c).cast(col.dtype) for c, col in STRAGGLERS.items()])
        .collect(engine="streaming")
    )


STRAGGLER_RANKS = columns(
    _COLL[0], ("rank", pl.Int32, "", "a rank of that communicator"),
    ("pid", pl.UInt32, "", "its process"),
    ("collectives", pl.UInt32, "count", "collectives of the communicator that two ranks or more entered"),
    ("times_last", pl.UInt32, "count", "of those, the ones this rank entered last"),
    ("late_ns", pl.Int64, "ns", "the waits it caused (late_ns of those), summed"),
    ("max_late_ns", pl.Int64, "ns", "the longest"),
    ("worst_seq", pl.Int64, "", "the collective of that longest wait"),
)


@tool("straggler_ranks", "NCCL straggler ranks", STRAGGLER_RANKS,
      description="per communicator and rank: collectives it entered last and the waits it caused")
def straggler_ranks(cap: Capture) -> pl.DataFrame:
    """Per communicator and rank: how often it entered last and the waits it caused, worst first."""
    entries = _entries(cap)
    return rank_table(per_collective(entries), entries.select("comm_id", "rank", "pid").unique())


def rank_table(per: pl.LazyFrame, ranks: pl.LazyFrame) -> pl.DataFrame:
    """STRAGGLER_RANKS from per_collective's rows and the (comm_id, rank, pid) that entered any."""
    totals = per.group_by("comm_id").agg(pl.len().alias("collectives"))
    last = per.group_by("comm_id", pl.col("last_rank").alias("rank")).agg(
        pl.len().alias("times_last"), pl.col("late_ns").sum(), pl.col("late_ns").max().alias("max_late_ns"),
        pl.col("seq").sort_by("late_ns").last().alias("worst_seq"))
    return (
        ranks.join(totals, on="comm_id").join(last, on=["comm_id", "rank"], how="left")
        .with_columns(pl.col("times_last", "late_ns").fill_null(0))
        .sort(["late_ns", "comm_id", "rank"], descending=[True, False, False])
        .select([pl.col(c).cast(col.dtype) for c, col in STRAGGLER_RANKS.items()])
        .collect(engine="streaming")
    )


HANGS = columns(
    *_COLL,
    ("nranks", pl.Int32, "count", "ranks of the communicator that the capture saw join it"),
    ("entered", pl.UInt32, "count", "ranks that entered the collective"),
    ("missing", pl.UInt32, "count", "ranks that joined the communicator and never entered it"),
    ("missing_ranks", pl.String, "", "which ranks (comma-separated)"),
    ("missing_pids", pl.String, "", "their processes"),
    ("first_ts_ns", pl.Int64, "ts", "the first rank's entry"),
    ("waiting_ns", pl.Int64, "ns", "from the first entry to the end of the capture: how long the others waited"),
)


@tool("hangs", "NCCL hangs (collectives some ranks never entered)", HANGS,
      description="collectives that some ranks entered and others of the communicator never did",
      terminal_columns=("comm_id", "seq", "api", "nranks", "entered", "missing", "missing_ranks", "missing_pids",
                        "waiting_ns"))
def hangs(cap: Capture) -> pl.DataFrame:
    """Collectives that some ranks entered and other ranks of the same
    communicator (seen joining it) never did before the capture ended."""
    _, end = bounds(cap)
    members = members_of(cap.communicators)
    return finish_hangs(unentered(_entries(cap), members), members, end)


def members_of(communicators: pl.LazyFrame) -> pl.LazyFrame:
    """comm_id, rank, pid of every rank seen joining a communicator."""
    return communicators.filter(pl.col("comm_id").is_not_null() & pl.col("rank").is_not_null()).select(
        "comm_id", "rank", "pid").unique()


def unentered(entries: pl.LazyFrame, members: pl.LazyFrame) -> pl.LazyFrame:
    """Per collective that some members never entered: comm_id, seq, api,
    entered, first_ts_ns, missing, missing_ranks, missing_pids (from whole
    collectives, as per_collective)."""
    entered = entries.select("comm_id", "seq", "api", "rank", "ts_ns")
    collectives = entered.group_by("comm_id", "seq").agg(
        pl.col("api").first(), pl.col("rank").n_unique().alias("entered"), pl.col("ts_ns").min().alias("first_ts_ns"))
    absent = (
        collectives.select("comm_id", "seq").join(members, on="comm_id")
        .join(entered.select("comm_id", "seq", "rank"), on=["comm_id", "seq", "rank"], how="anti")
        .group_by("comm_id", "seq")
        .agg(pl.len().alias("missing"), pl.col("rank").sort().cast(pl.String).str.join(",").alias("missing_ranks"),
             pl.col("pid").sort_by("rank").cast(pl.String).str.join(",").alias("missing_pids"))
    )
    return collectives.join(absent, on=["comm_id", "seq"])


def finish_hangs(parts: pl.LazyFrame, members: pl.LazyFrame, end: int | None) -> pl.DataFrame:
    nranks = members.group_by("comm_id").agg(pl.len().alias("nranks"))
    return (
        parts.join(nranks, on="comm_id")
        .with_columns((pl.lit(end, pl.Int64) - pl.col("first_ts_ns")).alias("waiting_ns"))
        .sort("comm_id", "seq")
        .select([pl.col(c).cast(col.dtype) for c, col in HANGS.items()])
        .collect(engine="streaming")
    )
