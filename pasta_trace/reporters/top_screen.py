"""`top`'s screen: what a refresh counted, as lines that fit the terminal.

Rates (calls per second over the last refresh) and the memory held now are
two groups of columns, each header short and with its unit; numbers are
humanized to three significant digits (2.04k, 12.0 MiB) and never cut.  When
the columns do not fit, those that have shown nothing but zeros since the
start go first, then the least telling (DROP_ORDER); a line says which.
The totals since the start are a line of their own, below the table."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import polars as pl

GAP = 2  # blanks between two columns


@dataclass(frozen=True)
class Col:
    header: str
    source: str  # the column of the frame: a count of the interval (a rate) or bytes held now
    group: str  # "rate" | "held" | "id"
    unit: str  # "count" | "bytes" | "text" (left-aligned) | "id" (a number shown whole)


COLUMNS = (
    Col("PID", "pid", "id", "id"),
    Col("COMMAND", "comm", "id", "text"),
    Col("launch/s", "launches", "rate", "count"),
    Col("alloc/s", "allocs", "rate", "count"),
    Col("copy/s", "copies", "rate", "count"),
    Col("copy B/s", "copy_bytes", "rate", "bytes"),
    Col("sync/s", "syncs", "rate", "count"),
    Col("tensor/s", "tensor_allocs", "rate", "count"),
    Col("NCCL/s", "nccl_calls", "rate", "count"),
    Col("fail/s", "failed", "rate", "count"),
    Col("device", "device_bytes", "held", "bytes"),
    Col("pinned", "pinned_bytes", "held", "bytes"),
    Col("tensors", "tensor_bytes", "held", "bytes"),
)
#: left out first when the columns do not fit, in this order (after those that showed only zeros)
DROP_ORDER = ("pinned", "NCCL/s", "sync/s", "copy/s", "fail/s", "copy B/s", "alloc/s", "tensor/s", "tensors",
              "device", "COMMAND", "launch/s")
GROUPS = {"rate": ("calls per second", "per second", "/s"), "held": ("held now", "held")}
_BYTE_UNITS = ("KiB", "MiB", "GiB", "TiB", "PiB")


def rate(x: float) -> str:
    """A rate to three significant digits: 0.5, 42, 999, 1.23k, 45.6k, 789k, 1.23M."""
    if x < 9.95:
        return f"{x:.1f}" if x else "0"
    if x < 999.5:
        return f"{x:.0f}"
    for unit in ("k", "M", "G"):
        x /= 1000
        if x < 999.5 or unit == "G":
            return f"{x:.{2 if x < 9.995 else 1 if x < 99.95 else 0}f}{unit}"
    raise AssertionError("unreachable")


def size(n: float) -> str:
    """Bytes to three significant digits: 512 B, 1.50 KiB, 12.0 MiB, 768 MiB."""
    if n < 1024:
        return f"{n:.0f} B"
    for unit in _BYTE_UNITS:
        n /= 1024
        if n < 1023.5 or unit == _BYTE_UNITS[-1]:
            return f"{n:.{2 if n < 9.995 else 1 if n < 99.95 else 0}f} {unit}"
    raise AssertionError("unreachable")


def count(n: int) -> str:
    """A total: exact below 10,000, then like a rate (12.3k)."""
    return f"{n:,}" if n < 10_000 else rate(float(n))


@dataclass(frozen=True)
class Screen:
    lines: list[str]
    left_out: list[str]  # headers of the columns that did not fit


def table_frame(interval: pl.DataFrame, held: pl.DataFrame, dt: float, comms: dict[int, str]) -> pl.DataFrame:
    """One row per process: the interval's counts as per-second rates, the
    bytes held now, and its command; busiest first."""
    counts = [c.source for c in COLUMNS if c.group == "rate"]
    held_cols = [c.source for c in COLUMNS if c.group == "held"]
    both = interval.join(held, on="pid", how="full", coalesce=True)
    for c in counts + held_cols:
        if c not in both.columns:
            both = both.with_columns(pl.lit(0, pl.UInt64).alias(c))
    return (
        both.with_columns(pl.col(counts).fill_null(0).cast(pl.Float64) / dt, pl.col(held_cols).fill_null(0))
        .with_columns(pl.col("pid").replace_strict(comms, default="?", return_dtype=pl.String).alias("comm"))
        .sort(["launches", "pid"], descending=[True, False])
        .select("pid", "comm", *counts, *held_cols)
    )


def _cells(frame: pl.DataFrame, c: Col) -> list[str]:
    values = frame[c.source].to_list()
    if c.unit in ("text", "id"):
        return [str(v) for v in values]
    if c.group == "rate":
        return [size(v) if c.unit == "bytes" else rate(v) for v in values]
    return [size(v) for v in values]


def render(frame: pl.DataFrame, *, width: int, height: int | None, title: str, totals: str, ever: set[str],
           notes: list[str]) -> Screen:
    """The screen for `width` columns (and `height` lines, when known).
    ``ever``: the sources that have been non-zero since the start."""
    cols = list(COLUMNS)
    cells = {c.header: _cells(frame, c) for c in cols}
    widths = {c.header: max([len(c.header), *map(len, cells[c.header])]) for c in cols}

    def total() -> int:
        return sum(widths[c.header] for c in cols) + GAP * (len(cols) - 1)

    left_out: list[str] = []
    order = [c.header for c in cols[::-1] if c.group != "id" and c.source not in ever] + list(DROP_ORDER)
    for header in order:
        if total() <= width or len(cols) == 1:
            break
        if header in [c.header for c in cols]:
            cols = [c for c in cols if c.header != header]
            left_out.append(header)

    def line(parts: list[str]) -> str:
        return (" " * GAP).join(parts).rstrip()

    def justify(c: Col, text: str) -> str:
        return text.ljust(widths[c.header]) if c.unit == "text" else text.rjust(widths[c.header])

    def wrapped(texts: list[str]) -> list[str]:
        return [part for text in texts for part in textwrap.wrap(text, width, break_long_words=False) or [""]]

    lines = textwrap.wrap(title, width) or [""]
    lines.append(_group_line(cols, widths))
    lines.append(line([justify(c, c.header) for c in cols]))
    rows = frame.height
    foot = list(notes)
    if left_out:
        foot.append(f"not shown at {width} columns: {', '.join(left_out)} (a wider terminal, or `top | cat`, "
                    "shows them)")
    shown = rows
    # the rows that fit above the totals and the notes, one line left for the cursor
    if height is not None and len(lines) + rows + len(wrapped([totals, *foot])) >= height:
        more = "{} more processes not shown (a taller terminal shows them)"
        room = height - 1 - len(lines) - len(wrapped([totals, more.format(rows), *foot]))
        shown = min(rows, max(1, room))
        foot.insert(0, more.format(rows - shown))
    for i in range(shown):
        lines.append(line([justify(c, cells[c.header][i]) for c in cols]))
    if rows == 0:
        lines.append("(no traced call in the last refresh)")
    lines += wrapped([totals, *foot])
    return Screen(lines, left_out)


def _group_line(cols: list[Col], widths: dict[str, int]) -> str:
    """The group names above their columns, each within its columns' span."""
    out = ""
    at = 0
    for group in ("id", "rate", "held"):
        span = [c for c in cols if c.group == group]
        start = at
        at += sum(widths[c.header] for c in span) + GAP * len(span)
        if group == "id" or not span:
            continue
        room = at - start - GAP
        label = next((g for g in GROUPS[group] if len(g) <= room), "")
        out = out.ljust(start) + label.center(room).rstrip()
    return out.rstrip()


