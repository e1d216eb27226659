"""NCCL collectives per rank and communicator, and their bus bandwidth
(calls matched to communicators by merge.collective_calls)."""

from __future__ import annotations

import polars as pl

from .. import merge
from ..call_result import done
from ..merge import collective_calls
from ..read import Capture
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
