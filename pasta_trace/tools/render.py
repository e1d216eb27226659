"""How the tools' columns read to a person, shared by the terminal and HTML
reports.  A column's name says what its numbers are:

* ``*ts_ns`` (and ``gpu_start_ns``/``gpu_end_ns``): absolute CLOCK_MONOTONIC
  timestamps, shown in seconds after the capture's start (the one time origin
  of every table and chart);
* other ``*_ns``: durations;
* ``*bytes``, ``size``, ``*_size``: byte counts;
* addresses and handles (``ADDRESS_COLUMNS``): hex;
* ``*share``: a fraction, shown as a percentage.

A column is shown in one unit, chosen from its largest value and named in its
header ("blocked (ms)"), so that its cells line up and compare at a glance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import polars as pl

ADDRESS_COLUMNS = frozenset(
    {"base", "ptr", "alloc_base", "host_addr", "src", "dst", "stream", "func", "prefetch_ptr", "communicator", "comm_id"}
)
TIMESTAMP_COLUMNS = frozenset({"gpu_start_ns", "gpu_end_ns"})
#: text that is no use cut short: wrapped instead
WRAP_COLUMNS = frozenset({"advice", "cmdline"})

#: Headers for columns whose name alone reads badly; others are the name with
#: its unit suffix dropped and "_" as spaces.
HEADERS = {
    "comm": "process", "cmdline": "command line", "container_id": "container", "api": "API",
    "api_calls": "calls", "failed_calls": "failed", "device_alloc_bytes": "device alloc",
    "pinned_alloc_bytes": "pinned alloc", "peak_live_bytes": "peak live",
    "copy_bytes": "copied", "sync_ns": "blocked", "gpus": "GPUs", "gpu_ids": "GPU ids",
    "first_ts_ns": "first at", "last_ts_ns": "last at", "ret": "code", "name": "kernel", "display_name": "kernel",
    "launches_per_s": "launches/s", "api_ns": "API time", "api_mean_ns": "API mean", "gpu_ns": "GPU time",
    "gpu_mean_ns": "GPU mean", "peak_bytes": "peak", "peak_ts_ns": "peak at", "end_bytes": "end",
    "alloc_ts_ns": "allocated at", "age_ns": "age", "small_copies": "small copies", "mean_bytes": "mean size",
    "api_gb_per_s": "API GB/s", "start_ts_ns": "start at", "end_ts_ns": "end at", "host_addr": "host address",
    "repeated_bytes": "copied again", "blocked_ns": "blocked", "max_blocked_ns": "longest",
    "mean_blocked_ns": "mean", "share": "share", "call_site": "call site", "allocated_bytes": "allocated",
    "copied_bytes": "copied", "freed_bytes": "freed", "held_bytes": "held", "live_bytes": "live",
    "leaked_bytes": "leaked", "idle_share": "idle", "max_gap_ns": "longest gap",
    "launch_to_start_mean_ns": "start delay", "launch_to_start_max_ns": "max start delay", "device": "GPU",
    "launch_id": "launch", "ws_bytes": "working set", "accessed_bytes": "accessed",
    "unattributed_pages": "pages outside", "alloc_base": "base", "alloc_size": "size", "alloc_api": "API",
    "pages_touched": "pages touched", "pages_spanned": "pages spanned", "touched_share": "touched",
    "first_launch_id": "first launch", "page_first": "first page", "page_last": "last page",
    "prefetch_ptr": "prefetch at", "delta_bytes": "change", "api_live_bytes": "API live", "ts_ns": "at",
}

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
_TIME_UNITS = (("s", 1e9), ("ms", 1e6), ("µs", 1e3), ("ns", 1.0))


def is_timestamp(col: str) -> bool:
    return col.endswith("ts_ns") or col in TIMESTAMP_COLUMNS


def is_bytes(col: str) -> bool:
    return col.endswith("bytes") or col == "size" or col.endswith("_size")


def human_bytes(n: float) -> str:
    for unit in _BYTE_UNITS:
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_ns(n: float) -> str:
    for unit, scale in _TIME_UNITS[:3]:
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}" if unit != "s" else f"{n / scale:.3f} s"
    return f"{n:.0f} ns"


def seconds_after(ts: float, t0: int | None) -> str:
    """A timestamp as seconds after the time origin, to the microsecond."""
    return f"{(ts - (t0 or 0)) / 1e9:.6f}"


@dataclass(frozen=True)
class Column:
    """One column as a person reads it."""

    name: str  # the frame's column
    header: str  # "blocked (ms)": what it is, then the unit its cells are in
    cells: list[str]  # "-" where the value is null
    numeric: bool  # right-aligned; never wrapped or cut
    #: text too wide for its column: "end" cuts it at its end (names), "start"
    #: at its start (call sites: "file:line function" keep their end), "wrap"
    #: wraps it (code to copy, command lines); None: numbers, never cut
    cut: str | None


def scale(col: str, top: float) -> tuple[str, float, int]:
    """(unit, divisor, decimals) for a duration or byte column whose largest
    absolute value is `top`."""
    if is_bytes(col):
        i = 0
        while i + 1 < len(_BYTE_UNITS) and top >= 1024 ** (i + 1):
            i += 1
        return _BYTE_UNITS[i], 1024.0**i, 0 if i == 0 else 1
    unit, scale = next(((u, s) for u, s in _TIME_UNITS if top >= s), _TIME_UNITS[-1])
    return unit, scale, 0 if unit == "ns" else 2


def header_of(col: str) -> str:
    if col in HEADERS:
        return HEADERS[col]
    base = col
    for suffix in ("_ts_ns", "_ns", "_bytes", "_share"):
        if base.endswith(suffix) and base != suffix.lstrip("_"):
            base = base[: -len(suffix)]
            break
    return base.replace("_", " ")


def format_column(col: str, values: pl.Series, t0: int | None) -> Column:
    """`values` of column `col` as cells in one unit, named in the header."""
    numeric = values.dtype.is_numeric()
    # a GPU index, or a tensor's device by name ("cpu", "cuda:0")
    name = "device" if col == "device" and not numeric else header_of(col)
    raw = values.to_list()
    present = [v for v in raw if v is not None]

    def cells(fmt) -> list[str]:
        return ["-" if v is None else fmt(v) for v in raw]

    if not numeric or values.dtype == pl.Boolean:
        cut = "start" if col in ("call_site", "top_call_site") else "wrap" if col in WRAP_COLUMNS else "end"
        return Column(col, name, cells(str), False, cut)
    if is_timestamp(col):
        return Column(col, f"{name} (s)", cells(lambda v: seconds_after(v, t0)), True, None)
    if col in ADDRESS_COLUMNS:
        return Column(col, name, cells(lambda v: f"0x{int(v):x}"), True, None)
    if col.endswith("share"):
        return Column(col, f"{name} (%)", cells(lambda v: f"{v * 100:.1f}"), True, None)
    if col.endswith("_ns") or is_bytes(col):
        unit, div, places = scale(col, max((abs(v) for v in present), default=0))
        # more decimals (up to 3) when the smallest value would otherwise read as 0.0
        least = min((abs(v) / div for v in present if v), default=1.0)
        if places and least < 1:
            places = max(places, min(3, 1 - math.floor(math.log10(least))))
        # an exact zero reads as 0, not 0.00
        return Column(col, f"{name} ({unit})", cells(lambda v: f"{v / div:.{places}f}" if v else "0"), True, None)
    if values.dtype.is_float():
        return Column(col, name, cells(lambda v: f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"), True, None)
    return Column(col, name, cells(str), True, None)


def format_frame(df: pl.DataFrame, t0: int | None, limit: int | None = None) -> list[Column]:
    """The first `limit` rows of every column of `df` that has a value in
    some row, formatted; columns empty in every row say nothing and are left out."""
    shown = df if limit is None else df.head(limit)
    return [format_column(c, shown[c], t0) for c in df.columns if df[c].null_count() < df.height]
