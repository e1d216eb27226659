"""Event records on their way from the tracer to the events writer process.

The drain copies each batch of records into a ring of memory that both
processes map (a memfd), and sends the writer through the pipe only where
the batch lies (position, bytes, record size), in order with the control
messages.  The writer decodes the records where they lie and gives their
space back, by advancing ``released`` in the ring's first page, once the file
holding them is written.

- The pipe carries a few bytes per batch: the writer has nothing to read in a
  hurry, so a writer starved of CPU in a flood still loses nothing while the
  ring has room.  (Through the pipe, each record was copied twice more, and
  a reader that did not get the CPU or the GIL soon enough let the tracer's
  queue overflow.)
- What the tracer put in the ring survives a SIGKILLed tracer: the writer
  maps it too and writes it.
- Bounded: a batch that does not fit is cut, and the tracer counts what it
  dropped (``lost_writer_behind``).  Pages are used once they are written
  to, so a ring larger than the flood needs costs nothing.

Positions count bytes from the start of the capture; a record lies at its
position modulo the ring's size, whole (a batch may be put in several
parts).  The tracer puts records where there is room: at its offset, until
the records the writer has not released yet stand in the way; then past
them; at the ring's end, from its start.  Positions it passes hold nothing
(the writer is never told of them, and releases past them).

Memory: past REGION_BYTES, the tracer goes back to the ring's start as soon
as the writer released room there, so a steady flow keeps to the first
REGION_BYTES and their pages, and a flood the writer lags behind uses the
pages of what waits, not of all it put (a new page costs far more than the
copy into it: see prefault).  Once the writer has caught up, the tracer gives
back the pages past REGION_BYTES (``trim``).
"""

from __future__ import annotations

import collections
import ctypes
import mmap
import os

import numpy as np

#: the first page: u64 ``released`` (written by the events writer), then nothing
HEAD_BYTES = 4096
#: how far past the tracer's last batch the writer has the ring's pages made ready
PREFAULT_AHEAD_BYTES = 64 << 20
#: the part of the ring a flow the writer keeps up with stays in
REGION_BYTES = 256 << 20
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
#: madvise(2) advice (Linux 5.14): make a range's pages and their page-table
#: entries, as a write to each would, without touching their bytes
MADV_POPULATE_WRITE = 23
#: the ring's size at most, and at least
MAX_BYTES = 2 << 30
MIN_BYTES = 16 << 20


