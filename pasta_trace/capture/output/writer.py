"""The capture directory's Parquet files, written so that a killed tracer
leaves readable data.

Events go into one new file per flush interval (``events-00000.parquet``,
``events-00001.parquet``, ...): a Parquet file is only readable once its
footer is written, so each interval's file is written whole, to a hidden
temporary name, and renamed into place.  Decoding and writing the events
happen in a separate process (capture.output.event_writer): the drain copies the
records into a ring both processes map (capture.output.shared_ring) and a sender
thread tells the writer where they lie, so the drain never waits for it.
That process outlives a SIGKILLed tracer and writes everything in the ring,
so a SIGKILL loses nothing drained.  The ring is bounded: records that do not
fit are dropped and counted (``lost_writer_behind``).  The small
tables (names, processes, libraries) are rewritten whole, atomically,
whenever they change.

A write that fails (a full disk) keeps what was written before: events that
could not be written are counted (``lost_unwritten``), a small table keeps its
last version, and room kept aside from the start lets the manifest be
completed (finish).

A writer process that dies (a SIGKILL) ends the capture: the drain sees it
(``died``) and stops, and close() learns what reached the disk from the
events files themselves.  Every record handed to the dead writer and not in a
file, and every one drained after its death, is counted in ``lost_writer_died``
with the cause (``died``): none is silently missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, NamedTuple, Sequence

import numpy as np
import polars as pl

from ... import schema
from ...errors import PastaError
from ...safe_output import OutputDir
from ..procs import guardian, helper_process
from .decode import host_stub_aliases, names_frame
from .event_writer import RING_PART, frame, write_atomic
from .ledger import Ledger
from .shared_ring import SharedRing, ring_bytes
from .takeover import events_on_disk
from .writer_queue import WriterQueue

#: Flush interval: what the events writer process holds unwritten at most,
#: should it be killed too.
FLUSH_INTERVAL_S = 1.0
#: Room held in the capture's file system from the start, given up on a full
#: disk so that the manifest can still be completed (a few KiB; names and the
#: other tables fit in what is left).
RESERVE_BYTES = 1 << 20


class _Batch(NamedTuple):
    """The last message of a batch of records (None: the writer is dead, none
    is sent), and what goes with it: the ledger's TRACER record to publish
    before it is sent, and the end in the kernel's events ring to commit after
    (0: none)."""

    msg: bytes | None
    tracer: tuple[int, int, int, int]
    bpf_end: int


class CaptureWriter:
    def __init__(
        self,
        out: OutputDir,
        api_names: Sequence[str],
        *,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        ring: int | None = None,
    ):
        self.out = out
        #: the capture directory, for readers (a path that cannot be redirected)
        self.dir = out.pinned
        self.api_names = list(api_names)
        self.flush_interval_s = flush_interval_s
        self._pending_names: list[np.ndarray] = []
        self._all_names: list[np.ndarray] = []
        self._last_flush = time.monotonic()
        #: records handed to the events writer process
        self.events = 0
        self.names = 0
        #: records dropped because the writer process was too far behind
        self.lost_behind = 0
        # what the writer process did with them (known after close())
        self.written = 0
        self.unwritten = 0
        self.write_error: str | None = None
        self.held_peak_bytes = 0  # the most that waited unwritten in the writer process
        #: why the writer process ended before close() (killed by a signal, say), or None
        self.died: str | None = None
        #: records handed to it and not on disk, or drained after, once it died
        self.died_unwritten = 0
        self.ring_trimmed_bytes = 0  # pages of the shared ring given back after floods
        self.by_kind = np.zeros(len(schema.KIND_NAMES), dtype=np.int64)
        self.event_files: list[Path] = []
        #: small tables whose last write failed -> why (their previous version stays)
        self.failed: dict[str, str] = {}
        out.keep_free(RESERVE_BYTES)
        self._comms: dict[int, str] = {}
        self._ring = SharedRing.create(ring or ring_bytes())
        #: what was handed over, for a guardian should this process and the writer both die (capture.output.ledger)
        self._ledger = Ledger.create()
        self._handed = 0  # events put in the ring, or drained after the writer died
        self._bpf_end = 0  # the end of the last batch drained from the kernel's events ring
        args = helper_process.argv("pasta_trace.capture.output.event_writer", out.fd, self._ring.fd, self._ledger.fd)
        # its own process group: a terminal's Ctrl-C reaches the whole foreground
        # group, and the tracer, not the writer, decides when writing ends
        self._proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      env=helper_process.env(), cwd=helper_process.CWD,
                                      pass_fds=(out.fd, self._ring.fd, self._ledger.fd), process_group=0)
        #: gives the kernel's events ring space back (take_over); before it, the drain does
        self._commit: Callable[[int], None] = lambda end: None
        self._queue = WriterQueue()
        self._send_error: BaseException | None = None
        self._sender = threading.Thread(target=self._send_loop, name="pasta-writer-pipe", daemon=True)
        self._sender.start()
        self._queue.put(frame(b"A", json.dumps(self.api_names).encode()))

    def take_over(self, spec: dict, commit: Callable[[int], None]) -> None:
        """Should the tracer die, the writer process drains the events ring
        itself (capture.output.takeover: ``spec`` names the maps).  From now on the
        ring's space is given back (``commit``) only once the writer process
        was told where the records lie: add_events' ``bpf_end``."""
        self._commit = commit
        self._queue.put(frame(b"W", json.dumps(spec).encode()))

    def notice(self, spec: dict) -> guardian.Notice:
        """What the guardians need to complete the capture should this process and the
        writer process both die (``spec``: take_over's)."""
        return guardian.Notice(spec, self.out.fd, self._ledger.fd, os.pidfd_open(self._proc.pid))

    def guard(self, spec: dict) -> None:
        """Have the writer process guard the tracer's late-load stops too (guardian.watch_in_thread)."""
        self._queue.put(frame(b"G", json.dumps(spec).encode()))

    @property
    def pid(self) -> int:
        """The events writer process (one of pasta-trace's own: the discover program never stops it)."""
        return self._proc.pid

    def _send_loop(self) -> None:
        """Blocking pipe writes happen here, with the GIL released.  A batch's
        last message: the ledger first, then the pipe, then the kernel's ring
        (capture.output.ledger says why in that order).  Once the writer process is
        gone, batches are still published and committed, never sent."""
        out = self._proc.stdin
        while (item := self._queue.get()) is not None:
            batch = item if isinstance(item, _Batch) else None
            msg = batch.msg if batch is not None else item
            if batch is not None:
                self._ledger.publish("TRACER", batch.tracer)
            if msg is not None and self._send_error is None:
                try:
                    out.write(msg)
                    out.flush()
                except OSError as e:  # BrokenPipeError: the writer process died
                    self._send_error = e
            if batch is not None and batch.bpf_end:
                # in the pipe, which outlives us, or counted: the kernel may reuse the records' space now
                self._commit(batch.bpf_end)

    # ------------------------------------------------------------------ input

    def add_events(self, recs: np.ndarray, *, bpf_end: int = 0, held: int = 0) -> None:
        """Put records in the ring shared with the writer process (capture.output.shared_ring)
        and tell it where; those that do not fit (the newest) are dropped and
        counted in lost_behind.  ``bpf_end``: the position in the kernel's events
        ring these records end at (take_over), committed once the writer process
        knows of them; ``held``: the events drained and held back meanwhile."""
        self._bpf_end = bpf_end or self._bpf_end
        if self.died is not None or self._ended():
            self.died_unwritten += recs.size  # nobody will write them: counted, never put in the ring
            self._handed += recs.size
            self._queue.put(_Batch(None, (self._handed, self._bpf_end, held, self.lost_behind), bpf_end))
            return
        fit, parts = self._ring.put(recs)
        self.lost_behind += recs.size - fit
        self._handed += fit
        size = recs.dtype.itemsize
        if not parts and (recs.size or bpf_end):  # none fit, or none to write: the counts and position still go
            parts = [(0, 0)]
        for i, (pos, nbytes) in enumerate(parts):
            more = i < len(parts) - 1
            msg = frame(b"R", RING_PART.pack(pos, nbytes, size, int(more), 0 if more else bpf_end, held,
                                             self.lost_behind))
            self._queue.put(msg if more else _Batch(msg, (self._handed, self._bpf_end, held, self.lost_behind),
                                                    bpf_end))
        self.events += fit

    @property
    def ring_bytes(self) -> int:
        """The size of the ring shared with the writer process."""
        return self._ring.capacity

    @property
    def ring_used(self) -> int:
        """Bytes of records in the ring not yet written by the writer process."""
        return self._ring.used

    def add_names(self, recs: np.ndarray) -> None:
        if recs.size:
            self._pending_names.append(recs)
            self.names += int(recs.size)

    # ------------------------------------------------------------------ output

    def due(self) -> bool:
        return time.monotonic() - self._last_flush >= self.flush_interval_s

    def flush_async(self) -> None:
        """Have the writer process write what arrived since the last flush."""
        self._last_flush = time.monotonic()
        self._queue.put(frame(b"F"))
        self.ring_trimmed_bytes += self._ring.trim()  # the writer caught up after a flood: its pages go back
        self._write_names()

    def flush(self) -> None:
        """The same, and wait until it is on disk."""
        self._last_flush = time.monotonic()
        self._queue.put(frame(b"S"))
        self._answer()
        self._write_names()

    def _ended(self) -> bool:
        """Whether the writer process ended before it was told to (``died`` says why)."""
        if self.died is None and self._proc.poll() is not None:
            rc = self._proc.returncode
            try:
                how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exited with code {rc}"
            except ValueError:
                how = f"exited with status {rc}"
            self.died = f"the events writer process was {how}" if rc < 0 else f"the events writer process {how}"
        return self.died is not None

    def check_alive(self) -> bool:
        """False once the writer process has died: the capture must end (close() counts the loss)."""
        return not self._ended()

    def close(self) -> None:
        """Write everything, stop the writer process, and learn what it wrote
        (from the files on disk, if it died: ``died``)."""
        self._queue.put(frame(b"C"))
        try:
            reply = json.loads(self._answer())
        except PastaError:
            self._recover()
            return
        self._queue.put(None)
        self._sender.join()
        self._proc.wait()
        self._comms = {int(k): v for k, v in reply["comms"].items()}
        self.event_files = [self.dir / f for f in reply["files"]]
        self.written, self.unwritten, self.write_error = reply["written"], reply["unwritten"], reply["error"]
        self.held_peak_bytes = reply["held_peak_bytes"]
        self.by_kind = np.array(reply["by_kind"], dtype=np.int64)
        self._write_names()

    def kill(self) -> None:
        """End the writer process now (an error ends the capture: it must not outlive it)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._queue.put(None)

    def _recover(self) -> None:
        """The writer process died: what it wrote is the events files on
        disk (each renamed into place whole), what it could not write it
        published (capture.output.ledger); everything else handed to it is counted
        in died_unwritten.  Its half-written temporary file goes."""
        self.kill()
        self._ended()
        if self.died is None:  # it answered nothing yet exited 0: still not a writer that finished
            self.died = "the events writer process ended without its final answer"
        disk = events_on_disk(self.out)
        self.event_files = [self.dir / n for n in disk.files]
        self.by_kind += disk.by_kind
        for pid, comm in disk.comms.items():
            self._comms.setdefault(pid, comm)
        self.written = disk.rows
        self.unwritten = (self._ledger.read("UNWRITTEN") or (0,))[0]  # a full disk before its death
        self.died_unwritten += self.events - self.written - self.unwritten
        self.write_error = self.write_error or self.died
        self._write_names()

    def _answer(self) -> str:
        line = self._proc.stdout.readline().decode()
        if not line:
            self._proc.wait()
            err = self._proc.stderr.read().decode().strip().splitlines()
            raise PastaError(f"the events writer process failed: {err[-1] if err else self._send_error}")
        return line

    def _write_names(self) -> None:
        """Rewrite names.parquet when names arrived or its last write failed."""
        if self._pending_names:
            self._all_names = [np.concatenate(self._all_names + self._pending_names)]
            self._pending_names.clear()
        elif "names.parquet" not in self.failed:
            return
        self.write_frame(self.dir / "names.parquet", names_frame(self._all_names[0], self.api_names))

    def host_stub_aliases(self) -> pl.DataFrame:
        """Handles returned for host stubs at run time, to be named offline (decode.host_stub_aliases)."""
        return host_stub_aliases(self._all_names[0] if self._all_names else np.empty(0, schema.HOST_NAME.dtype),
                                 self.api_names)

    def pids_and_comms(self) -> list[tuple[int, str]]:
        """Each process seen in the events written (after close())."""
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

    def write_frame(self, path: Path, data: pl.DataFrame) -> None:
        """Write ``data`` to ``path``, a file of the capture directory,
        atomically.  A failed write (a full disk) leaves the file's previous
        version and is remembered in ``failed`` until a later write succeeds."""
        try:
            write_atomic(self.out, path.name, data)
        except OSError as e:
            self.failed[path.name] = e.strerror or str(e)
        else:
            self.failed.pop(path.name, None)
