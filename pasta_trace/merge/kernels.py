"""Kernel executions: one row per host launch event, with the device execution
matched to it (executions.py) and the kernel's name."""

from __future__ import annotations

import numpy as np
import polars as pl

from .. import schema
from ..hexfmt import hex_expr
from ..read import Capture
from .executions import TOLERANCE_NS, device_executions
from .graphs import GRAPH_COLUMNS, unknown_graph_names
from .launches import launch_events, launch_order, order_position, time_rank

_SCHEMA = schema.TIMELINE_FRAMES["kernels"]
#: the kernels columns read from the launch events themselves
_EVENT_COLUMNS = [k for k in _SCHEMA if (k in schema.EVENTS_SCHEMA and k not in schema.TENSOR_PAYLOAD.values())
                  or k in GRAPH_COLUMNS]
_COUNTERS = [k for k in schema.TIMELINE_FRAMES["kernels"] if k in schema.DEVICE_FRAMES["kernel_summaries"]
             and k not in ("pid", "launch_id")]


def kernel_names(cap: Capture, launches: pl.LazyFrame) -> pl.LazyFrame:
    """`launches` (pid, func, ts_ns, ...) with the kernel `name` of each: the
    latest handle->name seen before the launch, else any name of that handle
    (names found offline carry no time); null when none was seen.  Rows come
    back in another order.  `name` is a categorical: a few names for millions
    of launches, gathered as codes rather than copied as text."""
    names = cap.names.select("pid", pl.col("handle").alias("func"), pl.col("name").cast(pl.Categorical),
                             pl.col("ts_ns").fill_null(0).alias("name_ts")).drop_nulls(["func", "name"])
    graphs = unknown_graph_names(cap)
    if graphs.height:  # the launches of a graph whose kernels were not seen: graph@0x<exec>
        names = pl.concat([names, graphs.lazy().select(
            "pid", pl.col("handle").alias("func"), pl.col("name").cast(pl.Categorical),
            pl.lit(0, pl.Int64).alias("name_ts"))], how="vertical_relaxed")
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
    once = launches.filter(renamed.not_()).with_columns(pl.lit(None, pl.Categorical).alias("name"))
    return pl.concat([once, timed], how="vertical").with_columns(
        pl.coalesce("name", "_any_name").alias("name")
    ).drop("_any_name", "_names")


def kernel_executions(cap: Capture, tolerance_ns: int = TOLERANCE_NS) -> pl.LazyFrame:
    """One row per host launch event (schema.TIMELINE_FRAMES["kernels"]),
    worked out when called and held in memory: the frame returned only selects
    and casts (and gives a host-only capture's device columns as nulls).  Not
    kept in cap.cache, where it would outlive a reader that wants it once (an
    export): a reader that wants it again holds it (merge.held.with_merged)."""
    merged = cap.merged.get("kernels")
    if merged is not None:
        return merged
    rows, absent = _kernel_executions(cap, tolerance_ns)
    # a capture whose kernel summaries leave the counters out (a report's, which reads none)
    # gives kernels without them: a reader asking for one fails, none reads it as null
    have = {*rows.columns, *(e.meta.output_name() for e in absent)}
    return rows.lazy().with_columns(absent).select([pl.col(k).cast(v) for k, v in _SCHEMA.items() if k in have])


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
    # in one chunk, as the columns put beside it are: a frame of mixed chunkings is re-cut
    # into one chunk by every later select or with_columns (seconds at 10^7 over a report)
    scan = launch_events(cap).select(_EVENT_COLUMNS).collect().rechunk()
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
                "gpu_start_ns", "gpu_end_ns", "dev_name", "graph_id", "graph_node_id",
                *(c for c in _COUNTERS if c in dev.columns)]
    if dev.height:
        # CUPTI writes 0 for a kernel no graph ran: null on the timeline, as where no CUPTI record is
        dev = dev.with_columns(pl.when(pl.col("graph_id") != 0).then(pl.col(c)).alias(c)
                               for c in ("graph_id", "graph_node_id"))
        # each matched execution claims one launch, (pid, launch_seq), a row of launch_order: its
        # columns are gathered onto the launches by that position, where a join of millions of
        # launches on (pid, launch_seq) would hash both sides
        pos = order_position(order, dev["pid"], dev["launch_seq"])
        matched = pos.is_not_null().to_numpy()
        of_launch = np.full(order.height, -1, dtype=np.int64)
        of_launch[pos.drop_nulls().to_numpy()] = np.flatnonzero(matched)
        at_dev = of_launch[by_time]
        if at_dev.size == dev.height and np.array_equal(at_dev, np.arange(at_dev.size)):
            # every launch claimed, in order, by the execution in the same row: the columns
            # are shared with the device executions' frame, not copied (1.35 GiB at 9*10^6)
            launches = launches.hstack(dev.select(dev_cols[2:]).get_columns())
        else:
            take = pl.Series(at_dev).set(pl.Series(at_dev < 0), None)  # null: no execution claimed the launch
            launches = launches.hstack(dev.select(pl.col(dev_cols[2:]).gather(take)).get_columns())
        absent: list[pl.Expr] = []
    else:  # a host-only capture: nothing to join, and its device columns are null
        dev_schema = dev.select(dev_cols).collect_schema()
        launches = launches.with_columns(pl.lit(None, pl.Categorical).alias("dev_name"))
        absent = [pl.lit(None, dev_schema[c]).alias(c) for c in dev_cols[2:] if c != "dev_name"]
    # the null columns of a host-only capture stay expressions until a reader selects one
    launches = launches.with_columns(
        # coalesced as categoricals (one mapping for all), made text once
        pl.coalesce("name", "dev_name", "_unknown").cast(pl.String).alias("name")
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
