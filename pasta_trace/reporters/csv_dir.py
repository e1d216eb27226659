"""CSV files (`export --format csv`): `events.csv` (every API call) plus one
`<tool>.csv` per registered analysis, in one directory.

CSV holds flat values only: list columns are written as JSON arrays, structs
as JSON objects, binary as hex, categoricals as their strings, and handles and
addresses as 0x... (pasta_trace.hexfmt), as every other output spells them.
"""

from __future__ import annotations

from typing import Iterable

import polars as pl

from .. import merge, schema
from ..hexfmt import hex_expr
from ..read import Capture
from ..safe_output import OutputDir
from ..tools.run import ToolResult
from .results import Results

#: events columns that hold a handle or an address
EVENT_HANDLES = ("stream", "func", "ptr", "dst", "src", "communicator", "comm_id")


def flat(frame: pl.DataFrame, handles: Iterable[str] = ()) -> pl.DataFrame:
    """`frame` with every nested or binary column turned into text, and the
    `handles` columns into 0x... (nulls stay null)."""
    handles = set(handles)
    out = []
    for name, dtype in frame.schema.items():
        col = pl.col(name)
        if name in handles:
            text = hex_expr(col)
        elif isinstance(dtype, pl.Struct):
            text = col.struct.json_encode()
        elif isinstance(dtype, (pl.List, pl.Array)):
            # JSON-encode through a one-field struct, then drop the field's key
            text = pl.struct(col).struct.json_encode().str.strip_prefix(f'{{"{name}":').str.strip_suffix("}")
        elif dtype == pl.Binary:
            text = col.bin.encode("hex")
        else:
            out.append(col)
            continue
        out.append(pl.when(col.is_not_null()).then(text).alias(name))
    return frame.select(out)


def events(cap: Capture) -> pl.LazyFrame:
    """The capture's events, with `kernel` (the name of the kernel a launch
    names; null where no name was seen) after `func`, and handles in hex."""
    ev = cap.events.with_row_index("_row")
    named = merge.kernel_names(cap, ev.filter(pl.col("func").is_not_null()).select("_row", "pid", "func", "ts_ns"))
    cols = list(schema.EVENTS_SCHEMA)
    cols.insert(cols.index("func") + 1, "kernel")
    return (
        ev.join(named.select("_row", kernel="name"), on="_row", how="left", maintain_order="left")
        .with_columns(hex_expr(pl.col(c)).alias(c) for c in EVENT_HANDLES)
        .select(cols)
    )


def write_tables(cap: Capture, results: list[ToolResult], out: OutputDir) -> None:
    """events.csv, then one CSV per tool result, into `out`.  Each file is
    written to a temporary and renamed, so a reader never sees half a file."""
    out.write_atomic("events.csv", events(cap).sink_csv)  # streams: the capture may be larger than memory
    for r in results:
        handles = [c for c, col in r.tool.columns.items() if col.unit == "handle"]
        out.write_atomic(f"{r.tool.name}.csv", flat(r.frame, handles).write_csv)


def notes(results: list[ToolResult]) -> list[str]:
    """One line per reason why some tables hold only their header
    (ToolResult.note: no device data, or an --aggregate capture's counts)."""
    by_note: dict[str, list[str]] = {}
    for r in results:
        if r.note:
            by_note.setdefault(r.note, []).append(r.tool.name)
    return [f"note: {', '.join(names)}: header only ({note})" for note, names in by_note.items()]


class CsvReporter:
    def render(self, results: Results, out: OutputDir) -> None:
        write_tables(results.cap, results.tools, out)
