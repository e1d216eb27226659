"""The events writer process: decodes ring records and writes events-NNNNN.parquet
(and communicators.parquet whenever an NCCL communicator is made or ended).

It runs apart from the tracer (``python -m pasta_trace.capture.event_writer
DIR_FD``, at lower priority) so that decoding and compressing never hold the GIL or the
CPU that the drain needs to keep the ring buffer from overflowing.  It reads
framed messages on stdin: a type byte, a u64 length, the payload.

    b"A"  JSON list of API names (first message)
    b"E"  raw records: schema.HOST_EVENT, plain or as laid out in the ring
    b"F"  write what arrived since the last flush
    b"S"  the same, then answer b"ok\\n" on stdout (a synchronous flush)
    b"C"  flush, answer a JSON line and exit: {"comms": {pid: comm}, "files": [...],
          "written": N, "unwritten": N, "by_kind": [N per schema.KIND_NAMES],
          "error": why the first failed write failed, or null,
          "spilled": records that waited in the spill file, "spill_peak_bytes": N}

Records that arrive while a file is being written wait in memory up to
PENDING_BYTES, then in an unnamed spill file (capture.event_spill), so that
a flood faster than the decode is read on and written later, not dropped.

Files are written by a thread while reading goes on (EventFiles).  A flush
that cannot be written (a full disk) leaves no file behind: its records are
counted as unwritten, and the next flush tries again.
"""

from __future__ import annotations

import io
import json
import os
import socket
import struct
import sys
import threading
from pathlib import Path

import numpy as np
import polars as pl

from .. import schema
from ..safe_output import OutputDir
from . import own_process
from .collectives import CommunicatorTable, Sequencer
from .decode import events_frame
from .event_spill import Spill, SpillLost
from .ringbuf import padded_dtype
from .tensor_sizes import TensorSizes

HEADER = struct.Struct("<cQ")
COMPRESSION = "lz4"
NICE = 5
#: Records held in memory unwritten, at most: past it a file is written before
#: the flush interval ends or, while one is being written, they go to the
#: spill file (reading goes on); only where nothing can be spilled does reading
#: wait for the write, and records back up into the
#: tracer's bounded queue.
PENDING_BYTES = 64 << 20
#: rewritten whole whenever an NCCL communicator is made or ended
COMMUNICATORS = "communicators.parquet"


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


def write_atomic(out: OutputDir, name: str, data: pl.DataFrame) -> None:
    """Write ``data`` to ``name`` in ``out`` via a new temporary file and a
    rename.  A failed write (ENOSPC, EIO, ...) raises OSError and leaves
    nothing behind."""
    def write(path: str) -> None:
        # encoded in memory, then written by us: a failed write is then the
        # OSError it is (Polars writing to the file itself reports it as a
        # ComputeError, "Invalid thrift: transport error" when the footer fails)
        buf = io.BytesIO()
        data.write_parquet(buf, compression=COMPRESSION, statistics=False)
        with open(path, "wb") as f:
            f.write(buf.getbuffer())

    out.write_atomic(name, write)


def kind_counts(recs: np.ndarray) -> np.ndarray:
    """Records per schema.KIND_NAMES (an unknown kind counts as other)."""
    return np.bincount(schema.kind_index(recs["kind"]), minlength=len(schema.KIND_NAMES))


