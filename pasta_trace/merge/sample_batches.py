"""The access samples read by Arrow's reader: the merge's pass that is also their check.

The samples' file is the one whose pages are not decoded at open
(parquet_scan.DEFERRED): Polars trusts what a page header says, Arrow's
reader checks it, so this pass decodes the columns it reads with Arrow's
reader, counting each one's nulls on the way, and once every page of them
has decoded they count as checked (device_frames.DeviceFrames.checked).
The merge then decodes the samples once, not twice (the check at open,
then the pass), and the columns it does not read not at all.

Row groups are shared out among READ_THREADS threads, each with a reader of
its own (one reader serializes its reads), as the check at open does; each
thread turns its batches into the pass's keys (`keys`, numpy, most of it
outside the GIL) and copies them into the batch all the threads fill
together (`_Batches`), handed on through a queue of one.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..parquet_scan import ARROW_ERRORS, CHECK_BUFFER, first_line, row_group_batches

#: threads reading row groups (each holds a batch and its keys)
READ_THREADS = 4
#: rows of each batch Arrow's reader decodes
READ_ROWS = 1 << 18

Keys = Callable[[dict[str, pa.Array]], tuple[np.ndarray, np.ndarray]]


class Damaged(Exception):
    """A page of the file does not decode: `why` says so as the check at open would."""

    def __init__(self, path: Path, err: BaseException) -> None:
        self.path = path
        self.why = f"{path}: damaged Parquet data ({first_line(err)})"
        super().__init__(self.why)


def values(a: pa.Array, fill: int = 0) -> np.ndarray:
    """A column's values as numpy, `fill` where null (no copy when none is)."""
    if a.null_count:
        a = a.fill_null(fill)
    return a.to_numpy(zero_copy_only=False)


class _Batches:
    """The batches the reading threads fill together, in arrays of `rows`
    keys reused from batch to batch (a fresh 32 MiB array faults in every
    page: about 0.5 ms a MiB here).  A thread reserves room in the batch
    being filled, copies its keys there outside the lock, and whoever
    completes the batch hands it on: the first batch is out when `rows`
    samples are read, whichever threads read them.  At most `most` pairs of
    arrays are made; then `add` waits for one given back."""

    def __init__(self, rows: int, most: int, hand_on: Callable[[tuple], bool], stop: threading.Event) -> None:
        self.rows, self.most, self.made = rows, most, 0
        self.hand_on, self.stop = hand_on, stop
        self.free: queue.SimpleQueue = queue.SimpleQueue()
        self.lock = threading.Lock()
        self.filling: list | None = None  # [hk, wk, reserved, written]

    def _fresh(self) -> list | None:
        if self.made < self.most and self.free.empty():
            self.made += 1
            return [np.empty(self.rows, np.uint64), np.empty(self.rows, np.uint64), 0, 0]
        while not self.stop.is_set():
            try:
                hk, wk = self.free.get(timeout=0.1)
                return [hk, wk, 0, 0]
            except queue.Empty:
                continue
        return None

    def add(self, hk: np.ndarray, wk: np.ndarray) -> bool:
        """Copy these keys into the batches; False once stopped."""
        i = 0
        while i < hk.size:
            with self.lock:
                if self.filling is None and (fresh := self._fresh()) is not None:
                    self.filling = fresh
                b = self.filling
                if b is None:
                    return False
                lo = b[2]
                m = min(hk.size - i, self.rows - lo)
                b[2] += m
                if b[2] == self.rows:
                    self.filling = None
            b[0][lo:lo + m] = hk[i:i + m]
            b[1][lo:lo + m] = wk[i:i + m]
            i += m
            with self.lock:
                b[3] += m
                full = b[3] == self.rows
            if full and not self._out(b, self.rows):
                return False
        return True

    def last(self) -> bool:
        """Hand on the batch being filled (every thread done with it)."""
        b, self.filling = self.filling, None
        return b is None or not b[2] or self._out(b, b[2])

    def _out(self, b: list, n: int) -> bool:
        hk, wk = b[0], b[1]
        return self.hand_on((hk[:n], wk[:n], lambda: self.free.put((hk, wk))))


def key_batches(path: Path, columns: list[str], batch_rows: int, keys: Keys, nulls: dict[str, int],
                held: int) -> Iterator[tuple[np.ndarray, np.ndarray, Callable[[], None]]]:
    """(hk, wk, done) of each batch of `batch_rows` rows (the last one
    fewer) of `path`, in no set order, where `keys(columns)` gives a
    batch's hk and wk from its `columns`; `done()` says the caller is
    through with the two arrays, at most `held` batches at a time.  `nulls`
    gets each of `columns`' nulls once every page of them decoded.  Raises
    Damaged for a page that does not decode; what `keys` raises passes.

    Arrow's batches are small (READ_ROWS: their columns and keys stay in the
    caches, 0.4 CPU s less than batches of 4 M rows for 10^7 samples); their
    keys are gathered into the reused arrays of one batch of `batch_rows`."""
    groups = pq.ParquetFile(path).num_row_groups  # the footer was checked at open
    threads = max(1, min(os.cpu_count() or 1, READ_THREADS, groups))
    out: queue.Queue = queue.Queue(maxsize=1)
    stop = threading.Event()
    counts: list[dict[str, int]] = [{} for _ in range(threads)]
    finished = [0]

    def put(item: object) -> bool:
        while not stop.is_set():
            try:
                out.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    # one being filled, one waiting in the queue, `held` with the caller
    batches = _Batches(batch_rows, 2 + held, put, stop)

    def read(k: int) -> None:
        try:
            r = pq.ParquetFile(path, buffer_size=CHECK_BUFFER)
            for g in range(k, groups, threads):
                for b in row_group_batches(r, g, READ_ROWS, columns):
                    cols = dict(zip(columns, b.columns))
                    for name, col in cols.items():
                        counts[k][name] = counts[k].get(name, 0) + col.null_count
                    if not batches.add(*keys(cols)):
                        return
            with batches.lock:
                finished[0] += 1
                last = finished[0] == threads
            if last and not batches.last():
                return
            put(None)
        except ARROW_ERRORS as e:
            put(Damaged(path, e))
        except BaseException as e:  # noqa: BLE001 - handed to the reading thread, raised there
            put(e)

    workers = [threading.Thread(target=read, args=(k,), daemon=True) for k in range(threads)]
    for w in workers:
        w.start()
    try:
        running = threads
        while running:
            item = out.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        stop.set()
        for w in workers:
            w.join()
        pa.default_memory_pool().release_unused()
    nulls.update({name: sum(c.get(name, 0) for c in counts) for name in set().union(*counts)})
