"""Protocol-buffer wire encoding, one message at a time and column-wise.

Perfetto traces are a stream of length-delimited TracePacket messages.  Track
descriptors and interned strings are few and are encoded one by one
(`field_*`).  Events are millions: they are encoded as *segments*, a field of every
event with a length per row (0 where the field is absent).  Rows whose
segments have the same lengths are laid side by side in one byte matrix, a
row per event and no byte unused, so the matrix's bytes are the rows end to
end and no Python runs per event.
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
    is absent), at most `width`.  `put(view, rows)` writes the field of the
    rows `rows` (every row where None), all of one length, into `view`, a
    (len(rows), that length) view of a byte matrix: the bytes are computed
    there, in place (a matrix of their own, copied into it, would be one more
    pass over every byte of the trace)."""

    lens: np.ndarray  # (rows,) int64
    width: int
    put: Callable[[np.ndarray, np.ndarray | None], None]


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


def _of(values: np.ndarray, rows: np.ndarray | None) -> np.ndarray:
    return values if rows is None else values[rows]


def _absent(n: int) -> Segment:
    return Segment(np.zeros(n, dtype=np.int64), 0, lambda view, rows: None)


def tagged(prefix: bytes, values: np.ndarray, present: np.ndarray) -> Segment:
    """`prefix` (a tag, or any fixed bytes) then `values` as varints, where `present`."""
    if not present.any():
        return _absent(len(present))
    v = np.where(present, values, np.uint64(0)).astype(np.uint64, copy=False)
    lens = _varint_lens(v)
    p = np.frombuffer(prefix, dtype=np.uint8)

    def put(view: np.ndarray, rows: np.ndarray | None) -> None:
        view[:, : len(p)] = p
        _put_varint(view[:, len(p):], _of(v, rows))

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

    def put(view: np.ndarray, rows: np.ndarray | None) -> None:
        view[:, : len(t)] = t8
        view[:, len(t)] = len(head) + view.shape[1] - fixed  # the body's length: the rows' value has one length
        view[:, len(t) + 1: fixed] = head8
        _put_varint(view[:, fixed:], _of(v, rows))

    return Segment(np.where(present, fixed + lens, 0), fixed + int(lens.max()), put)


def varint_field(field: int, values: np.ndarray, present: np.ndarray) -> Segment:
    return tagged(tag(field, VARINT), values, present)


def const(b: bytes, present: np.ndarray) -> Segment:
    if not present.any():
        return _absent(len(present))
    b8 = np.frombuffer(b, dtype=np.uint8)

    def put(view: np.ndarray, rows: np.ndarray | None) -> None:
        view[:] = b8

    return Segment(np.where(present, len(b), 0).astype(np.int64), len(b), put)


def fixed64_field(field: int, values: np.ndarray, present: np.ndarray) -> Segment:
    if not present.any():
        return _absent(len(present))
    t = np.frombuffer(tag(field, I64), dtype=np.uint8)

    def put(view: np.ndarray, rows: np.ndarray | None) -> None:
        view[:, : len(t)] = t
        view[:, len(t):] = np.ascontiguousarray(_of(values, rows), dtype="<u8").view(np.uint8).reshape(-1, 8)

    return Segment(np.where(present, len(t) + 8, 0).astype(np.int64), len(t) + 8, put)


def message_field(field: int, body: list[Segment], present: np.ndarray) -> list[Segment]:
    """`body` as the length-delimited sub-message `field`, where `present`
    (body segments must already be empty where it is not)."""
    n = body[0].lens.copy()
    for s in body[1:]:
        n += s.lens
    return [tagged(tag(field, LEN), n, present), *body]


def _rows(segs: list[Segment], rows: np.ndarray | None, n: int) -> np.ndarray:
    """The `n` rows `rows` (every row where None), each segment of one length
    in all of them, end to end.  Each segment is written as whole contiguous
    byte columns of a (bytes, rows) array (into a row-major matrix every field
    would stride through all of it, five times slower), then the array is
    transposed once: its rows end to end are the packets, no byte unused."""
    widths = [s.width if rows is None or not s.width else int(s.lens[rows[0]]) for s in segs]
    data = np.empty((sum(widths), n), dtype=np.uint8)
    at = 0
    for s, w in zip(segs, widths):
        if w:
            s.put(data[at: at + w].T, rows)
        at += w
    return np.ascontiguousarray(data.T).reshape(-1)


#: segment lengths are under 32 bytes: a key digit per segment of varying length
_KEY_BASE = 32


def layout(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The rows, each the concatenation of its segments, end to end (uint8),
    each row's length, and the order the rows are in (None: as given).  Rows
    are grouped by the lengths of the segments whose length varies (a varint
    of a few sizes, a field present or not: few groups), so that each group
    is a byte matrix with no unused byte.  A boolean mask picking the used
    bytes out of one matrix as wide as the widest row cost three times the
    transpose."""
    n = len(segs[0].lens)
    lens = np.zeros(n, dtype=np.int64)
    for s in segs:
        lens += s.lens
    varying = [s for s in segs if s.width and not (s.lens == s.width).all()]
    if not varying:
        return _rows(segs, None, n), lens, None
    key = np.zeros(n, dtype=np.int64)
    for k, s in enumerate(varying):
        if k and k % 12 == 0:  # 32^12 is 2^60: the key so far becomes the rank of its value
            key = np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)
        key = key * _KEY_BASE + s.lens
    order = np.argsort(key, kind="stable")
    ranked = key[order]
    cuts = [0, *(np.flatnonzero(ranked[1:] != ranked[:-1]) + 1).tolist(), n]
    values = np.concatenate([_rows(segs, order[lo:hi], hi - lo) for lo, hi in zip(cuts[:-1], cuts[1:])])
    return values, lens[order], order


def assemble(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray]:
    """All rows, each the concatenation of its segments, end to end (uint8),
    in the order given, and the length of each row."""
    part = layout(segs)
    n = len(part[1])
    return interleave([part], [np.arange(n)]), part[1] if part[2] is None else _placed(part[1], part[2])


def _placed(values: np.ndarray, order: np.ndarray) -> np.ndarray:
    """`values` of the rows `order`, back at those rows."""
    out = np.empty_like(values)
    out[order] = values
    return out


def interleave(parts: list[tuple[np.ndarray, np.ndarray, np.ndarray | None]], positions: list[np.ndarray]) -> np.ndarray:
    """Rows of several `layout`s (values, lens, order) placed so that row i of
    part j (as given to its `layout`) lands at row positions[j][i] of the
    result, end to end.  The rows, as one Arrow binary array, are put in
    order by a take (a copy per row), not an index per byte."""
    n = sum(len(pos) for pos in positions)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    values = np.concatenate([v for v, _, _ in parts])
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.concatenate([lens for _, lens, _ in parts]), out=offsets[1:])
    take = np.empty(n, dtype=np.int64)
    take[np.concatenate([pos if order is None else pos[order] for pos, (_, _, order) in zip(positions, parts)])] = \
        np.arange(n)
    if (take[1:] > take[:-1]).all():  # in order already
        return values
    rows = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets),
                                                                   pa.py_buffer(values)])
    ordered = rows.take(pa.array(take))
    at = np.frombuffer(ordered.buffers()[1], dtype=np.int64)[ordered.offset: ordered.offset + n + 1]
    return np.frombuffer(ordered.buffers()[2], dtype=np.uint8)[at[0]: at[-1]]