def _read_exact(stream, n: int) -> bytearray:
    """n bytes, read straight into the buffer returned (records are read at
    the flood's rate: no copy more than the pipe's)."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = stream.readinto(view[got:])
        if not k:
            raise EOFError("the tracer closed the pipe")
        got += k
    return buf


class EventFiles:
    """The events files of one capture.  Each flush is written by a thread
    of its own while the main thread goes on reading the pipe, so the tracer
    is never kept waiting by a write: what reached this process is safe from
    a SIGKILL of the tracer, what waits in the tracer is not."""

    def __init__(self, out: OutputDir):
        self._out = out
        self.api_names: list[str] = []
        self._pending: list[np.ndarray] = []
        self._pending_bytes = 0
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
        self._spill = Spill(out.fd)

    def add(self, recs: np.ndarray) -> None:
        self._pending.append(recs)
        self._pending_bytes += recs.nbytes
        if self._pending_bytes >= PENDING_BYTES:
            self.flush()  # a file before the interval ends

    def flush(self) -> None:
        """Have what arrived since the last flush written.  While a file is
        being written, what is pending waits, in memory up to PENDING_BYTES,
        past that in the spill file, behind what waits there, and the writing
        thread takes it next; where it cannot (no room), this waits for the
        write (backpressure: the tracer's queue fills).  Nothing pending is
        written while older records wait in the spill file."""
        if self._writing() and (self._pending_bytes < PENDING_BYTES or self._move_pending_to_spill()):
            return
        self.wait()
        recs = self._take_spilled()  # the oldest first
        if recs is None:
            if not self._pending:
                return
            recs = np.concatenate(self._pending)
            self._pending, self._pending_bytes = [], 0
        elif self._pending_bytes >= PENDING_BYTES and not self._move_pending_to_spill():
            self._write_all(recs)  # no room to spill: the spill is written here, the pending records after it
            self.wait()
            return
        self._thread = threading.Thread(target=self._write_all, args=(recs,), name="pasta-events-file")
        self._thread.start()

    def finish(self) -> None:
        """Until everything that arrived is written (or counted unwritten)."""
        while True:
            self.flush()
            self.wait()
            if not self._pending and not self._spill:
                return

    def wait(self) -> None:
        """Until the write in progress ended; raises what broke it (a bug: a full disk is counted)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._failure is not None:
            raise self._failure

    def _writing(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _move_pending_to_spill(self) -> bool:
        if not self._spill.put(self._pending):
            return False
        self._pending, self._pending_bytes = [], 0
        return True

    def _write_all(self, recs: np.ndarray | None) -> None:
        """Write ``recs``, then what the spill file holds, a file each."""
        while recs is not None and self._failure is None:
            self._write(recs)
            recs = self._take_spilled()

    def _take_spilled(self) -> np.ndarray | None:
        try:
            return self._spill.take(PENDING_BYTES)
        except SpillLost as e:  # records that cannot be read back are counted unwritten
            self.unwritten += e.records
            self.error = self.error or str(e)
            return None

    def _write(self, recs: np.ndarray) -> None:
        try:
            data = self._sizes.fill(events_frame(recs, self.api_names, self._sequencer))
            for pid, comm in data.select("pid", pl.col("comm").cast(pl.String)).unique().iter_rows():
                self.comms.setdefault(pid, comm)
            name = f"events-{len(self.files):05d}.parquet"
            try:
                write_atomic(self._out, name, data)
            except OSError as e:  # a full disk: keep the files written so far, count these
                self.unwritten += len(recs)
                self.error = self.error or (e.strerror or str(e))
                return
            self.files.append(name)
            self.written += len(recs)
            self.by_kind += kind_counts(recs)
            self._write_communicators(data)
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by wait()
            self._failure = e

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
                "by_kind": self.by_kind.tolist(), "error": self.error, "spilled": self._spill.records,
                "spill_peak_bytes": self._spill.peak_bytes}


def main(argv: list[str]) -> int:
    own_process.mark()
    fd = int(argv[0])  # the capture directory, inherited open: every file is written relative to it
    os.nice(NICE)
    dtypes = {d.itemsize: d for d in (schema.HOST_EVENT.dtype, padded_dtype(schema.HOST_EVENT.dtype))}
    stdin, stdout = sys.stdin.buffer, sys.stdout
    files = EventFiles(OutputDir(fd, Path(f"/proc/self/fd/{fd}")))
    while True:
        try:
            kind, length = HEADER.unpack(_read_exact(stdin, HEADER.size))
            payload = _read_exact(stdin, length) if length else b""
        except EOFError:
            files.finish()  # the tracer died: keep what we have
            return 1
        if kind == b"A":
            files.api_names = json.loads(payload)
        elif kind == b"E":
            size = struct.unpack_from("<I", payload)[0]
            files.add(np.frombuffer(payload, dtypes[size], offset=4))
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
