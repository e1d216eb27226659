"""decode_span on a ring laid out byte for byte as the kernel lays it out
(header = u32 length with BUSY/DISCARD bits + u32 page offset, records padded
to 8, data area mapped twice)."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pasta_trace import schema
from pasta_trace.capture.bpf.ringbuf import (
    BUSY_BIT,
    DISCARD_BIT,
    HDR_SIZE,
    RecordSizeError,
    decode_span,
    record_stride,
)

DT = schema.HOST_EVENT.dtype
SIZE = 4096  # data area bytes
STRIDE = record_stride(DT.itemsize)


class FakeRing:
    """The data area as two mirrored copies, like the kernel's double mapping."""

    def __init__(self) -> None:
        self.buf = np.zeros(2 * SIZE, dtype=np.uint8)
        self.prod = 0

    def put(self, size: int, flags: int = 0, payload: bytes | None = None) -> int:
        rec = np.zeros(1, DT)
        rec["size"] = self.prod  # identifies the record by its position
        rec["pid"] = 4242
        body = payload if payload is not None else rec.tobytes()
        raw = struct.pack("<II", size | flags, 0) + body
        raw += b"\0" * (record_stride(len(body)) - len(raw))
        for i, byte in enumerate(raw):
            off = (self.prod + i) % SIZE
            self.buf[off] = byte
            self.buf[off + SIZE] = byte
        pos = self.prod
        self.prod += len(raw)
        return pos


def test_stride_is_header_plus_payload_rounded_to_8():
    assert DT.itemsize == 168  # pt_event with stack_id, outer_ts, caller, caller_fp
    assert STRIDE == 176
    assert record_stride(1) == 16
    assert record_stride(8) == 16


def test_empty_span_returns_nothing_and_keeps_position():
    ring = FakeRing()
    recs, cons = decode_span(ring.buf, SIZE - 1, 0, 0, DT)
    assert recs.size == 0
    assert cons == 0


def test_committed_records_decode_in_order():
    ring = FakeRing()
    positions = [ring.put(DT.itemsize) for _ in range(5)]
    recs, cons = decode_span(ring.buf, SIZE - 1, 0, ring.prod, DT)
    assert recs["size"].tolist() == positions
    assert recs["pid"].tolist() == [4242] * 5
    assert cons == 5 * STRIDE


def test_discarded_records_are_skipped_but_consumed():
    ring = FakeRing()
    a = ring.put(DT.itemsize)
    ring.put(DT.itemsize, DISCARD_BIT)
    c = ring.put(DT.itemsize)
    recs, cons = decode_span(ring.buf, SIZE - 1, 0, ring.prod, DT)
    assert recs["size"].tolist() == [a, c]
    assert cons == 3 * STRIDE


def test_stops_at_first_busy_record():
    ring = FakeRing()
    a = ring.put(DT.itemsize)
    ring.put(DT.itemsize, BUSY_BIT)
    ring.put(DT.itemsize)  # committed after a busy one: must wait
    recs, cons = decode_span(ring.buf, SIZE - 1, 0, ring.prod, DT)
    assert recs["size"].tolist() == [a]
    assert cons == STRIDE


def test_records_wrapping_the_end_are_contiguous_through_the_mirror():
    ring = FakeRing()
    # advance to just before the end, as if earlier records were consumed
    ring.prod = SIZE - STRIDE // 2 - HDR_SIZE
    start = ring.prod
    positions = [ring.put(DT.itemsize) for _ in range(3)]
    recs, cons = decode_span(ring.buf, SIZE - 1, start, ring.prod, DT)
    assert recs["size"].tolist() == positions
    assert cons == start + 3 * STRIDE


def test_returned_records_are_a_copy_not_a_view_of_the_ring():
    ring = FakeRing()
    ring.put(DT.itemsize)
    recs, _ = decode_span(ring.buf, SIZE - 1, 0, ring.prod, DT)
    ring.buf[:] = 0
    assert recs["pid"].tolist() == [4242]


def test_wrong_record_size_is_refused():
    ring = FakeRing()
    ring.put(DT.itemsize - 8, payload=b"\1" * (DT.itemsize - 8))
    ring.put(DT.itemsize)
    with pytest.raises(RecordSizeError, match=f"ring record of {DT.itemsize - 8} bytes, expected {DT.itemsize}"):
        decode_span(ring.buf, SIZE - 1, 0, ring.prod, DT)
