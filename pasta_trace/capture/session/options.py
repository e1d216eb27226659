"""What a capture is asked to do (Options) and what it produced (Result)."""

from __future__ import annotations

import os
import re
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from ... import schema
from ..output import manifest as mf

DEFAULT_BUFFER_PAGES = 4096  # 16 MiB: ~115k events, ~0.1 s of a 1 M calls/s flood
MIN_NAMES_PAGES = 64
DEFAULT_STACK_PAGES = 256  # 1 MiB for new stacks only (~1 KiB each at depth 64): identical ones are not resent
DEFAULT_NATIVE_PAGES = 2048  # 8 MiB: ~1000 native stacks (8 KiB each, one per event) between drains
#: A BPF ring buffer's size is its map's max_entries, a u32 that must be a
#: power of two (kernel/bpf/ringbuf.c): 2 GiB at most (2 GiB loads, 4 GiB
#: wraps to 0 in BCC's BPF_RINGBUF_OUTPUT and fails to compile).
MAX_RING_PAGES = (1 << 31) // os.sysconf("SC_PAGE_SIZE")

#: files a capture writes; --force removes these (and only these) first
CAPTURE_FILES = ("manifest.json", "events-*.parquet", "names.parquet", "processes.parquet",
                 "libraries.parquet", "aggregate.parquet", "stacks.parquet", "communicators.parquet", "device")


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
    aggregate_max: int = schema.DEFAULT_AGGREGATE_MAX  # rows of the --aggregate map
    verbose: bool = False
    device: str | None = None
    stacks: bool = True  # the caller's Python stack on every event (--no-stacks: off)
    stack_depth: int = schema.DEFAULT_STACK_DEPTH
    stack_pages: int = DEFAULT_STACK_PAGES
    native_stacks: str | None = None  # --native-stacks: "default" or "all"; None: off
    native_pages: int = DEFAULT_NATIVE_PAGES
    bpf_cache: bool = True  # compiled handlers from the cache (probes.compiled_cache); --no-bpf-cache: off

    @property
    def native_stacks_loaded(self) -> str | None:
        """The native-stack setting the BPF program has, None when off (--aggregate keeps no events)."""
        return self.native_stacks if not self.aggregate else None

    @property
    def stack_depth_loaded(self) -> int | None:
        """Frames the BPF walker keeps, None when it is not loaded (--aggregate keeps no events)."""
        return self.stack_depth if self.stacks and not self.aggregate else None

    @property
    def settings(self) -> dict[str, int]:
        """The value of each option a loss's remedy raises (schema.Loss.flag)."""
        return {"--buffer-pages": self.buffer_pages, "--stack-buffer-pages": self.stack_pages,
                "--aggregate-max": self.aggregate_max, "--native-stack-buffer-pages": self.native_pages}


def names_pages(buffer_pages: int) -> int:
    """The names ring grows with --buffer-pages (1/64 of it, 64 pages at least),
    so that raising --buffer-pages also cures lost names."""
    return max(MIN_NAMES_PAGES, buffer_pages // 64)


@dataclass
class Result:
    out_dir: Path
    manifest: mf.Manifest
    by_kind: dict[str, int]
    events: int
    names: pl.DataFrame
    exit_code: int | None = None
    messages: list[str] = field(default_factory=list)
    #: why a write into the capture failed (a full disk), None when all went to disk
    write_error: str | None = None
    #: False when even the final manifest could not be written
    manifest_written: bool = True


def default_out_dir() -> Path:
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    return Path(f"pasta-{host}-{time.strftime('%Y%m%dT%H%M%S')}")
