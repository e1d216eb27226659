"""Write device record files (the TLV format of docs/device.md) from Python.

The CUPTI collector, the tests and the synthetic benchmark write through this
module; the C++ writer in gpu_probes/ produces the same bytes from the header
generated out of :mod:`pasta_trace.schema`.  Every layout comes from the schema:
a payload is a one-element structured array of ``schema.DEVICE_PAYLOADS[type]``
and per-entry arrays are structured arrays of ``schema.DEVICE_ENTRIES[type]``.
"""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np

from .. import schema
from ..schema import DeviceBackend, DeviceRecordType, Record

RT = DeviceRecordType
_REC_HDR = struct.Struct("<HHIQ")
assert _REC_HDR.size == schema.DEV_RECORD_HEADER.size


def device_file_name(pid: int, backend: DeviceBackend | str) -> str:
    """``gpu_probes.<pid>.<backend>.bin``: the name every writer uses."""
    name = backend.name if isinstance(backend, DeviceBackend) else str(backend)
    return f"gpu_probes.{pid}.{name}.bin"


def pack(record: Record, **values: int) -> np.ndarray:
    """One ``record`` as a 1-element structured array; fields not given are 0."""
    unknown = set(values) - set(record.dtype.names)
    if unknown:
        raise TypeError(f"{record.name} has no field(s) {sorted(unknown)}")
    out = np.zeros(1, dtype=record.dtype)
    for k, v in values.items():
        out[k] = v
    return out


def entries(record: Record, **columns) -> np.ndarray:
    """A structured array of ``record`` built from equal-length columns; missing fields are 0."""
    n = len(next(iter(columns.values()))) if columns else 0
    out = np.zeros(n, dtype=record.dtype)
    for k, v in columns.items():
        out[k] = v
    return out


def file_header(
    pid: int,
    backend: DeviceBackend,
    *,
    page_shift: int = 16,
    device_count: int = 0,
    flags: int = 0,
    version: tuple[int, int] = schema.DEVICE_FORMAT_VERSION,
    header_size: int = schema.DEV_FILE_HEADER.size,
    magic: int = schema.DEVICE_MAGIC,
) -> bytes:
    """The file header, with a (CLOCK_MONOTONIC, CLOCK_REALTIME, CLOCK_MONOTONIC) bracket taken now.

    ``header_size`` above 64 appends zeros, as a later minor version with a longer header would."""
    mono_open = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    real_open = time.clock_gettime_ns(time.CLOCK_REALTIME)
    mono_after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    h = pack(
        schema.DEV_FILE_HEADER,
        magic=magic,
        ver_major=version[0],
        ver_minor=version[1],
        header_size=header_size,
        flags=flags,
        pid=pid,
        mono_open=mono_open,
        real_open=real_open,
        mono_after=mono_after,
        backend=int(backend),
        device_count=device_count,
        page_shift=page_shift,
    )
    return h.tobytes() + bytes(max(0, header_size - schema.DEV_FILE_HEADER.size))


def encode(rtype: int, *parts: bytes | memoryview | np.ndarray, launch_id: int = 0, flags: int = 0) -> bytes:
    """One record: 16-byte header + the parts, zero-padded to a multiple of 8."""
    body = b"".join(p.tobytes() if isinstance(p, np.ndarray) else bytes(p) for p in parts)
    pad = -len(body) % 8
    return _REC_HDR.pack(int(rtype), flags, 16 + len(body) + pad, launch_id) + body + bytes(pad)


