"""The events writer process: decodes ring records and writes events-NNNNN.parquet
(and communicators.parquet whenever an NCCL communicator is made or ended).

It runs apart from the tracer (``python -m pasta_trace.capture.output.event_writer
DIR_FD RING_FD LEDGER_FD``) so that decoding and compressing never hold the
GIL or the CPU that the drain needs to keep the BPF ring buffer from
overflowing.  The
tracer puts the records in a ring both processes map (capture.output.shared_ring)
and sends framed messages on stdin: a type byte, a u64 length, the payload.

    b"A"  JSON list of API names (first message)
    b"R"  RING_PART: records of schema.HOST_EVENT (plain or as laid out in the
          BPF ring) at this position of the shared ring (none: counts only)
    b"G"  JSON: guard the tracer's late-load stops too (guardian.watch_in_thread)
    b"W"  JSON: the events ring and loss counters to take over should the tracer
          die (capture.output.takeover)
    b"F"  write what arrived since the last flush
    b"S"  the same, then answer b"ok\\n" on stdout (a synchronous flush)
    b"C"  flush, answer a JSON line and exit: {"comms": {pid: comm}, "files": [...],
          "written": N, "unwritten": N, "by_kind": [N per schema.KIND_NAMES],
          "error": why the first failed write failed, or null,
          "held_peak_bytes": the most that waited unwritten}

Files are written by a thread while reading goes on
(EventFiles).  A writer behind a flood holds nothing of its own: the records
wait in the ring, and only when it is full does the tracer drop and count.
A file that cannot be written (a full disk) leaves nothing behind: its
records are counted as unwritten, and the next flush tries again.

Input that ends without b"C" is the tracer's death: what arrived is written,
then (given b"W") the events left in the kernel's ring too, and the manifest
is completed with every loss counted (capture.output.takeover); the exit code is 1.
What a guardian needs should this process die too, it publishes in the
ledger (capture.output.ledger): events it could not write, and what it took over.
"""

from __future__ import annotations

import io
import json
import os
import select
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl
import pyarrow.parquet as pq

from ... import schema
from ...safe_output import OutputDir
from ..procs import guardian, own_process, tracer_end
from . import takeover
from .collectives import CommunicatorTable, Sequencer
from .decode import events_frame
from .heap import keep_freed_memory
from .ledger import Ledger
from ..bpf.ringbuf import padded_dtype
from .shared_ring import SharedRing
from .tensor_sizes import TensorSizes

HEADER = struct.Struct("<cQ")
#: a b"R" message: where a batch of records lies in the shared ring (position, bytes, record size);
#: then, for a tracer that dies (capture.output.takeover): 1 if the next message holds the rest of this
#: batch, the batch's end in the kernel's events ring (0: not from there), the events the tracer
#: holds back and those it dropped so far (lost_writer_behind)
RING_PART = struct.Struct("<QQIIQQQ")
COMPRESSION = "lz4"
#: The process's nice value: below the traced program's threads, which it
#: should slow as little as it can (a writer behind loses nothing: the
#: records wait in the shared ring).
NICE = 5
#: Records per events file, at most (about 400,000): past it a file is begun
#: before the flush interval ends, and a backlog is written this much at a time.
FILE_BYTES = 64 << 20


