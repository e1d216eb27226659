"""The one table of analyses, and the declared output schema of each.

Every tool's compute function declares the frame it returns with `returns`:
one `Column` (dtype, unit, meaning) per column, in order.  The declaration
is the function's "Columns:" docstring, what `Tool.columns` gives the
reporters (units for headers, handles as hex in CSV), and what
tests/unit/test_tool_schemas.py checks every compute() result against."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

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
    #: declared with `returns`
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


REGISTRY: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    if tool.name in REGISTRY:
        raise ValueError(f"tool {tool.name!r} registered twice")
    if not isinstance(getattr(tool.compute, "columns", None), dict):
        raise ValueError(f"tool {tool.name!r}: its compute function declares no columns (tools.registry.returns)")
    missing = set(tool.terminal_columns or ()) - set(tool.columns)
    if missing:
        raise ValueError(f"tool {tool.name!r}: terminal_columns not declared: {', '.join(sorted(missing))}")
    REGISTRY[tool.name] = tool
    return tool
