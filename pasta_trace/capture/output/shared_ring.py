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

Positions count bytes from the start of the capture; a batch that does not
fit in the space left before the ring's end wraps to its start in two parts,
whole records each (the bytes skipped at the end count as used).

Memory: while the writer keeps up, the tracer starts again at the ring's
start once past REGION_BYTES (nothing is unwritten then, so the bytes it
skips need no release), so a steady flow keeps to the first REGION_BYTES and
their pages; a flood uses more of the ring, and once the writer has caught
up the tracer gives those pages back (``trim``).
"""

from __future__ import annotations

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
        self._floor = 0  # the tracer's: where it last restarted (all before it is released)
        self._ready = 0  # the writer's: the pages of the positions below it were made

    @classmethod
    def create(cls, capacity: int) -> "SharedRing":
        """A new ring (its memfd is closed on exec: pass it to the writer process with pass_fds)."""
        fd = os.memfd_create("pasta-trace-events", os.MFD_CLOEXEC)
        os.ftruncate(fd, HEAD_BYTES + capacity)
        return cls(fd)

    # -------------------------------------------------------------- the tracer

    @property
    def used(self) -> int:
        """Bytes put and not yet released."""
        return self._end - max(int(self._head[0]), self._floor)

    def put(self, recs: np.ndarray) -> tuple[int, list[tuple[int, int]]]:
        """Copy as many of ``recs`` as fit, the oldest first; returns how
        many, and the parts written as (position, bytes)."""
        size = recs.dtype.itemsize
        flat = np.ascontiguousarray(recs).view(np.uint8)
        self._restart()
        free = self.capacity - self.used
        done, parts = 0, []
        while done < recs.size:
            at = self._end % self.capacity
            tail = self.capacity - at
            if tail < size:  # no whole record before the end: skip to the start
                if free < tail + size:
                    break
                self._end += tail
                free -= tail
                continue
            k = min(recs.size - done, tail // size, free // size)
            if k == 0:
                break
            self._data[at : at + k * size] = flat[done * size : (done + k) * size]
            parts.append((self._end, k * size))
            self._high = max(self._high, at + k * size)
            self._end += k * size
            free -= k * size
            done += k
        return done, parts

    def _restart(self) -> None:
        """With nothing unwritten and past REGION_BYTES, go on from the ring's start."""
        at = self._end % self.capacity
        if self.used or at < REGION_BYTES or self.capacity <= 2 * REGION_BYTES:
            return
        self._end += self.capacity - at
        self._floor = self._end

    def trim(self) -> int:
        """The tracer's side, with nothing unwritten: restart at the ring's
        start (see put), and give back the pages a flood used past
        REGION_BYTES + PREFAULT_AHEAD_BYTES: they would stay resident to the
        end of the capture.  Safe here only: the tracer is the only one that
        writes records, none is unwritten, and its next ones go below
        REGION_BYTES.  Returns the bytes given back."""
        start = REGION_BYTES + PREFAULT_AHEAD_BYTES
        if self.used or self._high <= start or self.capacity <= 2 * REGION_BYTES:
            return 0
        self._restart()
        self._high = self._end % self.capacity
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
