"""Protocol-buffer wire encoding, one message at a time and column-wise.

Perfetto traces are a stream of length-delimited TracePacket messages.  Track
descriptors and interned strings are few and are encoded one by one
(`field_*`).  Events are millions: they are encoded as *segments*, a byte
matrix with one row per event and a length per row (0 where the field is
absent), and `assemble` lays the rows of all segments end to end with numpy
scatters, so no Python runs per event.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    """Row i contributes data[i, :lens[i]]; a one-row `data` is shared by every row."""

    data: np.ndarray  # (rows or 1, width) uint8
    lens: np.ndarray  # (rows,) int64, 0 where the field is absent


def _varint_bytes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, width) varint bytes, left-aligned, and each one's length."""
    v = np.ascontiguousarray(values).astype(np.uint64, copy=False)
    lens = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        more = v >= np.uint64(1 << (7 * k))
        if not more.any():
            break
        lens += more
    width = int(lens.max()) if len(v) else 1
    out = np.empty((len(v), width), dtype=np.uint8)
    for k in range(width):
        group = ((v >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        out[:, k] = np.where(lens - 1 > k, group | 0x80, group)
    return out, lens


def tagged(prefix: bytes, values: np.ndarray, present: np.ndarray) -> Segment:
    """`prefix` (a tag, or any fixed bytes) then `values` as varints, where `present`."""
    groups, lens = _varint_bytes(np.where(present, values, 0))
    data = np.empty((len(lens), len(prefix) + groups.shape[1]), dtype=np.uint8)
    data[:, : len(prefix)] = np.frombuffer(prefix, dtype=np.uint8)
    data[:, len(prefix):] = groups
    return Segment(data, np.where(present, lens + len(prefix), 0))


def small_message(field: int, head: bytes, values: np.ndarray, present: np.ndarray) -> Segment:
    """Sub-message `field` whose body is `head` then one varint (e.g. a named
    argument: name id, value tag, value); bodies stay under 128 bytes, so the
    length is one byte."""
    t = tag(field, LEN)
    groups, lens = _varint_bytes(np.where(present, values, 0))
    fixed = len(t) + 1 + len(head)
    data = np.empty((len(lens), fixed + groups.shape[1]), dtype=np.uint8)
    data[:, : len(t)] = np.frombuffer(t, dtype=np.uint8)
    data[:, len(t)] = len(head) + lens
    data[:, len(t) + 1: fixed] = np.frombuffer(head, dtype=np.uint8)
    data[:, fixed:] = groups
    return Segment(data, np.where(present, fixed + lens, 0))


def varint_field(field: int, values: np.ndarray, present: np.ndarray) -> Segment:
    return tagged(tag(field, VARINT), values, present)


def const(b: bytes, present: np.ndarray) -> Segment:
    return Segment(np.frombuffer(b, dtype=np.uint8)[None, :], np.where(present, len(b), 0).astype(np.int64))


def fixed64_field(field: int, values: np.ndarray, present: np.ndarray) -> Segment:
    t = tag(field, I64)
    data = np.empty((len(values), len(t) + 8), dtype=np.uint8)
    data[:, : len(t)] = np.frombuffer(t, dtype=np.uint8)
    data[:, len(t):] = np.ascontiguousarray(values, dtype="<u8").view(np.uint8).reshape(-1, 8)
    return Segment(data, np.where(present, len(t) + 8, 0).astype(np.int64))


def message_field(field: int, body: list[Segment], present: np.ndarray) -> list[Segment]:
    """`body` as the length-delimited sub-message `field`, where `present`
    (body segments must already be empty where it is not)."""
    n = np.sum([s.lens for s in body], axis=0)
    return [tagged(tag(field, LEN), n, present), *body]


def layout(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray]:
    """The segments side by side: a (rows, widths) byte matrix and the mask of
    the bytes each row uses.  The mask is filled a byte column at a time (a
    compare over every row), not row by row: fields are a few bytes wide."""
    n = len(segs[0].lens)
    width = sum(s.data.shape[1] for s in segs)
    data = np.empty((n, width), dtype=np.uint8)
    used = np.empty((n, width), dtype=bool)
    at = 0
    for s in segs:
        w = s.data.shape[1]
        data[:, at: at + w] = s.data
        for k in range(w):
            np.greater(s.lens, k, out=used[:, at + k])
        at += w
    return data, used


def assemble(segs: list[Segment]) -> tuple[np.ndarray, np.ndarray]:
    """All rows, each the concatenation of its segments, end to end (uint8),
    and the length of each row: the used bytes of `layout`, picked out with
    one boolean mask (row-major: row by row, segment by segment), a byte copy
    where an index per output byte would cost four times the output."""
    data, used = layout(segs)
    return data[used], np.sum([s.lens for s in segs], axis=0)


def interleave(parts: list[tuple[np.ndarray, np.ndarray]], positions: list[np.ndarray]) -> np.ndarray:
    """Rows of several `layout`s (data, used) placed so that row i of part j
    lands at row positions[j][i] of the result, end to end.  Each part's used
    bytes are picked out at its own width, and the rows, as one Arrow binary
    array, are put in order by a take (a copy per row), not a matrix as wide
    as the widest part for every row."""
    n = sum(len(pos) for pos in positions)
    if n == 0:
        return np.empty(0, dtype=np.uint8)
    values = np.concatenate([d[u] for d, u in parts])
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.concatenate([u.sum(axis=1) for _, u in parts]), out=offsets[1:])
    rows = pa.LargeBinaryArray.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets),
                                                                   pa.py_buffer(values)])
    take = np.empty(n, dtype=np.int64)
    take[np.concatenate(positions)] = np.arange(n)
    ordered = rows.take(pa.array(take))
    at = np.frombuffer(ordered.buffers()[1], dtype=np.int64)[ordered.offset: ordered.offset + n + 1]
    return np.frombuffer(ordered.buffers()[2], dtype=np.uint8)[at[0]: at[-1]]
