"""The one table of analyses, and the declared output schema of each.

Every tool is declared once, on its compute function, with `@tool(name,
title, columns, ...)`: the frame it returns (one `Column` (dtype, unit,
meaning) per column, in order) and what the reports need to show it.  The
columns are the function's "Columns:" docstring, what `Tool.columns` gives
the reporters (units for headers, handles as hex in CSV), and what
tests/unit/test_tool_schemas.py checks every compute() result against.
`in_order` makes the declared tools one table, in the order reports show
them (tools.REGISTRY)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

import polars as pl

#: unit -> what a value in that unit is
UNITS: dict[str, str] = {
    "": "a name, label or id",
    "count": "how many (calls, launches, pages, ...)",
    "ns": "nanoseconds: a duration",
    "ts": "ns of CLOCK_MONOTONIC: a point in time",
    "bytes": "bytes",
    "handle": "an address or handle: 0x... in tables and CSV",
    "share": "a fraction of 1",
    "1/s": "per second",
    "GB/s": "bytes per ns",
}


@dataclass(frozen=True)
class Column:
    dtype: pl.DataType
    unit: str  # a key of UNITS
    doc: str

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"unknown unit {self.unit!r}; one of {', '.join(map(repr, UNITS))}")


Columns = dict[str, Column]


def columns(*specs: tuple[str, pl.DataType, str, str]) -> Columns:
    """(name, dtype, unit, meaning) per column, in the frame's order."""
    return {name: Column(dtype, unit, doc) for name, dtype, unit, doc in specs}


#: columns many tools share
PID = ("pid", pl.UInt32, "", "process id")
TID = ("tid", pl.UInt32, "", "thread id")
TOP_CALL_SITE = ("top_call_site", pl.String, "",
                 "the Python line (file:line function) with the most of this row's weight; null: none of its calls "
                 "had a stack")

F = TypeVar("F", bound=Callable[..., pl.DataFrame])


def returns(cols: Columns) -> Callable[[F], F]:
    """Declare the frame `fn` returns: kept as `fn.columns`, and written out
    as the "Columns:" section of its docstring."""
    def wrap(fn: F) -> F:
        lines = [f"    {name} ({c.dtype}{', ' + c.unit if c.unit else ''}): {c.doc}" for name, c in cols.items()]
        fn.__doc__ = (fn.__doc__ or "").rstrip() + "\n\n    Columns:\n" + "\n".join("    " + ln for ln in lines) + "\n"
        fn.columns = cols  # type: ignore[attr-defined]
        return fn
    return wrap


@dataclass(frozen=True)
class Tool:
    name: str  # short id, used in CSV file names and --tool filters
    title: str  # heading in reports
    #: Capture -> frame (a capture directory or a merged timeline, pasta_trace.read.Capture),
    #: its columns declared by `tool` (`returns`)
    compute: Callable[..., pl.DataFrame]
    needs_device: bool = False  # True: empty result (and a note) without device data
    #: True: computes from an --aggregate capture's counts too; otherwise such a
    #: capture (no per-call events) gives an empty result and a note
    reads_aggregate: bool = False
    #: True: reads only tensor events (PyTorch, libc10.so); empty (and a note) without them
    needs_tensors: bool = False
    #: optional custom text renderer; default is a table of the frame
    render_text: Callable[[pl.DataFrame], str] | None = None
    description: str = ""
    #: columns worth a terminal's width (None: all); JSON, HTML and CSV keep every column
    terminal_columns: tuple[str, ...] | None = None

    @property
    def columns(self) -> Columns:
        """The declared output: column -> Column(dtype, unit, doc)."""
        return self.compute.columns  # type: ignore[attr-defined]


#: every tool declared with `tool`, by name, in the order their modules were
#: imported: `in_order` puts them in the reports' order
_DECLARED: dict[str, Tool] = {}


def tool(
    name: str,
    title: str,
    cols: Columns,
    *,
    needs_device: bool = False,
    reads_aggregate: bool = False,
    needs_tensors: bool = False,
    render_text: Callable[[pl.DataFrame], str] | None = None,
    description: str = "",
    terminal_columns: tuple[str, ...] | None = None,
) -> Callable[[F], F]:
    """Declare the decorated compute function a tool (the fields of `Tool`),
    returning the frame `cols` describes (as `returns`).  The function is
    left as it is, callable on its own."""
    def wrap(fn: F) -> F:
        if name in _DECLARED:
            raise ValueError(f"tool {name!r} registered twice")
        missing = set(terminal_columns or ()) - set(cols)
        if missing:
            raise ValueError(f"tool {name!r}: terminal_columns not declared: {', '.join(sorted(missing))}")
        returns(cols)(fn)
        _DECLARED[name] = Tool(name=name, title=title, compute=fn, needs_device=needs_device,
                               reads_aggregate=reads_aggregate, needs_tensors=needs_tensors, render_text=render_text,
                               description=description, terminal_columns=terminal_columns)
        return fn
    return wrap


def in_order(names: Sequence[str]) -> dict[str, Tool]:
    """The declared tools, as one table in the order of `names`, which names
    each of them once: a tool left out of a report would go unseen."""
    unknown = [n for n in names if n not in _DECLARED]
    left_out = [n for n in _DECLARED if n not in names]
    twice = sorted({n for n in names if list(names).count(n) > 1})
    for what, which in (("no such tool", unknown), ("not in the order", left_out), ("named twice", twice)):
        if which:
            raise ValueError(f"tools {what}: {', '.join(which)}")
    return {n: _DECLARED[n] for n in names}
