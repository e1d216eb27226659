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
HOLD_BYTES, then in an unnamed spill file (capture.event_spill), so that
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
from .heap import keep_freed_memory
from .ringbuf import padded_dtype
from .tensor_sizes import TensorSizes

HEADER = struct.Struct("<cQ")
COMPRESSION = "lz4"
#: Nice value of the threads that decode and write the files.  The main
#: thread, which only reads the pipe into memory, keeps the tracer's: in a
#: flood that keeps both CPUs busy, a reader at nice 5 got too little of them
#: to empty the pipe, and the tracer's bounded queue overflowed while
#: hundreds of MiB of the hold were still free.
NICE = 5
#: How soon a thread waiting for the GIL gets it from one that runs Python
#: code (the default 5 ms is a full pipe at a million events a second).
SWITCH_INTERVAL_S = 0.001
#: Records per events file, at most (about 400,000): past it a file is begun
#: before the flush interval ends, and a backlog is written this much at a time.
FILE_BYTES = 64 << 20


def hold_bytes(meminfo: str = "/proc/meminfo") -> int:
    """Records held in memory while a file is being written, at most: an
    eighth of the memory available, up to 1 GiB.  Past it they go to the
    spill file, and only where nothing can be spilled does reading wait for
    the write (records then back up into the tracer's bounded queue).  Memory
    first, because on a machine whose page cache is full a new page of a
    file costs ten times more than one of memory (measured: 0.12 against
    0.76 GB/s the first time a page is used, 4.5 GB/s for either after), and
    a flood of 1 M events a second brings 170 MB a second."""
    try:
        with open(meminfo) as f:
            avail = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return FILE_BYTES
    return max(FILE_BYTES, min(1 << 30, avail // 8))


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


def _read_exact(stream, n: int) -> np.ndarray:
    """n bytes, read straight into the buffer returned (records are read at
    the flood's rate: no copy more than the pipe's, and no zero-filling:
    ``bytearray(n)`` spent as long clearing a flood's buffers as the rest of
    the reading)."""
    buf = np.empty(n, np.uint8)
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
        self._hold = hold_bytes()

    def add(self, recs: np.ndarray) -> None:
        self._pending.append(recs)
        self._pending_bytes += recs.nbytes
        if self._pending_bytes >= FILE_BYTES:
            self.flush()  # a file before the interval ends

    def flush(self) -> None:
        """Have what arrived since the last flush written, FILE_BYTES of it
        at a time.  While a file is being written, what is pending waits, in
        memory up to the hold (hold_bytes), past that in the spill file,
        behind what waits there, and the writing thread takes it next; where
        it cannot (no room), this waits for the write (backpressure: the
        tracer's queue fills).  Nothing pending is written while older
        records wait in the spill file."""
        if self._writing() and (self._pending_bytes < self._hold or self._move_pending_to_spill()):
            return
        self.wait()
        recs = self._take_spilled()  # the oldest first
        if recs is None:
            if not self._pending:
                return
            recs = self._take_pending()
        elif self._pending_bytes >= self._hold and not self._move_pending_to_spill():
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

    def _take_pending(self) -> list[np.ndarray]:
        """The oldest pending arrays, about FILE_BYTES of them (at least one),
        decoded piece by piece: a concatenation would copy them into new memory."""
        n, size = 0, 0
        while n < len(self._pending) and (n == 0 or size + self._pending[n].nbytes <= FILE_BYTES):
            size += self._pending[n].nbytes
            n += 1
        taken, self._pending = self._pending[:n], self._pending[n:]
        self._pending_bytes -= size
        return taken

    def _move_pending_to_spill(self) -> bool:
        if not self._spill.put(self._pending):
            return False
        self._pending, self._pending_bytes = [], 0
        return True

    def _write_all(self, recs: np.ndarray | list[np.ndarray] | None) -> None:
        """Write ``recs``, then what the spill file holds, a file each."""
        try:
            os.setpriority(os.PRIO_PROCESS, 0, max(NICE, os.getpriority(os.PRIO_PROCESS, 0)))  # this thread only
        except OSError:
            pass
        while recs is not None and self._failure is None:
            self._write(recs)
            recs = self._take_spilled()

    def _take_spilled(self) -> np.ndarray | None:
        try:
            return self._spill.take(FILE_BYTES)
        except SpillLost as e:  # records that cannot be read back are counted unwritten
            self.unwritten += e.records
            self.error = self.error or str(e)
            return None

    def _write(self, recs: np.ndarray | list[np.ndarray]) -> None:
        parts = [recs] if isinstance(recs, np.ndarray) else recs
        records = sum(p.size for p in parts)
        try:
            data = self._sizes.fill(events_frame(recs, self.api_names, self._sequencer))
            for pid, comm in data.select("pid", pl.col("comm").cast(pl.String)).unique().iter_rows():
                self.comms.setdefault(pid, comm)
            name = f"events-{len(self.files):05d}.parquet"
            try:
                write_atomic(self._out, name, data)
            except OSError as e:  # a full disk: keep the files written so far, count these
                self.unwritten += records
                self.error = self.error or (e.strerror or str(e))
                return
            self.files.append(name)
            self.written += records
            for p in parts:
                self.by_kind += kind_counts(p)
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
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    keep_freed_memory()
    dtypes = {d.itemsize: d for d in (schema.HOST_EVENT.dtype, padded_dtype(schema.HOST_EVENT.dtype))}
    stdin, stdout = sys.stdin.buffer, sys.stdout
    files = EventFiles(OutputDir(fd, Path(f"/proc/self/fd/{fd}")))
    while True:
        try:
            kind, length = HEADER.unpack(_read_exact(stdin, HEADER.size))
            if kind == b"E":  # the record size, then the records, read into a buffer of their own (aligned)
                size = struct.unpack("<I", _read_exact(stdin, 4))[0]
                payload = _read_exact(stdin, length - 4)
            else:
                payload = _read_exact(stdin, length).tobytes()
        except EOFError:
            files.finish()  # the tracer died: keep what we have
            return 1
        if kind == b"A":
            files.api_names = json.loads(payload)
        elif kind == b"E":
            files.add(payload.view(dtypes[size]))
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
