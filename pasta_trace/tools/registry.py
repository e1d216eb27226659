"""The one table of analyses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import polars as pl


@dataclass(frozen=True)
class Tool:
    name: str  # short id, used in CSV file names and --tool filters
    title: str  # heading in reports
    #: Capture -> frame (a capture directory or a merged timeline, pasta_trace.read.Capture)
    compute: Callable[..., pl.DataFrame]
    needs_device: bool = False  # True: empty result (and a note) without device data
    #: True: computes from an --aggregate capture's counts too; otherwise such a
    #: capture (no per-call events) gives an empty result and a note
    reads_aggregate: bool = False
    #: optional custom text renderer; default is a table of the frame
    render_text: Callable[[pl.DataFrame], str] | None = None
    description: str = ""
    #: columns worth a terminal's width (None: all); JSON, HTML and CSV keep every column
    terminal_columns: tuple[str, ...] | None = None


REGISTRY: dict[str, Tool] = {}


def register(tool: Tool) -> Tool:
    if tool.name in REGISTRY:
        raise ValueError(f"tool {tool.name!r} registered twice")
    REGISTRY[tool.name] = tool
    return tool
