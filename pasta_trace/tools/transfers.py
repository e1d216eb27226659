"""Transfers: copy bytes and API time by direction, storms of small copies, and
the same host range copied again and again."""

from __future__ import annotations

import polars as pl

from ..call_result import done
from ..read import Capture
from .exprs import measured_sum
from .render import human_bytes, human_ns
from .registry import Tool

#: Copies at or below this size are dominated by per-call latency, not bandwidth.
SMALL_COPY_BYTES = 64 * 1024
#: Small copies on one thread closer together than this belong to the same storm.
STORM_GAP_NS = 1_000_000
#: A run of small copies counts as a storm from this many copies on.
STORM_MIN_COPIES = 32


def _copies(cap: Capture) -> pl.LazyFrame:
    """Copies that did not fail (a failed copy moved no bytes)."""
    return cap.events.filter((pl.col("kind") == "memcpy") & done()).with_columns(
        pl.col("copy_kind").cast(pl.String).alias("direction")
    )


def transfers_by_direction(cap: Capture) -> pl.DataFrame:
    return (
        _copies(cap)
        .group_by("pid", "direction")
        .agg(
            pl.len().alias("copies"),
            pl.col("size").sum().alias("bytes"),
            measured_sum(pl.col("dur_ns")).alias("api_ns"),
            (pl.col("size") <= SMALL_COPY_BYTES).sum().alias("small_copies"),
            pl.col("size").mean().alias("mean_bytes"),
        )
        # bytes per API nanosecond = GB/s; only meaningful for blocking copies
        .with_columns(pl.when(pl.col("api_ns") > 0).then(pl.col("bytes") / pl.col("api_ns")).alias("api_gb_per_s"))
        .sort(["pid", "bytes", "direction"], descending=[False, True, False])
        .collect(engine="streaming")
    )


def copy_storms(
    cap: Capture,
    small_bytes: int = SMALL_COPY_BYTES,
    gap_ns: int = STORM_GAP_NS,
    min_copies: int = STORM_MIN_COPIES,
) -> pl.DataFrame:
    """Runs of small copies on one thread, each within `gap_ns` of the previous one."""
    small = _copies(cap).filter(pl.col("size") <= small_bytes).sort(["pid", "tid", "ts_ns"])
    runs = small.with_columns(
        (pl.col("ts_ns").diff().over(["pid", "tid"]).fill_null(gap_ns + 1) > gap_ns)
        .cum_sum()
        .alias("storm")
    )
    return (
        runs.group_by("pid", "tid", "storm")
        .agg(
            pl.len().alias("copies"),
            pl.col("ts_ns").min().alias("start_ts_ns"),
            (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("end_ts_ns"),
            pl.col("size").sum().alias("bytes"),
            measured_sum(pl.col("dur_ns")).alias("api_ns"),
            pl.col("direction").unique().sort().str.join(",").alias("directions"),
        )
        .filter(pl.col("copies") >= min_copies)
        .with_columns((pl.col("end_ts_ns") - pl.col("start_ts_ns")).alias("span_ns"))
        .select("pid", "tid", "start_ts_ns", "end_ts_ns", "span_ns", "copies", "bytes", "api_ns", "directions")
        .sort(["copies", "pid", "start_ts_ns"], descending=[True, False, False])
        .collect(engine="streaming")
    )


def repeated_copies(cap: Capture) -> pl.DataFrame:
    """The same host range (address and size) copied more than once in the same
    direction: candidates for keeping the data on the device."""
    host = (
        pl.when(pl.col("direction") == "h2d").then(pl.col("src"))
        .when(pl.col("direction") == "d2h").then(pl.col("dst"))
    )
    return (
        _copies(cap)
        .with_columns(host.alias("host_addr"))
        .filter(pl.col("host_addr").is_not_null())
        .group_by("pid", "direction", "host_addr", "size")
        .agg(
            pl.len().alias("copies"),
            pl.col("ts_ns").min().alias("first_ts_ns"),
            pl.col("ts_ns").max().alias("last_ts_ns"),
            measured_sum(pl.col("dur_ns")).alias("api_ns"),
        )
        .filter(pl.col("copies") > 1)
        .with_columns(((pl.col("copies") - 1) * pl.col("size")).alias("repeated_bytes"))
        .select("pid", "direction", "host_addr", "size", "copies", "repeated_bytes", "first_ts_ns", "last_ts_ns", "api_ns")
        .sort(["repeated_bytes", "pid", "host_addr"], descending=[True, False, False])
        .collect(engine="streaming")
    )


TOOLS = [
    Tool(
        name="transfers",
        title="Transfers by direction",
        compute=transfers_by_direction,
        description="copies, bytes, API time and small copies per process and direction (h2d, d2h, d2d, ...)",
    ),
    Tool(
        name="copy_storms",
        title=(
            f"Small-copy storms (<= {human_bytes(SMALL_COPY_BYTES)}, >= {STORM_MIN_COPIES} copies, "
            f"gaps <= {human_ns(STORM_GAP_NS)})"
        ),
        compute=copy_storms,
        description="runs of small copies on one thread in quick succession: batch them into one copy",
        terminal_columns=(
            "pid", "tid", "start_ts_ns", "span_ns", "copies", "bytes", "api_ns", "directions",
        ),
    ),
    Tool(
        name="repeated_copies",
        title="Same host range copied repeatedly",
        compute=repeated_copies,
        description="host ranges (address, size) copied more than once in one direction, by bytes copied again",
        terminal_columns=(
            "pid", "direction", "host_addr", "size", "copies", "repeated_bytes", "api_ns",
        ),
    ),
]