def ring_bytes(meminfo: str = "/proc/meminfo") -> int:
    """The default size: an eighth of the memory available, between 16 MiB
    and 2 GiB (about 12 M events: 11 s of a flood of 1.1 M events a second
    with the writer not keeping up at all)."""
    try:
        with open(meminfo) as f:
            avail = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        return MIN_BYTES
    return max(MIN_BYTES, min(MAX_BYTES, avail // 8))


class SharedRing:
    """One side of the ring: the tracer ``put``s, the writer ``view``s and ``release``s."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.capacity = os.fstat(fd).st_size - HEAD_BYTES
        self._map = mmap.mmap(fd, HEAD_BYTES + self.capacity)
        self._head = np.frombuffer(self._map, np.uint64, count=1)
        self._data = np.frombuffer(self._map, np.uint8, count=self.capacity, offset=HEAD_BYTES)
        self._addr = ctypes.addressof(ctypes.c_char.from_buffer(self._map))  # the mapping's start, for madvise
        self._populate = True  # the writer's: MADV_POPULATE_WRITE works here (else pages are read one by one)
        self._end = 0  # the tracer's next position
        self._high = 0  # the tracer's: the furthest offset it wrote to since it last gave pages back
        #: the tracer's: records not yet released, as runs (first position, ring offset, end position)
        #: of contiguous positions at contiguous offsets, oldest first
        self._runs: collections.deque[tuple[int, int, int]] = collections.deque()
        self._ready = 0  # the writer's: the pages of the positions below it were made

    @classmethod
    def create(cls, capacity: int) -> "SharedRing":
        """A new ring (its memfd is closed on exec: pass it to the writer process with pass_fds)."""
        fd = os.memfd_create("pasta-trace-events", os.MFD_CLOEXEC)
        os.ftruncate(fd, HEAD_BYTES + capacity)
        return cls(fd)

    # -------------------------------------------------------------- the tracer

    def _reap(self) -> int:
        """Forget the runs the writer released; returns its released position."""
        head = int(self._head[0])
        while self._runs and self._runs[0][2] <= head:
            self._runs.popleft()
        return head

    @property
    def used(self) -> int:
        """Bytes put and not yet released."""
        head = self._reap()
        return sum(end - max(start, head) for start, _, end in self._runs)

    def _occupied(self, head: int) -> list[tuple[int, int]]:
        """The ring offsets holding records not yet released, as [lo, hi) intervals."""
        return [(off + max(0, head - start), off + (end - start)) for start, off, end in self._runs]

    def _room(self, at: int, held: list[tuple[int, int]]) -> tuple[int, int]:
        """(the free bytes from offset ``at`` on, where the next held interval
        after it begins or the ring ends; the end of that interval, or 0)."""
        nxt = min(((lo, hi) for lo, hi in held if lo >= at), default=(self.capacity, 0))
        return nxt[0] - at, nxt[1]

    def _move(self, to: int) -> None:
        """Go on from ring offset ``to``: the next position at that offset (in
        the next lap for an offset behind).  The positions passed hold
        nothing: the writer is never told of them, and releases past them."""
        self._end += (to - self._end) % self.capacity

    def put(self, recs: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
        """Copy as many of ``recs`` as fit, the oldest first; returns how
        many, and the parts written as (position, bytes).  Records go at the
        tracer's offset while there is room before the next records not yet
        released; past REGION_BYTES, at the ring's start again once the
        writer released room there (the pages there exist already); where
        records not yet released stand in the way, past them, into the
        ring's pages further on.  None is put only when no gap in the ring
        holds a record."""
        size = recs.dtype.itemsize
        flat = np.ascontiguousarray(recs).view(np.uint8)
        head = self._reap()
        held = self._occupied(head)
        done, parts, moves = 0, [], 0
        # each move passes a held interval or the ring's end: once past them all, no gap holds a record
        while done < recs.size and moves <= len(held) + 2:
            at = self._end % self.capacity
            room, blocker_end = self._room(at, held)
            want = (recs.size - done) * size
            if at >= REGION_BYTES and self.capacity > 2 * REGION_BYTES:
                start_room, _ = self._room(0, held)
                if start_room >= min(want, REGION_BYTES // 4) and start_room >= size:
                    self._move(0)  # the pages at the start exist: use them again
                    moves += 1
                    continue
            if room < size:
                if blocker_end:  # records not yet written: past them
                    self._move(blocker_end % self.capacity)
                else:  # the ring's end: from its start
                    self._move(0)
                moves += 1
                continue
            k = min(recs.size - done, room // size)
            self._data[at : at + k * size] = flat[done * size : (done + k) * size]
            parts.append((self._end, k * size))
            if self._runs and self._runs[-1][2] == self._end:
                first, off, _ = self._runs[-1]
                self._runs[-1] = (first, off, self._end + k * size)
            else:
                self._runs.append((self._end, at, self._end + k * size))
            held = self._occupied(head)
            self._high = max(self._high, at + k * size)
            self._end += k * size
            done += k
            moves = 0
        return done, parts

    def trim(self) -> int:
        """The tracer's side, with nothing unwritten: go on from the ring's
        start, and give back the pages a flood used past REGION_BYTES +
        PREFAULT_AHEAD_BYTES: they would stay resident to the end of the
        capture.  Safe here only: the tracer is the only one that writes
        records, none is unwritten, and its next ones go below REGION_BYTES.
        Returns the bytes given back."""
        start = REGION_BYTES + PREFAULT_AHEAD_BYTES
        if self.used or self._high <= start or self.capacity <= 2 * REGION_BYTES:
            return 0
        if self._end % self.capacity:
            self._move(0)
        self._high = 0
        if not _punch_hole(self.fd, HEAD_BYTES + start, self.capacity - start):
            return 0
        return self.capacity - start

    # -------------------------------------------------------------- the writer

    def view(self, pos: int, nbytes: int, dtype: np.dtype) -> np.ndarray:
        """The records put at ``pos``, where they lie (no copy)."""
        at = pos % self.capacity
        return self._data[at : at + nbytes].view(dtype)

    def prefault(self, pos: int) -> None:
        """Have the pages of the positions up to ``pos`` +
        PREFAULT_AHEAD_BYTES made.  A new page costs its process a fault and
        a cleared page, far more than the copy into it; made here, in the
        writer, that cost is not the drain's, which must not fall behind the
        BPF ring.  The bytes are not touched (the tracer may be writing there
        already): one madvise(MADV_POPULATE_WRITE) call makes the range, 2.2 us
        a page on this project's VM where a read of each page took 3.1-3.7 us;
        where the kernel lacks it, each page is read.  A page made before costs
        little either way."""
        upto = pos + min(PREFAULT_AHEAD_BYTES, self.capacity)
        start = max(self._ready, pos)
        if upto > start:
            a, n = start % self.capacity, upto - start
            for lo, hi in ((a, min(a + n, self.capacity)), (0, max(0, a + n - self.capacity))):
                if hi > lo:
                    self._make_pages(lo, hi)
        self._ready = max(self._ready, upto)

    def _make_pages(self, lo: int, hi: int) -> None:
        """The pages holding ring offsets [lo, hi)."""
        if self._populate:
            first = (HEAD_BYTES + lo) // mmap.PAGESIZE * mmap.PAGESIZE
            if _libc.madvise(ctypes.c_void_p(self._addr + first), ctypes.c_size_t(HEAD_BYTES + hi - first),
                             MADV_POPULATE_WRITE) == 0:
                return
            self._populate = False  # EINVAL before Linux 5.14: read them
        int(self._data[lo:hi:mmap.PAGESIZE].sum())

    def release(self, end: int) -> None:
        """Everything before position ``end`` is written: the tracer may reuse it."""
        if end > int(self._head[0]):
            self._head[0] = end


_libc = ctypes.CDLL(None, use_errno=True)  # as probes.uprobe_link: no ldconfig run at import
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free a range of the memfd's pages (they read as zeros after); the GIL
    is released meanwhile (ctypes).  False where the kernel refuses."""
    return _libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length) == 0
