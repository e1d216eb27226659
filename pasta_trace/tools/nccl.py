"""NCCL collectives: per rank and communicator, and their bus bandwidth
(calls matched to communicators by merge.collective_calls); and across
ranks, who entered each collective last (stragglers), and which collectives
some ranks entered and others never did (hangs).

A collective is one (comm_id, seq) on every rank of the communicator
(merge.collective_calls).  Entering is the host call: NCCL's
collectives return once enqueued, so a rank that calls late holds up every
rank's kernel of that collective, and a rank that never calls hangs them."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..call_result import done
from ..merge import collective_calls, collective_entries as _entries
from ..read import Capture
from .common import bounds
from .registry import PID, columns, tool

#: nccl-tests' bus bandwidth: algorithm bytes (`size` x this) and the bus factor, per API
_ALGO_BYTES_X_NRANKS = ("ncclAllGather", "ncclReduceScatter", "ncclAlltoAll", "ncclGather", "ncclScatter")
_BUS_FACTOR_2 = ("ncclAllReduce",)  # 2 (n-1)/n
_BUS_FACTOR_1 = ("ncclBroadcast", "ncclReduce", "ncclSend", "ncclRecv")  # 1; the others: (n-1)/n


_KEY = (
    ("comm_id", pl.UInt64, "handle", "the communicator across ranks (hash of its ncclUniqueId); null: not known"),
    ("rank", pl.Int32, "", "this process's rank in it"),
    ("nranks", pl.Int32, "count", "ranks in the communicator"),
)
COLLECTIVES = columns(
    *_KEY, PID, ("communicator", pl.UInt64, "handle", "the ncclComm_t in that process"),
    ("api", pl.String, "", "the NCCL call"),
    ("calls", pl.UInt32, "count", "calls"),
    ("failed", pl.UInt32, "count", "calls that returned an error"),
    ("bytes", pl.UInt64, "bytes", "count x element size, summed over the calls that succeeded"),
    ("call_ns", pl.Int64, "ns", "time in the calls (enqueueing: the GPU runs them later)"),
    ("max_call_ns", pl.Int64, "ns", "the longest call"),
    ("first_ts_ns", pl.Int64, "ts", "first call"),
    ("last_ts_ns", pl.Int64, "ts", "last call"),
)


_PER_RANK_KEYS = ["comm_id", "rank", "nranks", "pid", "communicator", "api"]


@tool("collectives", "NCCL collectives per rank", COLLECTIVES,
      description="calls, bytes and time in the call per communicator, rank and NCCL call",
      terminal_columns=("comm_id", "rank", "nranks", "pid", "api", "calls", "failed", "bytes", "call_ns",
                        "max_call_ns"))
def collectives(cap: Capture) -> pl.DataFrame:
    """Per communicator, rank and NCCL call: how many, bytes, time in the call."""
    return finish_per_rank(per_rank(collective_calls(cap)))


def per_rank(calls: pl.LazyFrame) -> pl.LazyFrame:
    """COLLECTIVES' columns, unsorted, from merge.collective_calls rows (or a
    part of them: combine_per_rank adds the parts up)."""
    return calls.group_by(_PER_RANK_KEYS).agg(
        pl.len().alias("calls"),
        (~done()).sum().alias("failed"),
        pl.col("size").filter(done()).sum().alias("bytes"),
        pl.col("dur_ns").sum().alias("call_ns"),
        pl.col("dur_ns").max().alias("max_call_ns"),
        pl.col("ts_ns").min().alias("first_ts_ns"),
        pl.col("ts_ns").max().alias("last_ts_ns"),
    ).with_columns(pl.col("api").cast(pl.String))


def combine_per_rank(parts: pl.LazyFrame) -> pl.LazyFrame:
    """per_rank of the whole from per_rank of its parts."""
    return parts.group_by(_PER_RANK_KEYS).agg(
        pl.col("calls", "failed", "bytes", "call_ns").sum(), pl.col("max_call_ns").max(),
        pl.col("first_ts_ns").min(), pl.col("last_ts_ns").max())


def finish_per_rank(per: pl.LazyFrame) -> pl.DataFrame:
    return (
        per.sort(["comm_id", "rank", "pid", "communicator", "api"], nulls_last=True)
        .select([pl.col(c).cast(col.dtype) for c, col in COLLECTIVES.items()])
        .collect(engine="streaming")
    )


def _containers(events: pl.LazyFrame) -> pl.LazyFrame:
    """Each collective call with the call its kernels are launched in: itself,
    or for a call inside ncclGroupStart..ncclGroupEnd the outermost
    ncclGroupEnd that closes the group (`_c_ts`, `_c_end` on its thread)."""
    nccl = events.filter(pl.col("layer") == "nccl").sort("pid", "tid", "ts_ns")
    step = pl.when(pl.col("api") == "ncclGroupStart").then(1).when(pl.col("api") == "ncclGroupEnd").then(-1)
    nccl = nccl.with_columns(step.fill_null(0).cum_sum().over("pid", "tid").alias("_depth"))
    ends = nccl.filter((pl.col("api") == "ncclGroupEnd") & (pl.col("_depth") == 0)).select(
        "pid", "tid", pl.col("ts_ns").alias("_c_ts"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("_c_end"))
    coll = nccl.filter(pl.col("kind") == "collective")
    # sorted by the `by` keys and then the time, as join_asof needs (it does not check)
    grouped = coll.filter(pl.col("_depth") > 0).sort("pid", "tid", "ts_ns").join_asof(
        ends.sort("pid", "tid", "_c_ts"), left_on="ts_ns", right_on="_c_ts", by=["pid", "tid"], strategy="forward",
        check_sortedness=False)
    alone = coll.filter(pl.col("_depth") == 0).with_columns(
        pl.col("ts_ns").alias("_c_ts"), (pl.col("ts_ns") + pl.col("dur_ns")).alias("_c_end"))
    return pl.concat([alone, grouped], how="diagonal_relaxed").drop("_depth")


BANDWIDTH = columns(
    *_KEY, PID, ("seq", pl.Int64, "", "the collective's number on its communicator"),
    ("api", pl.String, "", "the collective"),
    ("count", pl.UInt64, "count", "elements"),
    ("datatype", pl.String, "", "element type"),
    ("bytes", pl.UInt64, "bytes", "algorithm bytes (nccl-tests): size, times nranks for gathers and scatters"),
    ("gpu_ns", pl.Int64, "ns", "first start to last end of the kernels its call (or group) launched"),
    ("kernels", pl.UInt32, "count", "those kernels"),
    ("group_ops", pl.UInt32, "count", "collectives sharing those kernels (one ncclGroupEnd); >1: bandwidth is shared"),
    ("algbw", pl.Float64, "GB/s", "bytes over gpu_ns"),
    ("busbw", pl.Float64, "GB/s", "algbw times the bus factor (nccl-tests): 2(n-1)/n all-reduce, (n-1)/n gathers"),
)


@tool("collective_bandwidth", "NCCL bus bandwidth", BANDWIDTH, needs_device=True,
      description="GPU time, algorithm and bus bandwidth of each collective whose kernels have device timing",
      terminal_columns=("comm_id", "seq", "rank", "api", "count", "datatype", "bytes", "gpu_ns", "group_ops", "algbw",
                        "busbw"))
def bandwidth(cap: Capture) -> pl.DataFrame:
    """Per collective with device timing: the GPU time of the kernels its
    call launched and the algorithm and bus bandwidth."""
    calls = _containers(cap.events).filter(done()).drop("comm_id", "rank", "nranks").with_columns(
        pl.col("api").cast(pl.String))
    cont = calls.select("pid", "tid", "_c_ts", "_c_end").unique()
    # only the threads that made collective calls: a semi-join hashing those few, before
    # the sort that the as-of join needs (millions of launches, most from other threads)
    kernels = merge.kernel_executions(cap).filter(pl.col("gpu_start_ns").is_not_null()).select(
        "pid", "tid", pl.col("ts_ns").alias("_launch"), "gpu_start_ns", "gpu_end_ns").join(
        cont.select("pid", "tid").unique(), on=["pid", "tid"], how="semi")
    timed = (
        kernels.sort("pid", "tid", "_launch")
        .join_asof(cont.sort("pid", "tid", "_c_ts"), left_on="_launch", right_on="_c_ts", by=["pid", "tid"],
                   check_sortedness=False)
        .filter(pl.col("_launch") <= pl.col("_c_end"))
        .group_by("pid", "tid", "_c_ts")
        .agg((pl.col("gpu_end_ns").max() - pl.col("gpu_start_ns").min()).alias("gpu_ns"),
             pl.len().alias("kernels"))
    )
    per_call = calls.join(timed, on=["pid", "tid", "_c_ts"], how="inner").with_columns(
        pl.len().over("pid", "tid", "_c_ts").alias("group_ops"))
    comms = collective_calls(cap).select("pid", "tid", "ts_ns", "comm_id", "rank", "nranks")
    n = pl.col("nranks").cast(pl.Float64)
    factor = (
        pl.when(pl.col("api").is_in(_BUS_FACTOR_2)).then(2 * (n - 1) / n)
        .when(pl.col("api").is_in(_BUS_FACTOR_1)).then(1.0)
        .otherwise((n - 1) / n)
    )
    algo = pl.when(pl.col("api").is_in(_ALGO_BYTES_X_NRANKS)).then(pl.col("size") * pl.col("nranks")) \
        .otherwise(pl.col("size"))
    return (
        per_call.join(comms, on=["pid", "tid", "ts_ns"], how="left")
        .with_columns(algo.alias("bytes"), pl.col("datatype").cast(pl.String))
        .with_columns((pl.col("bytes") / pl.col("gpu_ns")).alias("algbw"))
        .with_columns((pl.col("algbw") * factor).alias("busbw"))
        .sort(["comm_id", "seq", "rank", "pid", "ts_ns"], nulls_last=True)
        .select([pl.col(c).cast(col.dtype) for c, col in BANDWIDTH.items()])
        .collect(engine="streaming")
    )


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
    any part of them holding whole collectives: pasta_trace.dask_cluster runs it
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
