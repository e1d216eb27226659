"""Kernel executions: host launch events joined with what the device saw.

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
"""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import clock, schema
from ..hexfmt import hex_expr
from ..read import Capture
from .launches import launch_events, launch_order, order_position, time_rank

_SCHEMA = schema.TIMELINE_FRAMES["kernels"]
#: the kernels columns read from the launch events themselves
_EVENT_COLUMNS = [k for k in _SCHEMA if k in schema.EVENTS_SCHEMA and k not in schema.TENSOR_PAYLOAD.values()]
_COUNTERS = [k for k in schema.TIMELINE_FRAMES["kernels"] if k in schema.DEVICE_FRAMES["kernel_summaries"]
             and k not in ("pid", "launch_id")]

#: Default tolerance between the host uprobe's entry and the device callback's
#: API-enter time of the same launch.
TOLERANCE_NS = 1_000_000


def kernel_names(cap: Capture, launches: pl.LazyFrame) -> pl.LazyFrame:
    """`launches` (pid, func, ts_ns, ...) with the kernel `name` of each: the
    latest handle->name seen before the launch, else any name of that handle
    (names found offline carry no time); null when none was seen.  Rows come
    back in another order."""
    names = cap.names.select("pid", pl.col("handle").alias("func"), "name",
                             pl.col("ts_ns").fill_null(0).alias("name_ts")).drop_nulls(["func", "name"])
    per_handle = names.sort("name_ts").group_by(["pid", "func"]).agg(
        pl.len().alias("_names"), pl.col("name").first().alias("_any_name"))
    launches = launches.join(per_handle, on=["pid", "func"], how="left")
    # a handle named once (the usual case) has that name whenever it was seen:
    # only launches of renamed handles (a module reloaded) need the as-of join,
    # which costs ~1 us a row with by= on millions of launches
    renamed = pl.col("_names").fill_null(0) > 1
    timed = launches.filter(renamed).sort(["pid", "func", "ts_ns"]).join_asof(
        names.sort(["pid", "func", "name_ts"]), left_on="ts_ns", right_on="name_ts",
        by=["pid", "func"], strategy="backward", check_sortedness=False,
    ).drop("name_ts")
    once = launches.filter(renamed.not_()).with_columns(pl.lit(None, pl.String).alias("name"))
    return pl.concat([once, timed], how="vertical").with_columns(
        pl.coalesce("name", "_any_name").alias("name")
    ).drop("_any_name", "_names")


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


def _device_executions_raw(cap: Capture) -> pl.LazyFrame:
    d = cap.device
    launches = d["launches"].select(
        "pid", "launch_id", pl.col("tid").cast(pl.UInt32),
        pl.when(pl.col("host_mono_begin") > 0).then(pl.col("host_mono_begin").cast(pl.Int64)).alias("dev_ts"),
        pl.col("stream").alias("dev_stream"), pl.col("func").alias("dev_func"), "grid_id", "device",
        "correlation_id", pl.col("name").alias("dev_name"),
    )
    summaries = d["kernel_summaries"]
    execs = launches.join(summaries, on=["pid", "launch_id"], how="full", coalesce=True)
    cupti = d["cupti_kernels"].select(
        "pid", pl.col("start").cast(pl.Int64).alias("cupti_start"), pl.col("end").cast(pl.Int64).alias("cupti_end"),
        pl.col("grid_id").alias("c_grid_id"), pl.col("correlation_id").alias("c_corr"),
        pl.col("device").alias("c_device"), pl.col("name").alias("c_name"),
    ).with_row_index("_cupti_row")
    if not d["cupti_kernels"].select(pl.len()).collect().item():
        # no CUPTI kernel records (the device module alone): nothing to join, and
        # each join would copy every device execution
        cupti_schema = cupti.collect_schema()
        return execs.with_columns(
            pl.lit(None, cupti_schema[c]).alias(c) for c in ("cupti_start", "cupti_end")
        ).with_columns(pl.coalesce("device", pl.lit(0, pl.UInt32)).alias("device"))
    by_corr = execs.join(
        cupti.filter(pl.col("c_corr") > 0).drop("c_grid_id"), left_on=["pid", "correlation_id"],
        right_on=["pid", "c_corr"], how="left",
    )
    # executions without a correlation id: try the grid id
    need_grid = pl.col("_cupti_row").is_null() & pl.col("grid_id").is_not_null() & (pl.col("grid_id") != 0)
    cupti_cols = ["_cupti_row", "cupti_start", "cupti_end", "c_device", "c_name"]
    by_grid = by_corr.filter(need_grid).drop(cupti_cols).join(
        cupti.drop("c_corr"), left_on=["pid", "grid_id"], right_on=["pid", "c_grid_id"], how="left",
    ).select(by_corr.collect_schema().names())
    joined = pl.concat([by_corr.filter(~need_grid), by_grid], how="vertical")
    used = joined.select("_cupti_row").drop_nulls().unique()
    cupti_only = cupti.join(used, on="_cupti_row", how="anti").select(
        "pid", pl.lit(None, pl.UInt64).alias("launch_id"), "cupti_start", "cupti_end",
        pl.col("c_grid_id").alias("grid_id"), pl.col("c_corr").alias("correlation_id"),
        pl.col("c_device").alias("device"), pl.col("c_name").alias("c_name"),
    )
    return pl.concat([joined, cupti_only], how="diagonal_relaxed").with_columns(
        pl.coalesce("device", "c_device", pl.lit(0, pl.UInt32)).alias("device"),
        pl.coalesce("dev_name", "c_name").alias("dev_name"),
    ).drop("c_device", "c_name", "_cupti_row")