def totals_line(totals: pl.DataFrame, since: str) -> str:
    """The calls counted since the start, over every process."""
    t = {c: int(totals[c].sum()) for c in totals.columns if c != "pid"} if totals.height else {}

    def g(name: str) -> int:
        return t.get(name, 0)

    parts = [f"{count(g('launches'))} launches", f"{count(g('allocs'))} allocs", f"{count(g('frees'))} frees",
             f"{count(g('copies'))} copies ({size(g('copy_bytes'))})", f"{count(g('syncs'))} syncs",
             f"{count(g('tensor_allocs'))} tensor allocs", f"{count(g('tensor_frees'))} tensor frees",
             f"{count(g('nccl_calls'))} NCCL calls ({size(g('nccl_bytes'))})", f"{count(g('failed'))} failed"]
    return f"since {since}: " + ", ".join(parts)


def plain_lines(frame: pl.DataFrame, stamp: str) -> list[str]:
    """One line per process, every column with its exact value (for logs and pipes)."""
    names = {c.source: ("comm" if c.source == "comm" else c.source + ("/s" if c.group == "rate" else "")
                        if c.group != "held" else "held_" + c.source) for c in COLUMNS}
    out = []
    for row in frame.iter_rows(named=True):
        out.append(stamp + " " + " ".join(
            f"{names[k]}={v:.1f}" if isinstance(v, float) else f"{names[k]}={v}" for k, v in row.items()))
    return out
