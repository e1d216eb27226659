"""Plain-text rendering shared by the tools and `report`: one rich table per frame,
with numbers made readable by column naming convention:

* ``*ts_ns`` (and ``gpu_start_ns``/``gpu_end_ns``): absolute CLOCK_MONOTONIC
  timestamps, shown relative to the capture start as ``+1.234567 s``;
* other ``*_ns``: durations (``12.3 µs``);
* ``*bytes``, ``size``, ``*_size``: byte counts (``1.5 MiB``);
* addresses and handles (``ADDRESS_COLUMNS``): hex;
* ``*share``: a fraction, shown as a percentage.
"""

from __future__ import annotations

import polars as pl
from rich.table import Table
from rich.text import Text

ADDRESS_COLUMNS = frozenset(
    {"base", "ptr", "alloc_base", "host_addr", "src", "dst", "stream", "func", "prefetch_ptr"}
)
TIMESTAMP_COLUMNS = frozenset({"gpu_start_ns", "gpu_end_ns"})


def is_timestamp(col: str) -> bool:
    return col.endswith("ts_ns") or col in TIMESTAMP_COLUMNS


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_ns(n: float) -> str:
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}" if unit != "s" else f"{n / scale:.3f} s"
    return f"{n:.0f} ns"


def cell(col: str, value: object, t0: int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if is_timestamp(col):
            return f"+{(value - (t0 or 0)) / 1e9:.6f} s"
        if col.endswith("_ns"):
            return human_ns(value)
        if col.endswith("bytes") or col == "size" or col.endswith("_size"):
            return human_bytes(value)
        if col in ADDRESS_COLUMNS:
            return f"0x{int(value):x}"
        if col.endswith("share"):
            return f"{value * 100:.1f}%"
        if isinstance(value, float):
            return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"
    return str(value)


def table(df: pl.DataFrame, title: str | None = None, t0: int | None = None, limit: int = 20) -> Table:
    t = Table(title=title, title_justify="left", header_style="bold")
    for c in df.columns:
        # headers wrap at word breaks
        t.add_column(c.replace("_", " "), justify="right" if df.schema[c].is_numeric() else "left", overflow="fold")
    for row in df.head(limit).iter_rows():
        # Text, not str: kernel names like `k<float[4]>` are not rich markup
        t.add_row(*(Text(cell(c, v, t0)) for c, v in zip(df.columns, row)))
    if df.height > limit:
        t.caption = f"{limit} of {df.height} rows (--limit to see more)"
    return t