def device_executions(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """One row per device kernel execution, with the host launch it matched:
    `launch_seq` (null if none), `match` ("exact" | "time"), `gpu_start_ns`,
    `gpu_end_ns` on the host clock, the host launch's `ts_ns` and its name."""
    key = ("device_executions", tolerance_ns)
    if key not in cap.cache:
        cap.cache[key] = _device_executions(cap, tolerance_ns)
    return cap.cache[key].lazy()


def _device_executions(cap: Capture, tolerance_ns: int) -> pl.DataFrame:
    # one row per kernel execution, materialised once (the clock maps read it too) and
    # so that the row ids below stay the same in every branch of the plan
    raw = _device_executions_raw(cap).collect()
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
    )
    execs = raw.with_columns(times["gpu_start_ns"], times["gpu_end_ns"]).with_row_index("_dev_row")
    # without executions to match, the launches need not even be numbered
    ev = schema.EVENTS_SCHEMA
    host = (launch_order(cap) if execs.height else pl.DataFrame(schema={
        "pid": ev["pid"], "tid": ev["tid"], "ts_ns": ev["ts_ns"], "launch_seq": pl.Int64})).lazy().select(
        "pid", "tid", pl.col("ts_ns").alias("host_ts"), "launch_seq")
    execs = execs.lazy()

    # 2. time: device API-enter time -> host uprobe entry, same pid and thread
    timed = execs.filter(pl.col("dev_ts").is_not_null() & pl.col("tid").is_not_null()).sort(
        ["pid", "tid", "dev_ts"]
    ).join_asof(
        host.sort(["pid", "tid", "host_ts"]), left_on="dev_ts", right_on="host_ts", by=["pid", "tid"],
        strategy="backward", tolerance=tolerance_ns, check_sortedness=False,
    ).select("_dev_row", pl.col("launch_seq").alias("time_seq"))

    # CUPTI-only: in correlation order, trusted while every kernel starts after its launch
    ordered = execs.filter(pl.col("dev_ts").is_null() & pl.col("launch_id").is_null()).sort(
        ["pid", "correlation_id"]
    ).with_columns(pl.int_range(pl.len(), dtype=pl.Int64).over("pid").alias("order_seq"))
    causal = ordered.join(host.select("pid", pl.col("launch_seq").alias("order_seq"), "host_ts"),
                          on=["pid", "order_seq"], how="left").group_by("pid").agg(
        (pl.col("host_ts").is_not_null() & (pl.col("host_ts") <= pl.col("gpu_start_ns"))).all().alias("causal")
    )
    by_start = ordered.sort(["pid", "gpu_start_ns"]).join_asof(
        host.sort(["pid", "host_ts"]), left_on="gpu_start_ns", right_on="host_ts", by="pid",
        strategy="backward", check_sortedness=False,
    )
    cupti_seq = by_start.join(causal, on="pid", how="left").select(
        "_dev_row",
        pl.when(pl.col("causal")).then(pl.col("order_seq")).otherwise(pl.col("launch_seq")).alias("c_seq"),
        pl.when(pl.col("causal")).then(pl.lit("exact")).when(pl.col("launch_seq").is_not_null())
        .then(pl.lit("time")).alias("c_match"),
    )

    # 1. exact: one launch_id - launch_seq offset per process, agreed by every time match
    # (worked out on the key columns; the wide rows are gathered once, in the final order)
    with_time = execs.select("_dev_row", "pid", "launch_id").join(timed, on="_dev_row", how="left")
    offsets = (
        with_time.filter(pl.col("time_seq").is_not_null() & pl.col("launch_id").is_not_null())
        .group_by("pid")
        .agg((pl.col("launch_id").cast(pl.Int64) - pl.col("time_seq")).unique().alias("_offs"))
        .filter(pl.col("_offs").list.len() == 1)
        .select("pid", pl.col("_offs").list.first().alias("_off"))
    )
    exact_seq = pl.col("launch_id").cast(pl.Int64) - pl.col("_off")
    n_host = host.group_by("pid").agg(pl.len().cast(pl.Int64).alias("_n_host"))
    matched = (
        with_time.join(offsets, on="pid", how="left")
        .join(n_host, on="pid", how="left")
        .join(cupti_seq, on="_dev_row", how="left")
        .with_columns(
            pl.when(pl.col("_off").is_not_null() & (exact_seq >= 0) & (exact_seq < pl.col("_n_host")))
            .then(exact_seq).alias("_exact_seq")
        )
        .with_columns(
            pl.coalesce("_exact_seq", "time_seq", "c_seq").alias("launch_seq"),
            pl.when(pl.col("_exact_seq").is_not_null()).then(pl.lit("exact"))
            .when(pl.col("time_seq").is_not_null()).then(pl.lit("time"))
            .otherwise(pl.col("c_match")).cast(pl.Enum(schema.MATCH_NAMES)).alias("match"),
        )
    )
    # two executions claiming one launch (a time fallback gone wrong): the first keeps it
    # (sorted: a row claims what the row above claimed; cheaper than a window over every launch)
    claimed = (pl.col("pid") == pl.col("pid").shift(1)) & (pl.col("launch_seq") == pl.col("launch_seq").shift(1))
    matched = matched.sort(["pid", "launch_seq", "launch_id", "_dev_row"], nulls_last=True).with_columns(
        pl.when(pl.col("launch_seq").is_not_null() & claimed).then(None).otherwise(pl.col("launch_seq"))
        .alias("launch_seq"),
    ).with_columns(pl.when(pl.col("launch_seq").is_null()).then(None).otherwise(pl.col("match")).alias("match"))
    seqs = matched.select("_dev_row", "launch_seq", "match").collect()
    wide = execs.drop("_dev_row", "cupti_start", "cupti_end", "gpu_t_first", "gpu_t_last", strict=False).collect()
    return wide[seqs["_dev_row"]].with_columns(seqs["launch_seq"], seqs["match"])


