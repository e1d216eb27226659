"""Protocol-buffer wire encoding, one message at a time and column-wise.

Perfetto traces are a stream of length-delimited TracePacket messages.  Track
descriptors and interned strings are few and are encoded one by one
(`field_*`).  Events are millions: they are encoded as *segments*, a field of every
event with a length per row (0 where the field is absent), laid side by side
in one byte matrix with a row per event, and the used bytes of each row
picked out end to end with one boolean mask, so no Python runs per event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pyarrow as pa

VARINT, I64, LEN = 0, 1, 2


def varint(v: int) -> bytes:
    v &= (1 << 64) - 1  # negative int64 is written as its two's complement
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def tag(field: int, wire: int) -> bytes:
    return varint(field << 3 | wire)


def field_varint(field: int, v: int) -> bytes:
    return tag(field, VARINT) + varint(int(v))


def field_bytes(field: int, payload: bytes | str) -> bytes:
    b = payload.encode() if isinstance(payload, str) else payload
    return tag(field, LEN) + varint(len(b)) + b


# --------------------------------------------------------------------------- column-wise


@dataclass
class Segment:
    """A field of every row: row i writes `lens[i]` bytes (0 where the field
    is absent), at most `width`; `put` writes them, left-aligned, into a
    (rows, width) view of the packets' matrix.  The bytes are computed there,
    in place: a matrix of their own, copied into it, would be one more pass
    over every byte of the trace."""

    lens: np.ndarray  # (rows,) int64
    width: int
    put: Callable[[np.ndarray], None]


def _varint_lens(v: np.ndarray) -> np.ndarray:
    """Bytes of each varint: 1 + the number of 7-bit steps (2^7, 2^14, ...)
    at or under it, counted only up to the largest value's (most fields are
    small ids: one or two compares, where a binary search costs four)."""
    lens = np.ones(len(v), dtype=np.int64)
    top = int(v.max()) if len(v) else 0
    for k in range(1, 10):
        if top < 1 << (7 * k):
            break
        lens += v >= np.uint64(1 << (7 * k))
    return lens


def _put_varint(view: np.ndarray, v: np.ndarray) -> None:
    """Varints of `v` into the byte columns of `view` (as many as the longest needs)."""
    rest = v.copy()
    for k in range(view.shape[1]):
        more = rest >= 0x80
        np.bitwise_or(rest.astype(np.uint8) & 0x7F, more.view(np.uint8) << 7, out=view[:, k])
        rest >>= np.uint64(7)


def _absent(n: int) -> Segment:
    return Segment(np.zeros(n, dtype=np.int64), 0, lambda view: None)


def tagged(prefix: bytes, values: np.ndarray, present: np.ndarray) -> Segment:
    """`prefix` (a tag, or any fixed bytes) then `values` as varints, where `present`."""
    if not present.any():
        return _absent(len(present))
    v = np.where(present, values, np.uint64(0)).astype(np.uint64, copy=False)
    lens = _varint_lens(v)
    p = np.frombuffer(prefix, dtype=np.uint8)

    def put(view: np.ndarray) -> None:
        view[:, : len(p)] = p
        _put_varint(view[:, len(p):], v)

    return Segment(np.where(present, lens + len(p), 0), len(p) + int(lens.max()), put)


def small_message(field: int, head: bytes, values: np.ndarray, present: np.ndarray) -> Segment:
    """Sub-message `field` whose body is `head` then one varint (e.g. a named
    argument: name id, value tag, value); bodies stay under 128 bytes, so the
    length is one byte."""
    if not present.any():
        return _absent(len(present))
    t = tag(field, LEN)
    v = np.where(present, values, np.uint64(0)).astype(np.uint64, copy=False)
    lens = _varint_lens(v)
    fixed = len(t) + 1 + len(head)
    t8, head8 = np.frombuffer(t, dtype=np.uint8), np.frombuffer(head, dtype=np.uint8)

    def put(view: np.ndarray) -> None:
        view[:, : len(t)] = t8
        view[:, len(t)] = len(head) + lens
        view[:, len(t) + 1: fixed] = head8
        _put_varint(view[:, fixed:], v)

    return Segment(np.where(present, fixed + lens, 0), fixed + int(lens.max()), put)


def varint_field(field: int, values: np.ndarray, present: np.ndarray) -> Segment:
    return tagged(tag(field, VARINT), values, present)


def const(b: bytes, present: np.ndarray) -> Segment:
    if not present.any():
        return _absent(len(present))
    b8 = np.frombuffer(b, dtype=np.uint8)

    def put(view: np.ndarray) -> None:
        view[:] = b8

    return Segment(np.where(present, len(b), 0).astype(np.int64), len(b), put)


def fixed64_field(field: int, values: np.ndarray, present: np.ndarray) -> Segment:
    if not present.any():
        return _absent(len(present))
    t = np.frombuffer(tag(field, I64), dtype=np.uint8)

    def put(view: np.ndarray) -> None:
        view[:, : len(t)] = t
        view[:, len(t):] = np.ascontiguousarray(values, dtype="<u8").view(np.uint8).reshape(-1, 8)

    return Segment(np.where(present, len(t) + 8, 0).astype(np.int64), len(t) + 8, put)


def message_field(field: int, body: list[Segment], present: np.ndarray) -> list[Segment]:
    """`body` as the length-delimited sub-message `field`, where `present`
    (body segments must already be empty where it is not)."""
    n = body[0].lens.copy()
    for s in body[1:]:
        n += s.lens
    return [tagged(tag(field, LEN), n, present), *body]


def layout(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The segments side by side: a (rows, widths) byte matrix, the mask of
    the bytes each row uses, and each row's length.  Both matrices are laid
    out a byte column after another (views of (widths, rows) arrays): each
    field's bytes and mask are then written as whole contiguous columns, where
    in a row-major matrix every field would stride through all of it, five
    times slower; the boolean pick of the used bytes reads them row by row
    all the same."""
    n = len(segs[0].lens)
    width = sum(s.width for s in segs)
    data = np.empty((width, n), dtype=np.uint8)
    used = np.empty((width, n), dtype=bool)
    lens = np.zeros(n, dtype=np.int64)
    at = 0
    for s in segs:
        if s.width:
            s.put(data[at: at + s.width].T)
            for k in range(s.width):
                np.greater(s.lens, k, out=used[at + k])
            lens += s.lens
        at += s.width
    return data.T, used.T, lens


