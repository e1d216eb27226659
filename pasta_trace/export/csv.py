"""CSV export: `events.csv` (every API call) plus one `<tool>.csv` per registered
analysis, in one directory.

CSV holds flat values only: list columns are written as JSON arrays, structs
as JSON objects, binary as hex, categoricals as their strings.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import polars as pl

from ..read import Capture
from ..tools.run import ToolResult, run_tools


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


def write(cap: Capture, out_dir: Path, publish: Callable[[Path, Path], None],
          names: list[str] | None = None) -> list[ToolResult]:
    """events.csv, then one CSV per tool, into `out_dir`.  Each file is written
    beside its final name and handed to `publish(tmp, final)`, which renames
    it, so a reader never sees half a file.  Returns the tools' results."""
    tmp = out_dir / ".events.csv.tmp"
    cap.events.sink_csv(tmp)  # streams: the capture may be larger than memory
    publish(tmp, out_dir / "events.csv")
    results = run_tools(cap, names)
    for r in results:
        final = out_dir / f"{r.tool.name}.csv"
        tmp = out_dir / f".{final.name}.tmp"
        flat(r.frame).write_csv(tmp)
        publish(tmp, final)
    return results
