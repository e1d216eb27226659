"""Transfers: copy bytes and API time by direction, storms of small copies, and
the same host range copied again and again; each also by Python line (call
site)."""

from __future__ import annotations

import polars as pl

from ..call_result import done
from ..read import Capture
from .common import measured_sum
from .registry import PID, TID, TOP_CALL_SITE, columns, tool
from .render import human_bytes, human_ns
from .sites import NO_STACK, with_site, with_top_site

#: Copies at or below this size are dominated by per-call latency, not bandwidth.
SMALL_COPY_BYTES = 64 * 1024
#: Small copies on one thread closer together than this belong to the same storm.
STORM_GAP_NS = 1_000_000
#: A run of small copies counts as a storm from this many copies on.
STORM_MIN_COPIES = 32


_SITE = ("call_site", pl.String, "", "the Python line that copied; (no stack): none")
_DIRECTION = ("direction", pl.String, "", "h2d, d2h, d2d, peer, h2h, or default (unified addressing)")
_VOLUME = (
    ("copies", pl.UInt32, "count", "copy calls"),
    ("bytes", pl.UInt64, "bytes", "bytes copied"),
    ("api_ns", pl.Int64, "ns", "time in the copy API, where measured"),
    ("small_copies", pl.UInt32, "count", f"copies of at most {human_bytes(SMALL_COPY_BYTES)}"),
    ("mean_bytes", pl.Float64, "bytes", "mean bytes per copy"),
    ("api_gb_per_s", pl.Float64, "GB/s", "bytes over API time; meaningful for blocking copies only"),
)
TRANSFERS = columns(PID, _DIRECTION, *_VOLUME, TOP_CALL_SITE)
TRANSFER_SITES = columns(PID, _SITE, _DIRECTION, *_VOLUME)
STORMS = columns(
    PID, TID,
    ("start_ts_ns", pl.Int64, "ts", "first copy of the run"),
    ("end_ts_ns", pl.Int64, "ts", "end of its last copy"),
    ("span_ns", pl.Int64, "ns", "end minus start"),
    ("copies", pl.UInt32, "count", "copies in the run"),
    ("bytes", pl.UInt64, "bytes", "bytes they copied"),
    ("api_ns", pl.Int64, "ns", "time in the copy API, where measured"),
    ("directions", pl.String, "", "their directions, comma-separated"),
    TOP_CALL_SITE,
)
_HOST_RANGE = (
    ("host_addr", pl.UInt64, "handle", "host address: source of h2d, destination of d2h"),
    ("size", pl.UInt64, "bytes", "bytes per copy"),
)
REPEATED = columns(
    PID, _DIRECTION, *_HOST_RANGE,
    ("copies", pl.UInt32, "count", "copies of this range in this direction"),
    ("repeated_bytes", pl.UInt64, "bytes", "(copies - 1) x size: bytes copied again"),
    ("first_ts_ns", pl.Int64, "ts", "first copy"),
    ("last_ts_ns", pl.Int64, "ts", "last copy"),
    ("api_ns", pl.Int64, "ns", "time in the copy API, where measured"),
    TOP_CALL_SITE,
)
REPEATED_SITES = columns(
    PID, _SITE, _DIRECTION,
    ("repeats", pl.UInt32, "count", "copies of a host range this process had copied in this direction before"),
    ("repeated_bytes", pl.UInt64, "bytes", "their bytes"),
    ("ranges", pl.UInt32, "count", "distinct host ranges (address, size) among them"),
    ("api_ns", pl.Int64, "ns", "time in the copy API for them, where measured"),
)


def _copies(cap: Capture, no_stack: str | None = None) -> pl.LazyFrame:
    """Copies that did not fail (a failed copy moved no bytes), with their call site."""
    return with_site(cap.events.filter((pl.col("kind") == "memcpy") & done()), cap, no_stack).with_columns(
        pl.col("copy_kind").cast(pl.String).alias("direction")
    )


def _volume(copies: pl.LazyFrame, keys: list[str]) -> pl.LazyFrame:
    return (
        copies.group_by(keys)
        .agg(
            pl.len().alias("copies"),
            pl.col("size").sum().alias("bytes"),
            measured_sum(pl.col("dur_ns")).alias("api_ns"),
            (pl.col("size") <= SMALL_COPY_BYTES).sum().alias("small_copies"),
            pl.col("size").mean().alias("mean_bytes"),
        )
        # bytes per API nanosecond = GB/s; only meaningful for blocking copies
        .with_columns(pl.when(pl.col("api_ns") > 0).then(pl.col("bytes") / pl.col("api_ns")).alias("api_gb_per_s"))
    )


@tool("transfers", "Transfers by direction", TRANSFERS,
      description="copies, bytes, API time and small copies per process and direction (h2d, d2h, d2d, ...)",
      terminal_columns=("pid", "direction", "copies", "bytes", "api_ns", "small_copies", "mean_bytes", "api_gb_per_s",
                        "top_call_site"))
