"""Drain a BPF ring buffer by mapping its memory: no per-event Python.

Layout (kernel Documentation/bpf/ringbuf.rst, libbpf ringbuf.c): page 0 holds
the consumer position (mapped read-write), page 1 the producer position, then
the data pages, mapped twice back to back so that a record that wraps around
the end is still contiguous.  Every record starts with an 8-byte header whose
first u32 is the length with BUSY (bit 31: reserved, not yet committed) and
DISCARD (bit 30) flags; records are padded to 8 bytes.

Our rings carry records of one fixed size, so a span of committed records is a
strided array: one numpy view decodes all of them at once.
"""

from __future__ import annotations

import functools
import mmap
import os

import numpy as np

BUSY_BIT = 1 << 31
DISCARD_BIT = 1 << 30
HDR_SIZE = 8
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def record_stride(record_size: int) -> int:
    """Bytes one record occupies in the ring: header + payload, padded to 8."""
    return (HDR_SIZE + record_size + 7) & ~7


class RecordSizeError(RuntimeError):
    """A committed record whose length is not the ring's fixed record size."""


@functools.lru_cache(maxsize=64)
def padded_dtype(dtype: np.dtype) -> np.dtype:
    """``dtype`` as it sits in the ring: after the 8-byte header, padded to
    the stride.  A copied span of the ring is an array of this dtype.
    Remembered: making one takes ~40 us, and every drain of every ring needs
    it (it was an idle drain loop's largest cost)."""
    names = dtype.names or ()
    return np.dtype({
        "names": list(names),
        "formats": [dtype.fields[n][0] for n in names],
        "offsets": [dtype.fields[n][1] + HDR_SIZE for n in names],
        "itemsize": record_stride(dtype.itemsize),
    })


def decode_span(
    data: np.ndarray, mask: int, cons: int, prod: int, dtype: np.dtype, out: np.ndarray | None = None
) -> tuple[np.ndarray, int]:
    """Decode the committed records between ``cons`` and ``prod``.

    ``data`` is the uint8 view of the doubly mapped data area (2 * (mask + 1)
    bytes).  Returns (a copy of the non-discarded records, as padded_dtype(dtype),
    and the new consumer position): it stops before the first record still
    being written.  The copy is made in ``out`` (bytes, at least mask + 1 of
    them) where given, else in new memory.
    """
    stride = record_stride(dtype.itemsize)
    n = (prod - cons) // stride
    if n <= 0:
        return np.empty(0, padded_dtype(dtype)), cons
    start = cons & mask
    # headers first, from the live ring: a record is read only once its
    # header says it is committed (x86 keeps loads in program order)
    hdr = np.ndarray((n,), dtype="<u4", buffer=data, offset=start, strides=(stride,))
    busy = np.flatnonzero(hdr & BUSY_BIT)
    if busy.size:
        n = int(busy[0])
        hdr = hdr[:n]
    lengths = hdr & ~np.uint32(BUSY_BIT | DISCARD_BIT)
    bad = np.flatnonzero(lengths != dtype.itemsize)
    if bad.size:
        raise RecordSizeError(
            f"ring record of {int(lengths[bad[0]])} bytes, expected {dtype.itemsize}: "
            "the BPF program and schema/ disagree"
        )
    discarded = (hdr & DISCARD_BIT) != 0
    # one contiguous copy of the span (the double mapping makes wrapped spans contiguous)
    span = data[start : start + n * stride]
    if out is None:
        recs = span.copy().view(padded_dtype(dtype))
    else:
        np.copyto(out[: span.size], span)
        recs = out[: span.size].view(padded_dtype(dtype))
    if discarded.any():
        recs = recs[~discarded]
    return recs, cons + n * stride


class RingBuffer:
    """One BPF_MAP_TYPE_RINGBUF, mapped into this process.

    ``map_fd`` comes from BCC (``bpf["events"].map_fd``), ``data_size`` is the
    map's max_entries (its data size in bytes, a power of two pages)."""

    def __init__(self, map_fd: int, data_size: int, dtype: np.dtype, *, reuse: bool = False):
        if data_size <= 0 or data_size & (data_size - 1) or data_size % PAGE_SIZE:
            raise ValueError(f"ring size {data_size} is not a power-of-two number of pages")
        self.dtype = dtype
        self.fd = map_fd
        self.size = data_size
        self._mask = data_size - 1
        self._cons_map = mmap.mmap(map_fd, PAGE_SIZE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=0)
        self._ro_map = mmap.mmap(map_fd, PAGE_SIZE + 2 * data_size, mmap.MAP_SHARED, mmap.PROT_READ, offset=PAGE_SIZE)
        self._cons = np.ndarray((1,), dtype="<u8", buffer=self._cons_map, offset=0)
        self._prod = np.ndarray((1,), dtype="<u8", buffer=self._ro_map, offset=0)
        self._data = np.ndarray((2 * data_size,), dtype=np.uint8, buffer=self._ro_map, offset=PAGE_SIZE)
        # reuse: every drain copies into the same memory (no allocation, no new pages
        # each time: a drain's records are only valid until the next drain)
        self._out = np.empty(data_size, np.uint8) if reuse else None
        self._empty = np.empty(0, padded_dtype(dtype))
        #: take(): where the next read starts (the kernel's consumer position may lag behind it)
        self._read: int | None = None

    @property
    def pending_bytes(self) -> int:
        return int(self._prod[0]) - int(self._cons[0])

    def drain(self) -> np.ndarray:
        """All records committed so far (a copy: with ``reuse``, one that the
        next drain overwrites); frees their space in the ring."""
        cons = int(self._cons[0])
        prod = int(self._prod[0])
        if prod == cons:  # most drains of an idle tracer: no new array each time
            return self._empty
        recs, new_cons = decode_span(self._data, self._mask, cons, prod, self.dtype, self._out)
        if new_cons != cons:
            self._cons[0] = new_cons
        return recs

    def take(self, start: int | None = None) -> tuple[np.ndarray, int]:
        """Like drain(), but the records' space is not given back: the caller
        commit()s their end once they are safe elsewhere (the events: once the
        events writer process was told where they lie, so that the records of
        a tracer killed in between are still in the ring for it to read).
        ``start``: read from there (the events writer taking over the ring)."""
        if start is not None:
            self._read = start
        cons = self._read if self._read is not None else int(self._cons[0])
        recs, end = decode_span(self._data, self._mask, cons, int(self._prod[0]), self.dtype, self._out)
        self._read = end
        return recs, end

    def commit(self, end: int) -> None:
        """Give the ring's space before position ``end`` back to the kernel."""
        if end > int(self._cons[0]):
            self._cons[0] = end

    @property
    def consumed(self) -> int:
        """The kernel's consumer position: everything before it was read."""
        return int(self._cons[0])

    def close(self) -> None:
        # numpy views keep exported buffers alive; drop them before closing the maps
        del self._cons, self._prod, self._data
        self._cons_map.close()
        self._ro_map.close()


def open_table(bpf, name: str, dtype: np.dtype, *, reuse: bool = False) -> RingBuffer:
    """Map the BCC ring-buffer table ``name`` of a loaded BPF object."""
    table = bpf[name]
    return RingBuffer(table.map_fd, int(table.max_entries), dtype, reuse=reuse)
