"""CSV export: `events.csv` (every API call) plus one `<tool>.csv` per registered
analysis, in one directory.

CSV holds flat values only: list columns are written as JSON arrays, structs
as JSON objects, binary as hex, categoricals as their strings.
"""

from __future__ import annotations

import polars as pl

from ..read import Capture
from ..safe_output import OutputDir
from ..tools.run import ToolResult


def flat(frame: pl.DataFrame) -> pl.DataFrame:
    """`frame` with every nested or binary column turned into text (nulls stay null)."""
    out = []
    for name, dtype in frame.schema.items():
        col = pl.col(name)
        if isinstance(dtype, pl.Struct):
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


def write_tables(cap: Capture, results: list[ToolResult], out: OutputDir) -> None:
    """events.csv, then one CSV per tool result, into `out`.  Each file is
    written to a temporary and renamed, so a reader never sees half a file."""
    out.write_atomic("events.csv", cap.events.sink_csv)  # streams: the capture may be larger than memory
    for r in results:
        out.write_atomic(f"{r.tool.name}.csv", flat(r.frame).write_csv)


def notes(results: list[ToolResult]) -> list[str]:
    """One line per reason why some tables hold only their header
    (ToolResult.note: no device data, or an --aggregate capture's counts)."""
    by_note: dict[str, list[str]] = {}
    for r in results:
        if r.note:
            by_note.setdefault(r.note, []).append(r.tool.name)
    return [f"note: {', '.join(names)}: header only ({note})" for note, names in by_note.items()]
