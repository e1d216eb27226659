"""A tool's frame as a terminal table that fits the terminal's width.

Numbers and hex are never wrapped or cut, and headers wrap only between words.
When the columns do not fit, headers wrap first; then the least telling
columns (GIVE_WAY) are left out; then names are cut with an ellipsis (kernel
names keep their start, call sites their end: file:line and function); and
only then are more columns left out, from the right.  The caption says which."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

import polars as pl
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..tools.render import Column, format_frame

GAP = 2  # blanks between two columns
#: a name cut shorter than this says little: below it, columns are left out instead
TEXT_MIN = 12
WRAP_MIN = 30
#: columns left out first when a table is wider than the terminal, in this order
GIVE_WAY = (
    "launches_per_s", "shapes", "top_block", "api_mean_ns", "mean_blocked_ns", "launch_to_start_max_ns",
    "last_ts_ns", "first_ts_ns", "top_grid", "gpus", "failed_calls", "tid", "stream", "pages_spanned",
    "accessed_bytes",
)


@dataclass(frozen=True)
class Fitted:
    columns: list[Column]
    widths: list[int]
    left_out: list[str]  # headers of the columns that did not fit


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def _cells_width(c: Column) -> int:
    return max((len(s) for s in c.cells), default=0)


def _snug(c: Column) -> int:
    """Every cell whole, the header wrapped between words."""
    return max(_cells_width(c), _longest_word(c.header), 1)


def _floor(c: Column) -> int:
    """As narrow as the column may get: numbers whole, names cut to TEXT_MIN,
    wrapped text in lines of WRAP_MIN."""
    if c.cut is None:
        return _snug(c)
    return max(_longest_word(c.header), min(_cells_width(c), WRAP_MIN if c.cut == "wrap" else TEXT_MIN), 1)


def _total(widths: list[int]) -> int:
    return sum(widths) + GAP * (len(widths) - 1)


def fit(columns: list[Column], width: int) -> Fitted:
    """Column widths that fit `width` (see the module's docstring)."""
    cols = list(columns)
    left_out: list[str] = []

    def drop(i: int) -> None:
        left_out.append(cols.pop(i).header)

    def give_way(measure) -> bool:
        """Leave out the first GIVE_WAY column present, while `measure` is too wide."""
        names = [c.name for c in cols]
        i = next((names.index(n) for n in GIVE_WAY if n in names[1:]), None)
        if i is None or _total([measure(c) for c in cols]) <= width:
            return False
        drop(i)
        return True

    while give_way(_snug):  # the least telling columns go before any name is cut
        pass
    while len(cols) > 1 and _total([_floor(c) for c in cols]) > width:
        if not give_way(_floor):
            drop(len(cols) - 1)
    widths = [_snug(c) for c in cols]
    # names too wide: cut the widest name one character at a time
    while _total(widths) > width:
        cut = [i for i, c in enumerate(cols) if c.cut is not None and widths[i] > _floor(c)]
        if not cut:
            break
        widths[max(cut, key=lambda i: widths[i])] -= 1
    # room to spare: unwrap headers, those that need the least room first
    spare = width - _total(widths)
    for i in sorted(range(len(cols)), key=lambda i: len(cols[i].header) - widths[i]):
        need = len(cols[i].header) - widths[i]
        if 0 < need <= spare:
            widths[i] += need
            spare -= need
    return Fitted(cols, widths, left_out)


def cut(text: str, width: int, where: str | None) -> str:
    if len(text) <= width or where in (None, "wrap"):
        return text
    if width <= 1:
        return "…"[:width]
    return "…" + text[len(text) - width + 1:] if where == "start" else text[: width - 1] + "…"


def table(df: pl.DataFrame, title: str, t0: int | None, limit: int, width: int) -> RenderableType:
    """The title, the first `limit` rows of `df` in `width` columns, and a
    caption saying what was left out."""
    fitted = fit(format_frame(df, t0, limit), width)
    t = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 0, 0, GAP - 1),
              header_style="bold")
    for c, w in zip(fitted.columns, fitted.widths):
        header = "\n".join(textwrap.wrap(c.header, w, break_long_words=False)) or c.header
        t.add_column(header, justify="right" if c.numeric else "left", no_wrap=c.cut != "wrap", overflow="fold",
                     width=w)
    for i in range(min(df.height, limit)):
        # Text, not str: kernel names like `k<float[4]>` are not rich markup
        t.add_row(*(Text(cut(c.cells[i], w, c.cut)) for c, w in zip(fitted.columns, fitted.widths)))
    notes = []
    if df.height > limit:
        notes.append(f"{limit} of {df.height} rows (--limit to see more)")
    if fitted.left_out:
        notes.append(f"not shown at {width} columns: {', '.join(fitted.left_out)} (--json has every column)")
    parts: list[RenderableType] = [Text(title, style="bold"), t]
    parts += [Text(n, style="dim") for n in notes]
    return Group(*parts)
