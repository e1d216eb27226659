"""Device kernel executions, each matched to the host launch it came from.

Device side, per execution: the device module's LAUNCH record (host thread and
API-enter time, launch_id, grid_id, correlation id), its KERNEL_SUMMARY
(counters, %globaltimer span) and the CUPTI kernel record (start/end already on
CLOCK_MONOTONIC), joined inside the device data by (pid, launch_id), then
correlation id, then grid id.

Device -> host, in order of preference (kernels queue FIFO per stream, so a
queued kernel starts after later launches and time alone mismatches some):
  1. exact: the device's per-process launch_id and the host's per-process
     launch order differ by one constant per process.  The constant is read
     off the time matches below and trusted only if every time match of that
     process agrees on it (a lost host event or a launch the device module did
     not see breaks the agreement, and the process falls back to 2).
  2. time: as-of backward by (pid, tid) from the device's API-enter time to the
     host uprobe's entry time, within a tolerance.  The uprobe fires first and
     the device callback runs inside the same API call, before that thread's
     next call: exact for records that carry the thread.
  CUPTI-only executions (no LAUNCH record) carry no thread: they are matched in
  order of correlation id when that keeps every kernel starting after its
  launch, and otherwise to the latest launch before the kernel's start
  (right for about 99 % of kernels: queued kernels start after later launches).

A capture holds millions of executions: the matching works on their key
columns, already in the order the device wrote them (by process and
launch_id, which is time order), and the wide rows are put in order by one
gather only where that order is not already the output's.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import clock, schema
from ..read import Capture
from .graphs import device_graph_kernels, graph_launches
from .launches import run_starts, launch_order

#: Default tolerance between the host uprobe's entry and the device callback's
#: API-enter time of the same launch.
TOLERANCE_NS = 1_000_000

_MATCH = pl.Enum(schema.MATCH_NAMES)


def device_executions(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """One row per device kernel execution, with the host launch it matched:
    `launch_seq` (null if none), `match` ("exact" | "time"), `gpu_start_ns`,
    `gpu_end_ns` on the host clock, the host launch's `ts_ns` and its name.
    Rows in (pid, launch_seq, launch_id) order, the unmatched last in each
    process."""
    key = ("device_executions", tolerance_ns)
    if key not in cap.cache:
        cap.cache[key] = _device_executions(cap, tolerance_ns)
    return cap.cache[key].lazy()


def _clock_maps(cap: Capture, execs: pl.LazyFrame) -> pl.LazyFrame:
    """Per (pid, device) GPU->host clock maps: from CLOCK_SYNC samples, else
    from CUPTI anchors (a kernel's CUPTI start against its first %globaltimer)."""
    sync = cap.device["clock_sync"].select("pid", "device", "host_mono_before", "gpu_globaltimer",
                                           "host_mono_after").collect()
    maps = clock.fit_frame(sync, ["pid", "device"])
    anchors = (
        execs.filter(pl.col("cupti_start").is_not_null() & pl.col("gpu_t_first").is_not_null()
                     & (pl.col("gpu_t_first") > 0))
        .select("pid", "device", pl.col("cupti_start").alias("host_mono_before"),
                pl.col("gpu_t_first").cast(pl.Int64).alias("gpu_globaltimer"),
                pl.col("cupti_start").alias("host_mono_after"))
        .join(maps.lazy().select("pid", "device"), on=["pid", "device"], how="anti")
        .collect()
    )
    return pl.concat([maps, clock.fit_frame(anchors, ["pid", "device"])]).lazy()


def _strictly_increasing(pid: pl.Series, seq: pl.Series) -> bool:
    """Whether (pid, seq) rises strictly, row to row, with no nulls: the order
    a sort by them would give, each pair once."""
    if pid.null_count() or seq.null_count():
        return False
    p, s = pid.to_numpy(), seq.to_numpy()
    same = p[1:] == p[:-1]
    return bool(np.all(p[1:] >= p[:-1]) and np.all(s[1:][same] > s[:-1][same]))


def _launch_summaries(d: dict[str, pl.LazyFrame]) -> pl.DataFrame:
    """The device module's LAUNCH records beside their KERNEL_SUMMARY, by (pid, launch_id)."""
    launches = d["launches"].select(
        "pid", "launch_id", pl.col("tid").cast(pl.UInt32),
        pl.when(pl.col("host_mono_begin") > 0).then(pl.col("host_mono_begin").cast(pl.Int64)).alias("dev_ts"),
        pl.col("stream").alias("dev_stream"), pl.col("func").alias("dev_func"), "grid_id", "device",
        # a few distinct kernel names for millions of launches: categorical, not 10^7 strings held
        "correlation_id", pl.col("name").cast(pl.Categorical).alias("dev_name"),
    ).collect()
    summaries = d["kernel_summaries"].collect()
    # both written per process in launch_id order, one record each per launch: then the
    # rows already pair up, where a full join of millions of rows hashes both sides
    if (launches.height == summaries.height and _strictly_increasing(launches["pid"], launches["launch_id"])
            and launches["pid"].equals(summaries["pid"]) and launches["launch_id"].equals(summaries["launch_id"])):
        return launches.hstack(summaries.drop("pid", "launch_id").get_columns()).rechunk()
    return launches.lazy().join(summaries.lazy(), on=["pid", "launch_id"], how="full", coalesce=True).collect()


def _device_executions_raw(cap: Capture) -> pl.DataFrame:
    d = cap.device
    execs = _launch_summaries(d).lazy()
    cupti = d["cupti_kernels"].select(
        "pid", pl.col("start").cast(pl.Int64).alias("cupti_start"), pl.col("end").cast(pl.Int64).alias("cupti_end"),
        pl.col("grid_id").alias("c_grid_id"), pl.col("correlation_id").alias("c_corr"),
        pl.col("device").alias("c_device"), pl.col("name").alias("c_name"),
        "graph_id", "graph_node_id",
    ).with_row_index("_cupti_row")
    if not d["cupti_kernels"].select(pl.len()).collect().item():
        # no CUPTI kernel records (the device module alone): nothing to join, and
        # each join would copy every device execution
        cupti_schema = cupti.collect_schema()
        return execs.with_columns(
            pl.lit(None, cupti_schema[c]).alias(c) for c in ("cupti_start", "cupti_end", "graph_id", "graph_node_id")
        ).with_columns(pl.coalesce("device", pl.lit(0, pl.UInt32)).alias("device")).collect()
    by_corr = execs.join(
        cupti.filter(pl.col("c_corr") > 0).drop("c_grid_id"), left_on=["pid", "correlation_id"],
        right_on=["pid", "c_corr"], how="left",
    )
    # executions without a correlation id: try the grid id
    need_grid = pl.col("_cupti_row").is_null() & pl.col("grid_id").is_not_null() & (pl.col("grid_id") != 0)
    cupti_cols = ["_cupti_row", "cupti_start", "cupti_end", "c_device", "c_name", "graph_id", "graph_node_id"]
    by_grid = by_corr.filter(need_grid).drop(cupti_cols).join(
        cupti.drop("c_corr"), left_on=["pid", "grid_id"], right_on=["pid", "c_grid_id"], how="left",
    ).select(by_corr.collect_schema().names())
    joined = pl.concat([by_corr.filter(~need_grid), by_grid], how="vertical")
    used = joined.select("_cupti_row").drop_nulls().unique()
    cupti_only = cupti.join(used, on="_cupti_row", how="anti").select(
        "pid", pl.lit(None, pl.UInt64).alias("launch_id"), "cupti_start", "cupti_end",
        pl.col("c_grid_id").alias("grid_id"), pl.col("c_corr").alias("correlation_id"),
        pl.col("c_device").alias("device"), pl.col("c_name").alias("c_name"), "graph_id", "graph_node_id",
    )
    return pl.concat([joined, cupti_only], how="diagonal_relaxed").with_columns(
        pl.coalesce("device", "c_device", pl.lit(0, pl.UInt32)).alias("device"),
        pl.coalesce("dev_name", pl.col("c_name").cast(pl.Categorical)).alias("dev_name"),
    ).drop("c_device", "c_name", "_cupti_row").collect()


def _device_executions(cap: Capture, tolerance_ns: int) -> pl.DataFrame:
    # one row per kernel execution, materialised once (the clock maps read it too);
    # its row numbers (_dev_row) name the executions below.  In one chunk: its columns
    # come from several reads (launches, summaries, CUPTI), each chunked its own way,
    # and every select of columns chunked unlike each other re-cuts them (0.6 s a
    # select at 10^7, where one rechunk of all of them takes 0.2 s)
    raw = _device_executions_raw(cap).rechunk()
    maps = _clock_maps(cap, raw.lazy())
    # the clock maps (a row per process and GPU) joined onto the time columns only,
    # in row order, and the host times put beside the executions: not a copy of them
    times = (
        raw.lazy().select("pid", "device", "cupti_start", "cupti_end", "gpu_t_first", "gpu_t_last")
        .join(maps, on=["pid", "device"], how="left", maintain_order="left")
        .select(
            pl.coalesce("cupti_start", clock.to_host_expr(pl.col("gpu_t_first"))).alias("gpu_start_ns"),
            pl.coalesce("cupti_end", clock.to_host_expr(pl.col("gpu_t_last"))).alias("gpu_end_ns"),
        )
        .collect()
        .rechunk()  # chunked as `raw` is (one chunk): see above
    )
    execs = raw.with_columns(times["gpu_start_ns"], times["gpu_end_ns"])
    # without executions to match, the launches need not even be numbered
    ev = schema.EVENTS_SCHEMA
    host = launch_order(cap) if execs.height else pl.DataFrame(schema={
        "pid": ev["pid"], "tid": ev["tid"], "ts_ns": ev["ts_ns"], "launch_seq": pl.Int64})
    keys = pl.DataFrame([execs["pid"], execs["launch_id"], _time_seqs(execs, host, tolerance_ns)])
    keys = _cupti_seqs(cap, execs.with_row_index("_dev_row"), host, keys)
    matched = _matched(keys, host)
    wide = execs.drop("cupti_start", "cupti_end", "gpu_t_first", "gpu_t_last", strict=False)
    if _strictly_increasing(matched["pid"], matched["launch_seq"]):
        # already in the output's order (every execution matched, in launch_id order),
        # and no launch claimed twice: no sort, no copy of the rows
        return wide.with_columns(matched["launch_seq"].rechunk(), matched["match"].rechunk())
    if _strictly_increasing(matched["pid"], matched["launch_id"]):
        seqs = _claimed_once_in_order(matched)
    else:
        seqs = _claimed_once(matched.with_row_index("_dev_row"))
    return wide[seqs["_dev_row"]].with_columns(seqs["launch_seq"], seqs["match"])


def _time_seqs(execs: pl.DataFrame, host: pl.DataFrame, tolerance_ns: int) -> pl.Series:
    """Per execution: the launch_seq of its host launch by time (2. above), null if none.

    The as-of join needs each side in time order within each (pid, tid):
    launch_order is (by process, then time), and the executions are sorted by
    time alone, a stable sort that is linear on rows already in time order."""
    left = execs.select("pid", "tid", "dev_ts").with_row_index("_dev_row")
    if left["dev_ts"].null_count() or left["tid"].null_count():
        left = left.filter(pl.col("dev_ts").is_not_null() & pl.col("tid").is_not_null())
    ts = left["dev_ts"].to_numpy()
    if ts.size and np.any(ts[1:] < ts[:-1]):
        left = left[np.argsort(ts, kind="stable")]
    right = host.select("pid", "tid", pl.col("ts_ns").cast(pl.Int64).alias("host_ts"), "launch_seq")
    if right["host_ts"].null_count():
        right = right.filter(pl.col("host_ts").is_not_null())
    timed = left.join_asof(right, left_on="dev_ts", right_on="host_ts", by=["pid", "tid"], strategy="backward",
                           tolerance=tolerance_ns, check_sortedness=False)
    out = np.full(execs.height, -1, dtype=np.int64)
    out[timed["_dev_row"].to_numpy()] = timed["launch_seq"].fill_null(-1).to_numpy()
    return pl.Series("time_seq", out).set(pl.Series(out < 0), None)


def _cupti_seqs(cap: Capture, execs: pl.DataFrame, host: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """`keys` with c_seq and c_match: the launch of each CUPTI-only execution
    (no LAUNCH record), in correlation order while every kernel starts after
    its launch, else the latest launch before its start."""
    only = pl.col("dev_ts").is_null() & pl.col("launch_id").is_null()
    if not execs.select(only.any()).item():
        return keys.with_columns(pl.lit(None, pl.Int64).alias("c_seq"), pl.lit(None, _MATCH).alias("c_match"))
    lazy_host = host.lazy().select("pid", pl.col("ts_ns").alias("host_ts"), "launch_seq")
    # the kernels of one CUDA graph launch share its correlation id: in start order, as the
    # merge lays out the graph's kernels per graph launch (merge/graphs.py)
    ordered = execs.lazy().filter(only).sort(["pid", "correlation_id", "gpu_start_ns"]).with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over("pid").alias("order_seq"))
    causal = ordered.join(lazy_host.select("pid", pl.col("launch_seq").alias("order_seq"), "host_ts"),
                          on=["pid", "order_seq"], how="left").group_by("pid").agg(
        (pl.col("host_ts").is_not_null() & (pl.col("host_ts") <= pl.col("gpu_start_ns"))).all().alias("causal")
    )
    by_start = ordered.sort(["pid", "gpu_start_ns"]).join_asof(
        lazy_host.sort(["pid", "host_ts"]), left_on="gpu_start_ns", right_on="host_ts", by="pid",
        strategy="backward", check_sortedness=False,
    )
    cupti_seq = by_start.join(causal, on="pid", how="left").select(
        "_dev_row",
        pl.when(pl.col("causal")).then(pl.col("order_seq")).otherwise(pl.col("launch_seq")).alias("c_seq"),
        pl.when(pl.col("causal")).then(pl.lit("exact")).when(pl.col("launch_seq").is_not_null())
        .then(pl.lit("time")).cast(_MATCH).alias("c_match"),
    )
    graph_seq = _graph_seqs(cap, execs, host).lazy()  # exact, where the order above may not be
    cupti_seq = pl.concat([cupti_seq.join(graph_seq, on="_dev_row", how="anti"), graph_seq])
    return keys.with_row_index("_dev_row").lazy().join(
        cupti_seq, on="_dev_row", how="left", maintain_order="left").drop("_dev_row").collect()


def _graph_seqs(cap: Capture, execs: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """_dev_row, c_seq, c_match of the CUPTI kernels of graph launches: the
    launch row of their graph launch at their place in it (graphs.py lays a
    graph launch out as its device kernels, in start order), exact; null for
    those that found no graph launch, which no other launch may claim."""
    out = pl.DataFrame(schema={"_dev_row": pl.UInt32, "c_seq": pl.Int64, "c_match": _MATCH})
    ran = device_graph_kernels(cap)
    if ran.is_empty():
        return out
    mine = execs.lazy().filter(pl.col("dev_ts").is_null() & pl.col("launch_id").is_null()
                               & (pl.col("graph_id").fill_null(0) != 0)).select(
        "_dev_row", "pid", "correlation_id", "gpu_start_ns", "graph_node_id").sort(
        "pid", "correlation_id", "gpu_start_ns", "graph_node_id").with_columns(
        pl.int_range(pl.len()).over("pid", "correlation_id").alias("pos"))
    # a graph launch's rows follow one another in launch_seq from its first, at its (pid, tid, ts_ns)
    at = graph_launches(cap).select("_launch", "pid", "tid", "ts_ns").join(
        ran.select("_launch").drop_nulls().unique(), on="_launch")
    first = host.lazy().select("pid", "tid", "ts_ns", "launch_seq").join(at.lazy(), on=["pid", "tid", "ts_ns"]).group_by(
        "_launch").agg(pl.col("launch_seq").min().alias("_first"))
    seq = pl.col("_first") + pl.col("pos")
    return mine.join(ran.lazy().select("pid", "correlation_id", "pos", "_launch"),
                     on=["pid", "correlation_id", "pos"]).join(first, on="_launch", how="left").select(
        "_dev_row", seq.alias("c_seq"), pl.when(seq.is_not_null()).then(pl.lit("exact", _MATCH)).alias("c_match"),
    ).collect()


def _matched(keys: pl.DataFrame, host: pl.DataFrame) -> pl.DataFrame:
    """pid, launch_id, launch_seq and match per execution (1. exact, else 2.
    time, else the CUPTI-only match), in the executions' order."""
    # one launch_id - launch_seq offset per process, agreed by every time match
    offsets = (
        keys.lazy().filter(pl.col("time_seq").is_not_null() & pl.col("launch_id").is_not_null())
        .select("pid", (pl.col("launch_id").cast(pl.Int64) - pl.col("time_seq")).alias("_off"))
        .group_by("pid").agg(pl.col("_off").min().alias("_off"), pl.col("_off").max().alias("_max"))
        .filter(pl.col("_off") == pl.col("_max")).drop("_max")
    )
    exact_seq = pl.col("launch_id").cast(pl.Int64) - pl.col("_off")
    n_host = host.lazy().group_by("pid").agg(pl.len().cast(pl.Int64).alias("_n_host"))
    return (
        keys.lazy().join(offsets, on="pid", how="left", maintain_order="left")
        .join(n_host, on="pid", how="left", maintain_order="left")
        .with_columns(
            pl.when(pl.col("_off").is_not_null() & (exact_seq >= 0) & (exact_seq < pl.col("_n_host")))
            .then(exact_seq).alias("_exact_seq")
        )
        .select(
            "pid", "launch_id",
            pl.coalesce("_exact_seq", "time_seq", "c_seq").alias("launch_seq"),
            pl.when(pl.col("_exact_seq").is_not_null()).then(pl.lit("exact", _MATCH))
            .when(pl.col("time_seq").is_not_null()).then(pl.lit("time", _MATCH))
            .otherwise(pl.col("c_match")).alias("match"),
        )
        .collect()
    )


def _claimed_once(matched: pl.DataFrame) -> pl.DataFrame:
    """_dev_row, launch_seq, match in (pid, launch_seq, launch_id) order, the
    unmatched last in each process; two executions claiming one launch (a time
    fallback gone wrong): the first keeps it.  Sorted, a row claims what the
    row above claimed: cheaper than a window over every launch."""
    claimed = (pl.col("pid") == pl.col("pid").shift(1)) & (pl.col("launch_seq") == pl.col("launch_seq").shift(1))
    return matched.lazy().sort(["pid", "launch_seq", "launch_id", "_dev_row"], nulls_last=True).with_columns(
        pl.when(pl.col("launch_seq").is_not_null() & claimed).then(None).otherwise(pl.col("launch_seq"))
        .alias("launch_seq"),
    ).with_columns(
        pl.when(pl.col("launch_seq").is_null()).then(None).otherwise(pl.col("match")).alias("match")
    ).select("_dev_row", "launch_seq", "match").collect()


def _claimed_once_in_order(matched: pl.DataFrame) -> pl.DataFrame:
    """_claimed_once for executions listed in (pid, launch_id) order: a
    stable sort by one int64 key, each process's launch_seq (unmatched: past
    its last) above the processes before it, where a Polars sort by four
    columns costs seconds on millions of rows."""
    pid = matched["pid"].to_numpy()
    seq = matched["launch_seq"]
    starts = run_starts(pid)
    run = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, pid.size]))
    seq_or_top = seq.fill_null(-1).to_numpy()
    # per process: its matched launch_seqs, then one value past them for its unmatched
    top = np.maximum.reduceat(seq_or_top + 1, starts) if pid.size else np.empty(0, np.int64)
    seq_or_top = np.where(seq.is_null().to_numpy(), top[run], seq_or_top)
    key = np.r_[0, np.cumsum(top + 1)[:-1]][run] + seq_or_top
    perm = np.argsort(key, kind="stable")  # linear on rows already nearly in order
    launch_seq = seq.gather(perm)
    k = key[perm]
    # the first execution of a launch keeps it (the unmatched share a key, and stay null)
    again = pl.Series(np.r_[False, k[1:] == k[:-1]])
    launch_seq = launch_seq.set(again, None)
    match = matched["match"].gather(perm).set(launch_seq.is_null(), None)
    return pl.DataFrame([pl.Series("_dev_row", perm), launch_seq, match])
