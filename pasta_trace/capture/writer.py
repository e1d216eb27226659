"""The capture directory's Parquet files, written so that a killed tracer
leaves readable data.

Events go into one new file per flush interval (``events-00000.parquet``,
``events-00001.parquet``, ...): a Parquet file is only readable once its
footer is written, so each interval's file is written whole, to a hidden
temporary name, and renamed into place.  A SIGKILL loses at most the records
gathered since the last flush.  The small tables (names, processes,
libraries) are rewritten whole, atomically, whenever they change.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from .. import schema
from .decode import events_frame, names_frame

#: Flush interval: the issue allows 2 s between row groups; stay well inside it.
FLUSH_INTERVAL_S = 1.0
COMPRESSION = "lz4"


class CaptureWriter:
    def __init__(
        self,
        out_dir: Path,
        api_names: Sequence[str],
        *,
        owner: tuple[int, int] | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
    ):
        self.dir = Path(out_dir)
        self.api_names = list(api_names)
        self.owner = owner
        self.flush_interval_s = flush_interval_s
        self._pending_events: list[np.ndarray] = []
        self._pending_names: list[np.ndarray] = []
        self._all_names: list[np.ndarray] = []
        self._next_file = 0
        self._last_flush = time.monotonic()
        self.events = 0
        self.names = 0
        self.by_kind = np.zeros(len(schema.KIND_NAMES), dtype=np.int64)
        self.event_files: list[Path] = []
        self._comms: dict[int, str] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pasta-writer")
        self._jobs: list[Future] = []
        self.dir.mkdir(parents=True, exist_ok=True)
        self._chown(self.dir)

    # ------------------------------------------------------------------ input

    def add_events(self, recs: np.ndarray) -> None:
        if recs.size:
            self._pending_events.append(recs)
            self.events += int(recs.size)
            kinds = np.minimum(recs["kind"], len(schema.KIND_NAMES) - 1)
            self.by_kind += np.bincount(kinds, minlength=len(schema.KIND_NAMES))

    def add_names(self, recs: np.ndarray) -> None:
        if recs.size:
            self._pending_names.append(recs)
            self.names += int(recs.size)

    # ------------------------------------------------------------------ output

    def due(self) -> bool:
        return time.monotonic() - self._last_flush >= self.flush_interval_s

    def flush(self) -> None:
        """Write what arrived since the last flush, in this thread."""
        self._write(*self._take())

    def flush_async(self) -> None:
        """Hand what arrived since the last flush to the writer thread."""
        for job in [j for j in self._jobs if j.done()]:
            self._jobs.remove(job)
            job.result()  # a failed write surfaces here, not silently
        self._jobs.append(self._pool.submit(self._write, *self._take()))

    def close(self) -> None:
        """Wait for the writer thread to finish every flush handed to it."""
        self._pool.shutdown(wait=True)
        for job in self._jobs:
            job.result()
        self._jobs.clear()

    def _take(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        self._last_flush = time.monotonic()
        events, names = self._pending_events, self._pending_names
        self._pending_events, self._pending_names = [], []
        return events, names

    def _write(self, events: list[np.ndarray], names: list[np.ndarray]) -> None:
        if events:
            frame = events_frame(np.concatenate(events), self.api_names)
            path = self.dir / f"events-{self._next_file:05d}.parquet"
            self._next_file += 1
            self.write_frame(path, frame)
            self.event_files.append(path)
            for pid, comm in frame.select("pid", pl.col("comm").cast(pl.String)).unique().iter_rows():
                self._comms.setdefault(pid, comm)
        if names:
            self._all_names = [np.concatenate(self._all_names + names)]
            self.write_frame(self.dir / "names.parquet", names_frame(self._all_names[0], self.api_names))

    def pids_and_comms(self) -> list[tuple[int, str]]:
        """Each process seen in the events written so far, with its command name."""
        return list(self._comms.items())

    def names_table(self, extra: pl.DataFrame | None = None) -> pl.DataFrame:
        """Every name seen at run time, plus ``extra`` rows (offline naming)."""
        seen = (
            names_frame(self._all_names[0], self.api_names)
            if self._all_names
            else schema.empty_frame(schema.NAMES_SCHEMA)
        )
        if extra is None or extra.is_empty():
            return seen
        return pl.concat([seen, extra.select(seen.columns).cast(schema.NAMES_SCHEMA)], how="vertical")

    def write_frame(self, path: Path, frame: pl.DataFrame) -> None:
        """Write ``frame`` to ``path`` atomically (hidden temporary name, then rename)."""
        tmp = path.with_name(f".{path.name}.tmp")
        frame.write_parquet(tmp, compression=COMPRESSION, statistics=False)
        os.replace(tmp, path)
        self._chown(path)

    def _chown(self, path: Path) -> None:
        if self.owner is not None:
            os.chown(path, *self.owner)
