"""What a capture is asked to do (Options) and what it produced (Result)."""

from __future__ import annotations

import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from .. import schema
from . import manifest as mf

DEFAULT_BUFFER_PAGES = 4096  # 16 MiB: ~115k events, ~0.1 s of a 1 M calls/s flood
NAMES_PAGES = 64
DEFAULT_STACK_PAGES = 256  # 1 MiB for new stacks only (~1 KiB each at depth 64): identical ones are not resent
DEFAULT_NATIVE_PAGES = 2048  # 8 MiB: ~1000 native stacks (8 KiB each, one per event) between drains

#: files a capture writes; --force removes these (and only these) first
CAPTURE_FILES = ("manifest.json", "events-*.parquet", "names.parquet", "processes.parquet",
                 "libraries.parquet", "aggregate.parquet", "stacks.parquet", "device")


@dataclass
class Options:
    mode: str  # pid | system | launch
    out_dir: Path
    command_line: list[str]
    pids: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    duration: float | None = None
    force: bool = False
    buffer_pages: int = DEFAULT_BUFFER_PAGES
    aggregate: bool = False
    verbose: bool = False
    device: str | None = None
    stacks: bool = True  # the caller's Python stack on every event (--no-stacks: off)
    stack_depth: int = schema.DEFAULT_STACK_DEPTH
    stack_pages: int = DEFAULT_STACK_PAGES
    native_stacks: str | None = None  # --native-stacks: "default" or "all"; None: off
    native_pages: int = DEFAULT_NATIVE_PAGES

    @property
    def native_stacks_loaded(self) -> str | None:
        """The native-stack setting the BPF program has, None when off (--aggregate keeps no events)."""
        return self.native_stacks if not self.aggregate else None

    @property
    def stack_depth_loaded(self) -> int | None:
        """Frames the BPF walker keeps, None when it is not loaded (--aggregate keeps no events)."""
        return self.stack_depth if self.stacks and not self.aggregate else None


@dataclass
class Result:
    out_dir: Path
    manifest: mf.Manifest
    lost: tuple[int, int, int]
    by_kind: dict[str, int]
    events: int
    names: pl.DataFrame
    exit_code: int | None = None
    messages: list[str] = field(default_factory=list)


def default_out_dir() -> Path:
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    return Path(f"pasta-{host}-{time.strftime('%Y%m%dT%H%M%S')}")
