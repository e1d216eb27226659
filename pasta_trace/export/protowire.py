"""Protocol-buffer wire encoding, one message at a time and column-wise.

Perfetto traces are a stream of length-delimited TracePacket messages.  Track
descriptors and interned strings are few and are encoded one by one
(`field_*`).  Events are millions: they are encoded as *segments*, a byte
matrix with one row per event and a length per row (0 where the field is
absent), and `assemble` lays the rows of all segments end to end with numpy
scatters, so no Python runs per event.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

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


def field_fixed64(field: int, v: int) -> bytes:
    return tag(field, I64) + struct.pack("<Q", v)


# --------------------------------------------------------------------------- column-wise


@dataclass
class Segment:
    """Row i contributes data[i, :lens[i]]."""

    data: np.ndarray  # (n, width) uint8
    lens: np.ndarray  # (n,) int64


def varints(values: np.ndarray) -> Segment:
    v = np.ascontiguousarray(values).astype(np.uint64, copy=False)
    shifts = np.arange(0, 70, 7, dtype=np.uint64)
    groups = ((v[:, None] >> shifts) & np.uint64(0x7F)).astype(np.uint8)
    lens = np.ones(len(v), dtype=np.int64)
    for k in range(1, 10):
        lens += v >= np.uint64(1 << (7 * k))
    cont = np.arange(10)[None, :] < (lens[:, None] - 1)
    groups[cont] |= 0x80
    width = int(lens.max()) if len(v) else 1
    return Segment(groups[:, :width], lens)


def const(b: bytes, present: np.ndarray) -> Segment:
    data = np.broadcast_to(np.frombuffer(b, dtype=np.uint8), (len(present), len(b)))
    return Segment(data, np.where(present, len(b), 0).astype(np.int64))


def fixed64s(values: np.ndarray) -> Segment:
    v = np.ascontiguousarray(values, dtype="<u8")
    return Segment(v.view(np.uint8).reshape(len(v), 8), np.full(len(v), 8, dtype=np.int64))


def present_only(seg: Segment, present: np.ndarray) -> Segment:
    return Segment(seg.data, np.where(present, seg.lens, 0))


def scalar_field(field: int, values: np.ndarray, present: np.ndarray) -> list[Segment]:
    """`field` as a varint, where `present`."""
    return [const(tag(field, VARINT), present), present_only(varints(np.where(present, values, 0)), present)]


def fixed64_field(field: int, values: np.ndarray, present: np.ndarray) -> list[Segment]:
    return [const(tag(field, I64), present), present_only(fixed64s(np.where(present, values, 0)), present)]


def total_len(segs: list[Segment]) -> np.ndarray:
    return np.sum([s.lens for s in segs], axis=0) if segs else np.zeros(0, dtype=np.int64)


def message_field(field: int, body: list[Segment], present: np.ndarray) -> list[Segment]:
    """`body` wrapped as a length-delimited sub-message `field`, where `present`."""
    n = total_len(body)
    return [const(tag(field, LEN), present), present_only(varints(n), present),
            *[present_only(s, present) for s in body]]


def assemble(segs: list[Segment]) -> np.ndarray:
    """All rows, each the concatenation of its segments, end to end (uint8)."""
    lens = np.stack([s.lens for s in segs])  # (segments, rows)
    row_len = lens.sum(axis=0)
    row_start = np.concatenate(([0], np.cumsum(row_len)[:-1]))
    seg_start = row_start + np.concatenate((np.zeros((1, lens.shape[1]), dtype=np.int64),
                                            np.cumsum(lens, axis=0)[:-1]))
    out = np.empty(int(row_len.sum()), dtype=np.uint8)
    for seg, start in zip(segs, seg_start):
        width = seg.data.shape[1]
        if width == 0:
            continue
        mask = np.arange(width)[None, :] < seg.lens[:, None]
        dst = start[:, None] + np.arange(width)[None, :]
        out[dst[mask]] = seg.data[mask]
    return out
