"""Read device record files (TLV, docs/device.md) into the frames of ``schema.DEVICE_FRAMES``.

How it stays fast: the only per-record Python is a header walk with ``struct``
(8-byte stride chains cannot be vectorised in general), and it jumps over runs
of equal-length records with one strided numpy view.  Payloads are then decoded
per record type with one gather; per-entry arrays (page histograms, access
samples, ...) are numpy views over the mapped file, copied once into columns.

How it treats damage: it reads everything valid before the first damaged
record, then stops and says where (file, byte offset, reason).  A walk step
always advances by ``total_len >= 16``, so it cannot loop.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from .. import schema
from ..errors import FormatError
from ..regular_file import open_regular
from ..schema import DeviceRecordType as RT

_HDR = schema.DEV_RECORD_HEADER
_HDR_STRUCT = struct.Struct("<HHIQ")
_FILE = schema.DEV_FILE_HEADER

#: one row per device file read: where it came from and its clock bracket
FILES_SCHEMA: dict[str, pl.DataType] = {
    "path": pl.String,
    **{k: v for k, v in schema.record_columns(_FILE).items() if k not in ("magic", "reserved")},
}

#: record types whose payload is a fixed struct -> the frame their rows go to
_FIXED_FRAMES: dict[RT, str] = {
    RT.CLOCK_SYNC: "clock_sync",
    RT.LAUNCH: "launches",
    RT.KERNEL_SUMMARY: "kernel_summaries",
    RT.ALLOC: "allocs",
    RT.FREE: "frees",
    RT.DROPPED: "dropped",
    RT.CUPTI_KERNEL: "cupti_kernels",
    RT.CUPTI_MEMCPY: "cupti_memcpy",
    RT.CUPTI_MEMSET: "cupti_memset",
    RT.TOOL_STATUS: "tool_status",
}
#: record types followed by ``n`` entries -> the frame of their entries
_ENTRY_FRAMES: dict[RT, str] = {
    RT.PAGE_HIST: "page_hist",
    RT.ALLOC_TOUCH: "alloc_touch",
    RT.OPCODE_HIST: "opcode_hist",
    RT.ACCESS_SAMPLES: "access_samples",
}
_KNOWN = {int(t) for t in RT}


@dataclass
class DeviceData:
    #: every key of schema.DEVICE_FRAMES, with exactly that schema (empty where absent)
    frames: dict[str, pl.DataFrame]
    #: one line per damaged file or skipped data: "<file>: stopped at byte N: <reason>"
    problems: list[str] = field(default_factory=list)
    #: one row per file that could be opened (FILES_SCHEMA)
    files: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=FILES_SCHEMA))


# --------------------------------------------------------------------------- header walk


def _walk(buf: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[int, str] | None]:
    """Offsets, types, lengths and launch ids of the well-formed record headers
    from ``start``; plus (offset, reason) where the chain broke, if it did."""
    n = len(buf)
    mv = memoryview(buf)
    offs: list[np.ndarray] = []
    types: list[np.ndarray] = []
    lens: list[np.ndarray] = []
    lids: list[np.ndarray] = []
    s_off: list[int] = []
    s_typ: list[int] = []
    s_len: list[int] = []
    s_lid: list[int] = []

    def flush_scalars() -> None:
        if s_off:
            offs.append(np.array(s_off, dtype=np.int64))
            types.append(np.array(s_typ, dtype=np.uint16))
            lens.append(np.array(s_len, dtype=np.uint32))
            lids.append(np.array(s_lid, dtype=np.uint64))
            s_off.clear(), s_typ.clear(), s_len.clear(), s_lid.clear()

    stop: tuple[int, str] | None = None
    p = start
    while p < n:
        if n - p < _HDR.size:
            stop = (p, f"truncated record header ({n - p} bytes left)")
            break
        typ, _flags, ln, lid = _HDR_STRUCT.unpack_from(mv, p)
        if ln < _HDR.size or ln % 8:
            stop = (p, f"bad record length {ln} (must be >= 16 and a multiple of 8)")
            break
        if ln > n - p:
            stop = (p, f"record of {ln} bytes runs past the end of the file ({n - p} bytes left)")
            break
        nxt = p + ln
        if n - nxt >= _HDR.size and _HDR_STRUCT.unpack_from(mv, nxt)[2] == ln:
            k = _run_length(buf, p, ln)
            flush_scalars()
            view = np.ndarray((k,), dtype=_HDR.dtype, buffer=buf, offset=p, strides=(ln,))
            offs.append(p + np.arange(k, dtype=np.int64) * ln)
            types.append(view["type"].copy())
            lens.append(np.full(k, ln, dtype=np.uint32))
            lids.append(view["launch_id"].copy())
            p += k * ln
        else:
            s_off.append(p), s_typ.append(typ), s_len.append(ln), s_lid.append(lid)
            p = nxt
    flush_scalars()
    cat = lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dtype=dt)  # noqa: E731
    return cat(offs, np.int64), cat(types, np.uint16), cat(lens, np.uint32), cat(lids, np.uint64), stop


def _run_length(buf: np.ndarray, p: int, ln: int) -> int:
    """How many consecutive records from ``p`` have total_len == ln (at least 2, known by the caller).
    Windows double, so the look-ahead costs at most twice the run it finds."""
    max_k = (len(buf) - p) // ln  # records of this length that fit; one that does not is damage, found later
    k, w = 2, 64
    while k < max_k:
        m = min(w, max_k - k)
        tl = np.ndarray((m,), dtype="<u4", buffer=buf, offset=p + k * ln + 4, strides=(ln,))
        bad = np.flatnonzero(tl != ln)
        if len(bad):
            return k + int(bad[0])
        k += m
        w *= 2
    return min(k, max_k)


def _gather(words: np.ndarray, offs: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Structs of ``dtype`` at each (8-aligned) byte offset, copied into one array.
    Indexing 8-byte words keeps the index array 8 times smaller than bytes would."""
    idx = (offs // 8)[:, None] + np.arange(dtype.itemsize // 8, dtype=np.int64)
    return np.ascontiguousarray(words[idx]).view(dtype).reshape(len(offs))


def _gather_grown(words: np.ndarray, offs: np.ndarray, plens: np.ndarray, dtype: np.dtype, least: int) -> np.ndarray:
    """_gather of payloads that an older minor version wrote shorter (``least``
    bytes, a multiple of 8): the fields appended since read as 0, and nothing
    past such a record's own end is read."""
    old = plens < dtype.itemsize
    if not old.any():
        return _gather(words, offs, dtype)
    out = np.zeros(len(offs), dtype=dtype)
    out[~old] = _gather(words, offs[~old], dtype)
    idx = (offs[old] // 8)[:, None] + np.arange(least // 8, dtype=np.int64)
    out.view(np.uint8).reshape(len(offs), dtype.itemsize)[old, :least] = (
        np.ascontiguousarray(words[idx]).view(np.uint8).reshape(-1, least))
    return out


# --------------------------------------------------------------------------- one file


def _frame(name: str, cols: dict[str, np.ndarray | pl.Series]) -> pl.DataFrame:
    sch = schema.DEVICE_FRAMES[name]
    return pl.DataFrame([pl.Series(k, cols[k], dtype=sch[k]) for k in sch])


def _open(path: Path) -> tuple[np.ndarray, dict]:
    fd = open_regular(path, follow=True)  # a FIFO or /dev/zero would block or never end
    try:
        size = os.fstat(fd).st_size
        mm = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size else b""
    except OSError as e:
        raise FormatError(f"{path}: cannot read ({e.strerror})") from None
    finally:
        os.close(fd)
    buf = np.frombuffer(mm, dtype=np.uint8)
    if len(buf) < _FILE.size:
        if len(buf) >= 4 and buf[:4].view("<u4")[0] != schema.DEVICE_MAGIC:
            raise FormatError(f"{path}: not a pasta-trace device file")
        raise FormatError(f"{path}: truncated device file header ({len(buf)} of {_FILE.size} bytes)")
    h = buf[: _FILE.size].view(_FILE.dtype)[0]
    if int(h["magic"]) != schema.DEVICE_MAGIC:
        raise FormatError(f"{path}: not a pasta-trace device file")
    major, minor = int(h["ver_major"]), int(h["ver_minor"])
    if major > schema.DEVICE_FORMAT_VERSION[0]:
        raise FormatError(
            f"{path}: device format {major}.{minor} is newer than this pasta-trace supports "
            f"({schema.DEVICE_FORMAT_VERSION[0]}.x)",
            hint="upgrade pasta-trace",
        )
    if int(h["pid"]) > 0xFFFFFFFF:
        raise FormatError(f"{path}: damaged device file header (pid {int(h['pid'])})")
    hs = int(h["header_size"])
    if hs < _FILE.size or hs % 8 or hs > len(buf):
        raise FormatError(f"{path}: damaged device file header (header_size {hs})")
    return buf, {k: h[k].item() for k in _FILE.dtype.names}


def read_device_file(path: str | os.PathLike) -> DeviceData:
    """Read one device file.  Raises FormatError when the file header is not
    usable; damage after it ends up in ``problems``."""
    path = Path(path)
    buf, head = _open(path)
    offs, types, lens, lids, stop = _walk(buf, head["header_size"])
    problems: list[str] = []
    pid = head["pid"]
    # every record offset and size is a multiple of 8, so whole records lie in these words
    words = buf[: len(buf) // 8 * 8].view("<u8")

    # Validate what each record claims about its own payload; the first record
    # that does not fit is where reading stops.
    payload = offs + _HDR.size
    plen = lens.astype(np.int64) - _HDR.size
    first_bad: tuple[int, str] | None = None  # (record index, reason)
    counts = np.zeros(len(offs), dtype=np.int64)  # entries, string bytes or bitmap words
    heads: dict[RT, tuple[np.ndarray, np.ndarray]] = {}
    for t in np.unique(types).tolist():
        if t not in _KNOWN:
            continue
        sel = np.flatnonzero(types == t)
        rt = RT(t)
        hrec = schema.DEVICE_PAYLOADS[rt]
        least = schema.DEVICE_PAYLOAD_MIN_SIZES.get(rt, hrec.size)
        short = plen[sel] < least
        if short.any() and (first_bad is None or sel[short][0] < first_bad[0]):
            first_bad = (int(sel[short][0]), f"{rt.name} record is too short for its {least}-byte payload")
        ok = sel[~short]
        h = _gather_grown(words, payload[ok], plen[ok], hrec.dtype, least)
        if rt in _ENTRY_FRAMES:
            need = h["n"].astype(np.int64)
            esize = schema.DEVICE_ENTRIES[rt].size
        elif rt is RT.STRING:
            need, esize = h["len"].astype(np.int64), 1
        elif rt is RT.WS_BITMAP:
            need, esize = (h["nbits"].astype(np.int64) + 63) // 64, 8
        else:
            heads[rt] = (ok, h)
            continue
        over = hrec.size + need * esize > plen[ok]
        if over.any() and (first_bad is None or ok[over][0] < first_bad[0]):
            first_bad = (int(ok[over][0]), f"{rt.name} record is too short for the entries it declares")
        heads[rt] = (ok[~over], h[~over])
        counts[ok[~over]] = need[~over]

    end = len(offs)
    if first_bad is not None:
        end = first_bad[0]
        stop = (int(offs[end]), f"{first_bad[1]} ({int(lens[end])} bytes)")
    if stop is not None:
        problems.append(f"{path}: stopped at byte {stop[0]} of {len(buf)}: {stop[1]}")
    unknown = np.unique(types[:end][~np.isin(types[:end], list(_KNOWN))])
    if len(unknown):
        problems.append(f"{path}: skipped records of unknown type(s) {', '.join(map(str, unknown.tolist()))}")

    def keep(rt: RT) -> tuple[np.ndarray, np.ndarray]:
        idx, h = heads.get(rt, (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=schema.DEVICE_PAYLOADS[rt].dtype)))
        m = idx < end
        return idx[m], h[m]

    frames: dict[str, pl.DataFrame] = {}
    # STRING: interned kernel names and opcodes; the first definition of an id wins
    sidx, sh = keep(RT.STRING)
    names = {}
    for i, sid in zip(sidx.tolist(), sh["id"].tolist()):
        o = int(payload[i]) + schema.DEV_STRING_HEADER.size
        names.setdefault(sid, buf[o : o + int(counts[i])].tobytes().decode("utf-8", "replace"))
    ids, texts = pl.Series(list(names), dtype=pl.UInt32), pl.Series(list(names.values()), dtype=pl.String)

    def resolve(col: np.ndarray) -> pl.Series:
        return pl.Series(col, dtype=pl.UInt32).replace_strict(ids, texts, default=None, return_dtype=pl.String)

    for rt, fname in _FIXED_FRAMES.items():
        idx, h = keep(rt)
        cols: dict = {k: h[k] for k in h.dtype.names}
        cols["pid"] = np.full(len(idx), pid, dtype=np.uint32)
        cols["launch_id"] = lids[idx]
        if "name" in schema.DEVICE_FRAMES[fname]:
            cols["name"] = resolve(h["name_id"])
        frames[fname] = _frame(fname, cols)

    for rt, fname in _ENTRY_FRAMES.items():
        idx, h = keep(rt)
        erec = schema.DEVICE_ENTRIES[rt]
        hsize = schema.DEVICE_PAYLOADS[rt].size
        n = counts[idx]
        views = [
            np.ndarray((int(c),), dtype=erec.dtype, buffer=buf, offset=int(o) + hsize)
            for o, c in zip(payload[idx].tolist(), n.tolist())
        ]
        wanted = [k for k in erec.dtype.names if k in schema.DEVICE_FRAMES[fname]]  # not the padding
        cols = {k: (np.concatenate([v[k] for v in views]) if views else np.zeros(0, erec.dtype[k])) for k in wanted}
        cols["pid"] = np.full(int(n.sum()), pid, dtype=np.uint32)
        cols["launch_id"] = np.repeat(lids[idx], n)
        if rt is RT.PAGE_HIST:
            cols["page_shift"] = np.repeat(h["page_shift"], n)
        if rt is RT.OPCODE_HIST:
            cols["opcode"] = resolve(cols["opcode_id"])
        frame = _frame(fname, cols)
        if len(idx) and bool(np.all(lids[idx][1:] >= lids[idx][:-1])):
            # records came launch by launch (the usual case): telling Polars lets a
            # group_by on launch_id work on slices instead of hashing (4x at 1e7 rows)
            frame = frame.with_columns(pl.col("launch_id").set_sorted())
        frames[fname] = frame

    idx, h = keep(RT.WS_BITMAP)
    raw = h["encoding"] == 0
    if (~raw).any():
        problems.append(
            f"{path}: skipped {int((~raw).sum())} WS_BITMAP record(s) with unknown encoding(s) "
            f"{sorted(set(h['encoding'][~raw].tolist()))}"
        )
    idx, h = idx[raw], h[raw]
    bits_at = payload[idx] + schema.DEV_WS_BITMAP_HEADER.size
    bits = [buf[o : o + 8 * int(c)].tobytes() for o, c in zip(bits_at.tolist(), counts[idx].tolist())]
    cols = {k: h[k] for k in h.dtype.names}
    cols.update(pid=np.full(len(idx), pid, dtype=np.uint32), launch_id=lids[idx], bits=pl.Series(bits, dtype=pl.Binary))
    frames["ws_bitmaps"] = _frame("ws_bitmaps", cols)

    head["path"] = str(path)
    files = pl.DataFrame([{k: head[k] for k in FILES_SCHEMA}], schema=FILES_SCHEMA)
    return DeviceData(frames=frames, problems=problems, files=files)


def read_device_files(paths: list[str | os.PathLike] | tuple) -> DeviceData:
    """Read and concatenate device files.  A file that cannot be read at all
    (not a device file, newer major version, damaged header) becomes one line
    in ``problems``; the others are still read."""
    parts: list[DeviceData] = []
    problems: list[str] = []
    for p in paths:
        try:
            d = read_device_file(p)
        except FormatError as e:
            problems.append(e.one_line())
            continue
        parts.append(d)
        problems.extend(d.problems)
    frames = {
        k: pl.concat([d.frames[k] for d in parts]) if parts else schema.empty_frame(sch)
        for k, sch in schema.DEVICE_FRAMES.items()
    }
    files = pl.concat([d.files for d in parts]) if parts else pl.DataFrame(schema=FILES_SCHEMA)
    return DeviceData(frames=frames, problems=problems, files=files)