class DeviceFileWriter:
    """Appends records to one device file.  Not thread-safe: callers serialise (the
    CUPTI collector holds a lock around its buffer callback)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        pid: int,
        backend: DeviceBackend,
        page_shift: int = 16,
        device_count: int = 0,
    ) -> None:
        self.path = Path(path)
        self.pid = pid
        self.page_shift = page_shift
        self._f: BinaryIO = open(self.path, "wb")
        self._f.write(file_header(pid, backend, page_shift=page_shift, device_count=device_count))

    # ------------------------------------------------------------------ generic

    def write_raw(self, data: bytes | memoryview) -> None:
        self._f.write(data)

    def record(self, rtype: DeviceRecordType, *, launch_id: int = 0, **fields: int) -> None:
        """A record whose payload is just ``schema.DEVICE_PAYLOADS[rtype]``."""
        self._f.write(encode(rtype, pack(schema.DEVICE_PAYLOADS[rtype], **fields), launch_id=launch_id))

    def _with_entries(self, rtype: DeviceRecordType, launch_id: int, head: np.ndarray, ent: np.ndarray) -> None:
        if ent.dtype != schema.DEVICE_ENTRIES[rtype].dtype:
            raise TypeError(f"{rtype.name} entries must have dtype {schema.DEVICE_ENTRIES[rtype].dtype}")
        ent = np.ascontiguousarray(ent)
        # written in two calls so a 10^8-entry array is not copied into one bytes object
        self._f.write(_REC_HDR.pack(int(rtype), 0, 16 + head.nbytes + ent.nbytes, launch_id))
        self._f.write(head.tobytes())
        self._f.write(memoryview(ent).cast("B"))

    # ------------------------------------------------------------------ typed helpers

    def string(self, sid: int, text: str) -> None:
        b = text.encode()
        self._f.write(encode(RT.STRING, pack(schema.DEV_STRING_HEADER, id=sid, len=len(b)), b))

    def page_hist(self, launch_id: int, pages: np.ndarray, counts: np.ndarray, page_shift: int | None = None) -> None:
        ent = entries(schema.DEV_PAGE_HIST_ENTRY, page=pages, count=counts)
        shift = self.page_shift if page_shift is None else page_shift
        self._with_entries(RT.PAGE_HIST, launch_id, pack(schema.DEV_PAGE_HIST_HEADER, page_shift=shift, n=len(ent)), ent)

    def alloc_touch(self, launch_id: int, ent: np.ndarray) -> None:
        self._with_entries(RT.ALLOC_TOUCH, launch_id, pack(schema.DEV_ALLOC_TOUCH_HEADER, n=len(ent)), ent)

    def opcode_hist(self, launch_id: int, opcode_ids: np.ndarray, counts: np.ndarray) -> None:
        ent = entries(schema.DEV_OPCODE_HIST_ENTRY, opcode_id=opcode_ids, count=counts)
        self._with_entries(RT.OPCODE_HIST, launch_id, pack(schema.DEV_OPCODE_HIST_HEADER, n=len(ent)), ent)

    def access_samples(self, launch_id: int, samples: np.ndarray, *, sample_every: int = 1, dropped: int = 0) -> None:
        head = pack(schema.DEV_ACCESS_SAMPLES_HEADER, n=len(samples), sample_every=sample_every, dropped=dropped)
        self._with_entries(RT.ACCESS_SAMPLES, launch_id, head, samples)

    def ws_bitmap(self, launch_id: int, alloc_base: int, nbits: int, words: np.ndarray, page_shift: int | None = None) -> None:
        """Raw encoding (0): ceil(nbits/64) little-endian u64 words, bit i = page i of the allocation."""
        words = np.asarray(words, dtype="<u8")
        if len(words) != -(-nbits // 64):
            raise ValueError(f"{nbits} bits need {-(-nbits // 64)} words, got {len(words)}")
        shift = self.page_shift if page_shift is None else page_shift
        head = pack(schema.DEV_WS_BITMAP_HEADER, alloc_base=alloc_base, page_shift=shift, nbits=nbits, encoding=0)
        self._f.write(encode(RT.WS_BITMAP, head, words, launch_id=launch_id))

    def tool_status(self, **fields: int) -> None:
        """A TOOL_STATUS record; the ``rc_*`` fields not given are TOOL_STATUS_NOT_CALLED, as the C side starts them."""
        rcs = {f.name: schema.TOOL_STATUS_NOT_CALLED for f in schema.DEV_TOOL_STATUS.fields if f.name.startswith("rc_")}
        self.record(RT.TOOL_STATUS, **{**rcs, **fields})

    # ------------------------------------------------------------------ lifetime

    def flush(self) -> None:
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def discard(self) -> None:
        """Close and remove the file (nothing worth keeping was written)."""
        self.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> "DeviceFileWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