def kernel_executions(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """One row per host launch event (schema.TIMELINE_FRAMES["kernels"]),
    worked out when called and held in memory: the frame returned only selects
    and casts (and gives a host-only capture's device columns as nulls).  Not
    kept in cap.cache, where it would outlive a reader that wants it once (an
    export): a reader that wants it again holds it (tools.run.with_merged)."""
    merged = cap.merged.get("kernels")
    if merged is not None:
        return merged
    rows, absent = _kernel_executions(cap, tolerance_ns)
    return rows.lazy().with_columns(absent).select([pl.col(k).cast(v) for k, v in _SCHEMA.items()])


def _kernel_executions(cap: Capture, tolerance_ns: int) -> tuple[pl.DataFrame, list[pl.Expr]]:
    """The kernel executions' rows, and the columns absent from them (a
    host-only capture's device columns: nulls) as expressions."""
    # names and output order worked out on the narrow launch_order; the launch rows
    # (only the columns kept) are read once and gathered once, into time order
    order = launch_order(cap)
    named = kernel_names(cap, order.lazy().select("pid", "func", "ts_ns").with_row_index("_i")).sort("_i").collect()
    # unknown@0x<handle>, formatted once per handle, for the launches no name was seen for
    unnamed = named["name"].is_null()
    funcs = order["func"].filter(unnamed).unique().drop_nulls()
    unknown = order["func"].replace_strict(
        funcs, pl.select(pl.format("unknown@{}", hex_expr(pl.lit(funcs)))).to_series(), default=None,
        return_dtype=pl.String) if funcs.len() else pl.repeat(None, order.height, dtype=pl.String, eager=True)
    # by_time[k]: the row of launch_order that comes k-th in (ts_ns, pid, launch_seq) order
    by_time = np.empty(order.height, dtype=np.int64)
    by_time[time_rank(order).to_numpy()] = np.arange(order.height)
    rows = order["_row"].to_numpy()[by_time]
    scan = launch_events(cap).select(_EVENT_COLUMNS).collect()
    if np.any(rows != np.arange(rows.size)):
        # launches stored out of time order: reordered (a gather of every row), before the
        # device columns join, which keeps this order
        scan = scan[rows]
    at = pl.Series(by_time)
    launches = scan.with_columns(
        order["launch_seq"].gather(at),
        named["name"].cast(pl.Categorical).gather(at).alias("name"),
        unknown.cast(pl.Categorical).gather(at).alias("_unknown"),
    )
    dev = device_executions(cap, tolerance_ns).collect()  # held in cap.cache: no copy
    dev_cols = ["pid", "launch_seq", "match", "launch_id", "device", "grid_id", "correlation_id",
                "gpu_start_ns", "gpu_end_ns", "dev_name", *_COUNTERS]
    if dev.height:
        # each matched execution claims one launch, (pid, launch_seq), a row of launch_order: its
        # columns are gathered onto the launches by that position, where a join of millions of
        # launches on (pid, launch_seq) would hash both sides
        pos = order_position(order, dev["pid"], dev["launch_seq"])
        matched = pos.is_not_null().to_numpy()
        of_launch = np.full(order.height, -1, dtype=np.int64)
        of_launch[pos.drop_nulls().to_numpy()] = np.flatnonzero(matched)
        at_dev = of_launch[by_time]
        take = pl.Series(at_dev).set(pl.Series(at_dev < 0), None)  # null: no execution claimed the launch
        launches = launches.hstack(dev.select(pl.col(dev_cols[2:]).gather(take)).get_columns())
        absent: list[pl.Expr] = []
    else:  # a host-only capture: nothing to join, and its device columns are null
        dev_schema = dev.select(dev_cols).collect_schema()
        launches = launches.with_columns(pl.lit(None, pl.String).alias("dev_name"))
        absent = [pl.lit(None, dev_schema[c]).alias(c) for c in dev_cols[2:] if c != "dev_name"]
    # the null columns of a host-only capture stay expressions until a reader selects one
    launches = launches.with_columns(
        pl.coalesce(pl.col("name").cast(pl.String), "dev_name", pl.col("_unknown").cast(pl.String)).alias("name")
    ).drop("_unknown", "dev_name")
    return launches, absent


def aggregate_launches(cap: Capture) -> pl.LazyFrame:
    """An --aggregate capture's launch counts, one row per (pid, kernel,
    shape, return code) with the kernel's name: the latest name seen for its
    handle, else unknown@0x<handle>.  Empty for a capture with events."""
    if cap.aggregate is None:
        return pl.DataFrame(schema={**schema.AGGREGATE_SCHEMA, "name": pl.String}).lazy()
    names = (
        cap.names.drop_nulls(["handle", "name"]).sort(pl.col("ts_ns").fill_null(0))
        .group_by("pid", "handle").agg(pl.col("name").last())
        .rename({"handle": "func"})
    )
    return (
        cap.aggregate.filter(pl.col("kind") == "launch")
        .join(names, on=["pid", "func"], how="left")
        .with_columns(pl.coalesce("name", pl.format("unknown@{}", hex_expr(pl.col("func")))).alias("name"))
    )