def transfers_by_direction(cap: Capture) -> pl.DataFrame:
    """Per process and direction, most bytes first."""
    keys = ["pid", "direction"]
    copies = _copies(cap)
    return (
        with_top_site(_volume(copies, keys), copies, keys, pl.col("size").sum(), pl.len())
        .sort(["pid", "bytes", "direction"], descending=[False, True, False])
        .collect(engine="streaming")
    )


@tool("transfer_call_sites", "Transfers by call site", TRANSFER_SITES,
      description="copies, bytes and API time per Python line and direction",
      terminal_columns=("pid", "call_site", "direction", "copies", "bytes", "api_ns", "small_copies"))
def transfers_by_call_site(cap: Capture) -> pl.DataFrame:
    """Per process, Python line and direction, most bytes first."""
    return (
        _volume(_copies(cap, NO_STACK), ["pid", "call_site", "direction"])
        .sort(["bytes", "copies", "pid", "call_site", "direction"], descending=[True, True, False, False, False])
        .collect(engine="streaming")
    )


@tool("copy_storms",
      f"Small-copy storms (<= {human_bytes(SMALL_COPY_BYTES)}, >= {STORM_MIN_COPIES} copies, "
      f"gaps <= {human_ns(STORM_GAP_NS)})",
      STORMS,
      description="runs of small copies on one thread in quick succession: batch them into one copy",
      terminal_columns=("pid", "tid", "start_ts_ns", "span_ns", "copies", "bytes", "api_ns", "directions",
                        "top_call_site"))
def copy_storms(
    cap: Capture,
    small_bytes: int = SMALL_COPY_BYTES,
    gap_ns: int = STORM_GAP_NS,
    min_copies: int = STORM_MIN_COPIES,
) -> pl.DataFrame:
    """Runs of small copies on one thread, each within `gap_ns` of the
    previous one, most copies first."""
    small = _copies(cap).filter(pl.col("size") <= small_bytes).sort(["pid", "tid", "ts_ns"])
    runs = small.with_columns(
        (pl.col("ts_ns").diff().over(["pid", "tid"]).fill_null(gap_ns + 1) > gap_ns)
        .cum_sum()
        .alias("storm")
    )
    keys = ["pid", "tid", "storm"]
    summary = (
        runs.group_by(keys)
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
    )
    return (
        with_top_site(summary, runs, keys, pl.len(), pl.col("size").sum())
        .select(list(STORMS))
        .sort(["copies", "pid", "start_ts_ns"], descending=[True, False, False])
        .collect(engine="streaming")
    )


def _host_copies(cap: Capture, no_stack: str | None = None) -> pl.LazyFrame:
    """Copies with a host side: h2d (source) and d2h (destination)."""
    host = (
        pl.when(pl.col("direction") == "h2d").then(pl.col("src"))
        .when(pl.col("direction") == "d2h").then(pl.col("dst"))
    )
    return _copies(cap, no_stack).with_columns(host.alias("host_addr")).filter(pl.col("host_addr").is_not_null())


@tool("repeated_copies", "Same host range copied repeatedly", REPEATED,
      description="host ranges (address, size) copied more than once in one direction, by bytes copied again",
      terminal_columns=("pid", "direction", "host_addr", "size", "copies", "repeated_bytes", "api_ns", "top_call_site"))
def repeated_copies(cap: Capture) -> pl.DataFrame:
    """The same host range (address and size) copied more than once in the same
    direction: candidates for keeping the data on the device.  Most bytes
    copied again first."""
    keys = ["pid", "direction", "host_addr", "size"]
    copies = _host_copies(cap)
    summary = (
        copies.group_by(keys)
        .agg(
            pl.len().alias("copies"),
            pl.col("ts_ns").min().alias("first_ts_ns"),
            pl.col("ts_ns").max().alias("last_ts_ns"),
            measured_sum(pl.col("dur_ns")).alias("api_ns"),
        )
        .filter(pl.col("copies") > 1)
        .with_columns(((pl.col("copies") - 1) * pl.col("size")).alias("repeated_bytes"))
    )
    return (
        with_top_site(summary, copies, keys, pl.len())
        .select(list(REPEATED))
        .sort(["repeated_bytes", "pid", "host_addr"], descending=[True, False, False])
        .collect(engine="streaming")
    )


@tool("repeated_copy_call_sites", "Host ranges copied again, by call site", REPEATED_SITES,
      description="copies of a host range copied before in that direction, per Python line that made them")
def repeated_copies_by_call_site(cap: Capture) -> pl.DataFrame:
    """The copies that copied a host range again (every copy of a range in a
    direction after its first), by the Python line that made them: the line
    to change to keep the data on the device."""
    repeats = (
        _host_copies(cap, NO_STACK)
        .sort("ts_ns", "tid", maintain_order=True)
        .filter(pl.int_range(pl.len()).over("pid", "direction", "host_addr", "size") > 0)
    )
    return (
        repeats.group_by("pid", "call_site", "direction")
        .agg(
            pl.len().alias("repeats"),
            pl.col("size").sum().alias("repeated_bytes"),
            pl.struct("host_addr", "size").n_unique().alias("ranges"),
            measured_sum(pl.col("dur_ns")).alias("api_ns"),
        )
        .sort(["repeated_bytes", "pid", "call_site", "direction"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )
