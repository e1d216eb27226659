"""Raw event records kept on disk while the events writer is behind.

The events writer decodes and compresses (about 0.3 us a record), while
reading what the tracer sends costs almost nothing.  In a flood faster than
the decode, what it cannot decode yet goes here, as the records' raw bytes
in an unnamed file (O_TMPFILE) of the capture directory, so that the pipe
is read on, memory stays bounded and nothing is dropped: the writing thread
takes the oldest records back once the file before is written.  An unnamed
file leaves nothing behind when the process ends.  Where no such file can be
made or written (a full disk, a file system without O_TMPFILE), ``put``
returns False and the caller waits instead, as without a spill.
"""

from __future__ import annotations

import os
import threading
from collections import deque

import numpy as np


class SpillLost(OSError):
    """Records that could not be read back from the spill file."""

    def __init__(self, records: int, why: str) -> None:
        super().__init__(f"reading the events spill file back: {why}")
        self.records = records


class Spill:
    """A FIFO of record arrays in one unnamed file; thread-safe."""

    def __init__(self, dir_fd: int) -> None:
        self._dir_fd = dir_fd
        self._fd: int | None = None
        self._usable = True
        self._segments: deque[tuple[int, int, np.dtype]] = deque()  # (offset, bytes, dtype), oldest first
        self._end = 0
        self._lock = threading.Lock()
        self.peak_bytes = 0  # the most held at once
        self.records = 0  # records that went through it

    def __bool__(self) -> bool:
        with self._lock:
            return bool(self._segments)

    def put(self, arrays: list[np.ndarray]) -> bool:
        """Append ``arrays`` (in order) behind what is held; False, and
        nothing appended, where the file cannot be made or written."""
        with self._lock:
            if not self._open():
                return False
            at, added = self._end, []
            try:
                for a in arrays:
                    _pwrite_all(self._fd, memoryview(np.ascontiguousarray(a).view(np.uint8)), at)
                    added.append((at, a.nbytes, a.dtype))
                    at += a.nbytes
            except OSError:  # a full disk: the part written is not held
                try:
                    os.ftruncate(self._fd, self._end)
                except OSError:
                    pass
                return False
            self._segments.extend(added)
            self.records += sum(a.size for a in arrays)
            self._end = at
            self.peak_bytes = max(self.peak_bytes, self._end - self._segments[0][0])
            return True

    def take(self, limit: int) -> np.ndarray | None:
        """The oldest records held, about ``limit`` bytes of them (at least
        one segment, all of one dtype), or None when none are held."""
        with self._lock:
            if not self._segments:
                return None
            first, size, dtype = self._segments.popleft()
            while self._segments and size < limit and self._segments[0][2] == dtype:
                size += self._segments.popleft()[1]
            data = np.empty(size, np.uint8)  # not zero-filled first, as a bytearray would be
            try:
                got = os.preadv(self._fd, [data], first)
                if got != size:
                    raise OSError(f"{got} of {size} bytes")
                if not self._segments:  # all read back: give the disk space back
                    os.ftruncate(self._fd, 0)
                    self._end = 0
            except OSError as e:
                raise SpillLost(size // dtype.itemsize, e.strerror or str(e)) from e
            return data.view(dtype)

    def _open(self) -> bool:
        if self._fd is None and self._usable:
            try:
                self._fd = os.open(".", os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600, dir_fd=self._dir_fd)
            except OSError:
                self._usable = False
        return self._fd is not None


def _pwrite_all(fd: int, data: memoryview, at: int) -> None:
    while data:
        n = os.pwrite(fd, data, at)
        data, at = data[n:], at + n