#: rewritten whole whenever an NCCL communicator is made or ended
COMMUNICATORS = "communicators.parquet"


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def parquet_bytes(data: pl.DataFrame) -> io.BytesIO:
    """``data`` as a Parquet file in memory: times delta-encoded
    (schema.DELTA_ENCODED_COLUMNS), every other column dictionary-encoded, no
    statistics.  Arrow's writer: Polars' spent 6 ns an event on each all-null
    column, and most columns of a launch are null (docs/performance.md)."""
    delta = [c for c in schema.DELTA_ENCODED_COLUMNS if data.schema.get(c) == pl.Int64]
    buf = io.BytesIO()
    pq.write_table(data.to_arrow(), buf, compression=COMPRESSION, write_statistics=False,
                   use_dictionary=[c for c in data.columns if c not in delta],
                   column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED"))
    return buf


def write_events(out: OutputDir, name: str, events: pl.DataFrame) -> None:
    """An events file, as write_atomic writes it, without the columns that
    are null in every row of it (capture format 1.12): a file of launches has
    no `ptr`, `dst`, NCCL or tensor columns.  Arrow's writer spends about 4 ns
    a row on each all-null column (24 of a launch's 42: about 90 ns an event,
    a third of the encoding); readers insert them as nulls (parquet_scan).
    An empty frame keeps every column, so that an empty file still shows the
    schema."""
    null = [c for c, n in zip(events.columns, events.null_count().row(0)) if n == events.height]
    write_atomic(out, name, events.drop(null) if null and events.height else events)


def write_atomic(out: OutputDir, name: str, data: pl.DataFrame) -> None:
    """Write ``data`` to ``name`` in ``out`` via a new temporary file and a
    rename.  A failed write (ENOSPC, EIO, ...) raises OSError and leaves
    nothing behind."""
    def write(path: str) -> None:
        # encoded in memory, then written by us: a failed write is then the
        # OSError it is, not an encoder's error about its transport
        buf = parquet_bytes(data)
        with open(path, "wb") as f:
            f.write(buf.getbuffer())

    out.write_atomic(name, write)


def kind_counts(events: pl.DataFrame) -> np.ndarray:
    """Events per schema.KIND_NAMES: the decoded `kind` column's codes are
    their places there (an unknown kind decoded as other)."""
    return np.bincount(events["kind"].to_physical().to_numpy(), minlength=len(schema.KIND_NAMES))


class Input:
    """The framed messages of the tracer's pipe.  Given ``exiting`` (once the
    events ring can be taken over), the tracer's death is seen when it begins
    to exit, not when its last descriptor closes: a SIGKILLed tracer's uprobe
    links are released first, which takes seconds to a minute."""

    def __init__(self, fd: int = 0) -> None:
        self._fd = fd
        self._buf = bytearray()
        self._over = False

    def next(self, exiting: Callable[[], bool] | None = None) -> tuple[bytes, bytes] | None:
        """The next message (type, payload); None at the end of input, or once
        the tracer began to exit and every whole message it wrote was read."""
        while True:
            if len(self._buf) >= HEADER.size:
                kind, length = HEADER.unpack_from(self._buf)
                if len(self._buf) >= HEADER.size + length:
                    payload = bytes(self._buf[HEADER.size:HEADER.size + length])
                    del self._buf[:HEADER.size + length]
                    return kind, payload
            if self._over:
                return None  # a message its death cut short is left
            if select.select([self._fd], [], [], None if exiting is None else tracer_end.EXIT_POLL_S)[0]:
                data = os.read(self._fd, 1 << 16)
                if not data:
                    self._over = True
                self._buf += data
            elif exiting():
                # its threads are dying: what they wrote is in the pipe a moment later
                time.sleep(tracer_end.SETTLE_S)
                while select.select([self._fd], [], [], 0)[0] and (data := os.read(self._fd, 1 << 16)):
                    self._buf += data
                self._over = True


class EventFiles:
    """The events files of one capture.  Each file is written by a thread
    of its own while the main thread goes on reading the pipe.  Records that
    came through the ring shared with the tracer are decoded where they lie,
    and their space is released once their file is written (or counted
    unwritten)."""

    def __init__(self, out: OutputDir, release: Callable[[int], None] | None = None, ledger: Ledger | None = None):
        self._out = out
        self._release = release
        self._ledger = ledger
        self.api_names: list[str] = []
        self._pending: list[tuple[np.ndarray, int | None]] = []  # (records, their end in the ring)
        self._pending_bytes = 0
        self.held_peak_bytes = 0  # the most that waited unwritten
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self.files: list[str] = []
        self.comms: dict[int, str] = {}
        self.written = self.unwritten = 0
        self.by_kind = np.zeros(len(schema.KIND_NAMES), np.int64)
        self.error: str | None = None
        self._sizes = TensorSizes()  # files are written one after another: frees get their sizes in order
        self._sequencer = Sequencer()  # and collectives their numbers
        self._communicators = CommunicatorTable(socket.gethostname())

    def add(self, recs: np.ndarray, end: int | None = None) -> None:
        """Records to write; ``end``: their end position in the shared ring."""
        self._pending.append((recs, end))
        self._pending_bytes += recs.nbytes
        self.held_peak_bytes = max(self.held_peak_bytes, self._pending_bytes)
        if self._pending_bytes >= FILE_BYTES:
            self.flush()  # a file before the interval ends

    def flush(self) -> None:
        """Have what arrived written, FILE_BYTES of it at a time.  While a
        file is being written, what arrives waits (in the ring: a writer
        behind holds nothing of its own) and is taken by a later call."""
        if self._writing():
            return
        self.wait()
        if self._pending:
            self._thread = threading.Thread(target=self._write, args=(self._take_pending(),), name="pasta-events-file")
            self._thread.start()

    def finish(self) -> None:
        """Until everything that arrived is written (or counted unwritten)."""
        while self._pending or self._thread is not None:
            self.flush()
            self.wait()

    def wait(self) -> None:
        """Until the write in progress ended; raises what broke it (a bug: a full disk is counted)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            raise self._failure

    def _writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _take_pending(self) -> list[tuple[np.ndarray, int | None]]:
        """The oldest pending arrays, about FILE_BYTES of them (at least one),
        decoded piece by piece: a concatenation would copy them into new memory."""
        n, size = 0, 0
        while n < len(self._pending) and (n == 0 or size + self._pending[n][0].nbytes <= FILE_BYTES):
            size += self._pending[n][0].nbytes
            n += 1
        taken, self._pending = self._pending[:n], self._pending[n:]
        self._pending_bytes -= size
        return taken

    def _write(self, taken: list[tuple[np.ndarray, int | None]]) -> None:
        parts = [recs for recs, _ in taken]
        records = sum(p.size for p in parts)
        try:
            data = self._sizes.fill(events_frame(parts, self.api_names, self._sequencer))
            # one comm per process: a row of each, not every distinct pair cast to text
            for pid, comm in data.select("pid", "comm").unique(subset="pid", keep="any").with_columns(
                    pl.col("comm").cast(pl.String)).iter_rows():
                self.comms.setdefault(pid, comm)
            name = f"events-{len(self.files):05d}.parquet"
            try:
                write_events(self._out, name, data)
            except OSError as e:  # a full disk: keep the files written so far, count these
                self.unwritten += records
                if self._ledger is not None:
                    self._ledger.publish("UNWRITTEN", (self.unwritten,))
                self.error = self.error or (e.strerror or str(e))
                return
            self.files.append(name)
            self.written += records
            self.by_kind += kind_counts(data)
            self._write_communicators(data)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by wait()
            self._failure = e
        finally:
            ends = [end for _, end in taken if end is not None]
            if ends and self._release is not None:
                self._release(max(ends))

    def _write_communicators(self, data: pl.DataFrame) -> None:
        """Rewrite communicators.parquet if ``data`` made or ended one; on a
        full disk the file keeps its last version until the next change."""
        if not self._communicators.add(data):
            return
        try:
            write_atomic(self._out, COMMUNICATORS, self._communicators.rows)
        except OSError as e:
            self.error = self.error or (e.strerror or str(e))

    def reply(self) -> dict:
        return {"comms": self.comms, "files": self.files, "written": self.written, "unwritten": self.unwritten,
                "by_kind": self.by_kind.tolist(), "error": self.error, "held_peak_bytes": self.held_peak_bytes}


def main(argv: list[str]) -> int:
    own_process.mark()
    fd = int(argv[0])  # the capture directory, inherited open: every file is written relative to it
    ring = SharedRing(int(argv[1]))  # where the tracer puts the records (capture.output.shared_ring)
    ledger = Ledger(int(argv[2]))  # for a guardian, should we die too (capture.output.ledger)
    os.nice(NICE)
    keep_freed_memory()
    dtypes = {d.itemsize: d for d in (schema.HOST_EVENT.dtype, padded_dtype(schema.HOST_EVENT.dtype))}
    stdout = sys.stdout
    out = OutputDir(fd, Path(f"/proc/self/fd/{fd}"))
    files = EventFiles(out, ring.release, ledger)
    ring.prefault(0)
    take: takeover.Takeover | None = None
    batch: list[tuple[np.ndarray, int]] = []  # the parts of a batch whose last part has not come yet
    received = 0  # the events of whole batches
    pipe = Input()
    guard: threading.Thread | None = None
    while True:
        msg = pipe.next(take.tracer_exiting if take is not None else None)
        if msg is None:
            # the tracer died: keep what we have, the ring's records included (a batch cut
            # short by its death is left: its records are still in the kernel's ring)
            files.finish()
            if take is not None:
                take.drain_to_end(files.add, received)
                files.finish()
                takeover.writer_completes(out, files, take)
            if guard is not None:
                guard.join()  # it resumes what the tracer held stopped: our exit would end it
            return 1
        kind, payload = msg
        if kind == b"A":
            files.api_names = json.loads(payload)
        elif kind == b"R":
            pos, nbytes, size, more, bpf_end, held, dropped = RING_PART.unpack(payload)
            if nbytes:
                batch.append((ring.view(pos, nbytes, dtypes[size]), pos + nbytes))
                ring.prefault(pos + nbytes)
            if not more:
                for recs, end in batch:
                    files.add(recs, end)
                    received += recs.size
                batch.clear()
                if take is not None:
                    take.seen(bpf_end, held, dropped)
        elif kind == b"G":
            guard = guardian.watch_in_thread(json.loads(payload))
        elif kind == b"W":
            try:
                take = takeover.Takeover.open(json.loads(payload), ledger)
            except OSError:
                take = None  # the maps are gone already: the tracer is ending
        elif kind == b"F":
            files.flush()
        elif kind == b"S":
            files.finish()
            stdout.write("ok\n")
            stdout.flush()
        elif kind == b"C":
            files.finish()
            stdout.write(json.dumps(files.reply()) + "\n")
            stdout.flush()
            return 0
        else:
            raise ValueError(f"unknown message {kind!r}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