def assemble(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray]:
    """All rows, each the concatenation of its segments, end to end (uint8),
    and the length of each row: the used bytes of `layout`, picked out with
    one boolean mask (row-major: row by row, segment by segment), a byte copy
    where an index per output byte would cost four times the output."""
    data, used, lens = layout(segs)
    return data[used], lens


def interleave(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], positions: list[np.ndarray]) -> np.ndarray:
    """Rows of several `layout`s (data, used, lens) placed so that row i of
    part j lands at row positions[j][i] of the result, end to end.  Each
    part's used bytes are picked out at its own width, and the rows, as one
    Arrow binary array, are put in order by a take (a copy per row), not a
    matrix as wide as the widest part for every row."""
    n = sum(len(pos) for pos in positions)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    values = np.concatenate([d[u] for d, u, _ in parts])
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.concatenate([lens for _, _, lens in parts]), out=offsets[1:])
    rows = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets),
                                                                   pa.py_buffer(values)])
    take = np.empty(n, dtype=np.int64)
    take[np.concatenate(positions)] = np.arange(n)
    ordered = rows.take(pa.array(take))
    at = np.frombuffer(ordered.buffers()[1], dtype=np.int64)[ordered.offset: ordered.offset + n + 1]
    return np.frombuffer(ordered.buffers()[2], dtype=np.uint8)[at[0]: at[-1]]
