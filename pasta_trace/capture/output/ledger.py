"""What the tracer and its events writer have done with the events, kept
where it outlives them both: one page of a memfd the tracer makes and passes
to the events writer and to the guardians.  Should the tracer and the writer
both die, a guardian completes the capture from it (capture.output.takeover).

Three records, each a tuple of u64 counters:

- ``TRACER`` (the tracer's sender thread): the events handed to the writer
  so far (records put in the shared ring, and those drained after the
  writer's death), the end of the last whole batch in the kernel's events
  ring, the events held back (native stacks) and those dropped for a full
  shared ring (lost_writer_behind).  Published just before the batch's last
  message goes into the pipe, and the kernel's ring space is given back just
  after: so every record before the published end is counted as handed,
  whether its message reached the writer or not, and no record past it was
  given back.  A batch whose last message never reached the writer is never
  written by it (event_writer: a batch cut short is left), so "handed" less
  "on disk" is exactly what the writer did not write.
- ``TAKEN`` (whoever drains the kernel's ring after the tracer's death: the
  events writer, then a guardian): the events the writer had accepted from
  the pipe when it took over, the events taken from the kernel's ring since,
  the ring position they end at, the events the tracer held back and dropped
  as its last message said, and the capture's end (CLOCK_MONOTONIC ns).
  Published before the records taken are handed on and before their ring
  space is given back, so a guardian that finds it goes on from there and
  counts nothing twice.  Once it exists it replaces ``TRACER`` (the writer
  re-took from the ring any batch the tracer published but never sent).
- ``UNWRITTEN`` (the writer's file thread): events that could not be written
  (a full disk), stored after the failed write: a death in between moves
  them from lost_unwritten to lost_writer_died, the sum unchanged.

Each record is published whole or not at all with plain stores: it has two
slots and a sequence number; the new values go into the slot the sequence
does not name, then the sequence is advanced by one aligned 8-byte store (a
memoryview of format "Q": one machine store).  A process killed between any
two instructions leaves the sequence naming a slot that was written in full
before it, and a reader looks only once the writer is dead (its exit begun,
seen through /proc or its pidfd), so it never sees half a record.
"""

from __future__ import annotations

import mmap
import os

#: record name -> how many counters it holds
RECORDS = {"TRACER": 4, "TAKEN": 6, "UNWRITTEN": 1}
SIZE = mmap.PAGESIZE


class Ledger:
    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._map = mmap.mmap(fd, SIZE)
        self._words = memoryview(self._map).cast("Q")
        self._at: dict[str, tuple[int, int]] = {}
        at = 0
        for name, n in RECORDS.items():
            self._at[name] = (at, n)
            at += 1 + 2 * n

    @classmethod
    def create(cls) -> "Ledger":
        """A new, zeroed ledger (closed on exec: pass it on with pass_fds or SCM_RIGHTS)."""
        fd = os.memfd_create("pasta-trace-ledger", os.MFD_CLOEXEC)
        os.ftruncate(fd, SIZE)
        return cls(fd)

    def publish(self, name: str, values: tuple[int, ...]) -> None:
        """Replace record ``name`` (one thread of one process writes each record)."""
        at, n = self._at[name]
        seq = self._words[at]
        slot = at + 1 + ((seq + 1) & 1) * n
        for i, v in enumerate(values):
            self._words[slot + i] = v
        self._words[at] = seq + 1  # the one store that makes the record visible

    def read(self, name: str) -> tuple[int, ...] | None:
        """Record ``name`` as last published whole; None if it never was."""
        at, n = self._at[name]
        seq = self._words[at]
        if seq == 0:
            return None
        slot = at + 1 + (seq & 1) * n
        return tuple(self._words[slot:slot + n])
