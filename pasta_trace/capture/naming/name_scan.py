"""Find the name behind CUDA driver handles from the driver's own objects.

A `CUfunction`/`CUkernel` is a pointer to a driver-internal object that
keeps a pointer to the kernel's name (what `cuFuncGetName` returns).  Where
that pointer sits is not documented and may change between drivers, so it is
searched for and checked each time, on the handles of one process:

- every 8-byte slot ``k`` of the first ``max_offset`` bytes of each object
  that points to a NUL-terminated string is a candidate path ``(k,)``; with
  ``depth`` 2 also ``(k1, k2)``: the string ``*(*(handle+k1)+k2)`` points to;
- a path is accepted only when it gives, for every handle read, the name
  already known for it (seen at run time) or a kernel name of the process's
  fatbins for the others, and no other such path gives different names;
- otherwise nothing is named, and ``reason`` says why.

Pure: the memory comes from a ``read(address, size)`` callable (bytes, maybe
fewer than asked, or None where nothing is readable), so it is unit-tested on
synthetic memory; capture.naming.attach_names reads a live process.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Callable

Reader = Callable[[int, int], "bytes | None"]

MAX_OFFSET = 1024  # bytes of each driver object searched for the name pointer
INNER_OFFSET = 256  # bytes searched behind a first-level pointer (one indirection)
MAX_NAME = 4096  # longest name read
MIN_HANDLES = 2  # an offset found on one object alone checks nothing

#: the refusals, worded once (docs/probes.md lists them)
NO_HANDLES = "no launched handle is a readable driver object"
ONE_HANDLE = "one driver object only: nothing to check a name offset against"
NO_CANDIDATES = "the files the process maps hold no CUDA fatbin kernel names"
NO_OFFSET = "no offset in the driver objects holds a kernel name of the process's fatbins"
DISAGREE = "the driver objects hold kernel names at different offsets"
WRONG_KNOWN = "the offset that names the other handles gives another name for a handle named at run time"
AMBIGUOUS = "several offsets in the driver objects give different kernel names"

Path_ = tuple[int, ...]


@dataclass
class ScanResult:
    """Names found for the unknown handles, the accepted path, or why none."""

    names: dict[int, str] = field(default_factory=dict)
    path: Path_ | None = None
    reason: str | None = None
    handles_read: int = 0


def _pointers(block: bytes) -> list[tuple[int, int]]:
    """(offset, value) of each aligned 8-byte slot that could be a user-space pointer."""
    n = len(block) // 8
    vals = struct.unpack_from(f"<{n}Q", block)
    return [(8 * i, v) for i, v in enumerate(vals) if 0x10000 <= v < 1 << 47]


class _Memory:
    """One process's memory, each block and string read once per scan."""

    def __init__(self, read: Reader, longest: int):
        self._read = read
        self._longest = min(max(longest, 1), MAX_NAME)
        self._strings: dict[int, str | None] = {}
        self._blocks: dict[tuple[int, int], bytes] = {}

    def block(self, addr: int, size: int) -> bytes:
        key = (addr, size)
        if key not in self._blocks:
            got = self._read(addr, size) or b""
            self._blocks[key] = got[: len(got) // 8 * 8]
        return self._blocks[key]

    def string(self, addr: int) -> str | None:
        """The printable NUL-terminated string at ``addr`` (no longer than the
        longest candidate: a longer one is no candidate), else None."""
        if addr not in self._strings:
            raw = self._read(addr, self._longest + 1) or b""
            end = raw.find(b"\0")
            text = raw[:end] if end > 0 else b""
            self._strings[addr] = text.decode() if text and text.isascii() and text.decode().isprintable() else None
        return self._strings[addr]


def strings_of(mem: _Memory, handle: int, depth: int) -> dict[Path_, str]:
    """Every path from ``handle`` to a string, and the string."""
    out: dict[Path_, str] = {}
    for k1, p in _pointers(mem.block(handle, MAX_OFFSET)):
        s = mem.string(p)
        if s is not None:
            out[(k1,)] = s
        if depth > 1:
            for k2, q in _pointers(mem.block(p, INNER_OFFSET)):
                s = mem.string(q)
                if s is not None:
                    out[(k1, k2)] = s
    return out


def _matches(found: str, known: str, truncated_at: int | None) -> bool:
    """A name seen at run time may have been cut to the record's size."""
    return found == known or (truncated_at is not None and len(known) >= truncated_at and found.startswith(known))


def scan(read: Reader, unknown: list[int], known: dict[int, str], candidates: set[str], *, depth: int = 2,
         truncated_at: int | None = None) -> ScanResult:
    """Name the ``unknown`` handles of one process (see the module text).

    known: handle -> name seen at run time (its object is read to check the
    path); candidates: the kernel names of the fatbins the process maps
    (known names count too); truncated_at: the length at which a run-time
    name may have been cut."""
    kernels = set(candidates) | set(known.values())
    if not kernels:
        return ScanResult(reason=NO_CANDIDATES)
    mem = _Memory(read, max(map(len, kernels)))
    handles = list(dict.fromkeys([*known, *unknown]))
    found = {h: strings_of(mem, h, depth) for h in handles}
    found = {h: f for h, f in found.items() if mem.block(h, MAX_OFFSET)}
    if not found:
        return ScanResult(reason=NO_HANDLES)
    if len(found) < MIN_HANDLES:
        return ScanResult(reason=ONE_HANDLE, handles_read=len(found))

    def fits(h: int, s: str | None) -> bool:
        if s is None:
            return False
        return _matches(s, known[h], truncated_at) if h in known else s in kernels

    paths = set().union(*(f.keys() for f in found.values()))
    good = sorted((p for p in paths if all(fits(h, f.get(p)) for h, f in found.items())), key=lambda p: (len(p), p))
    result = ScanResult(handles_read=len(found))
    if not good:
        named_each = all(any(s in kernels for s in f.values()) for f in found.values())
        wrong_known = any(all(f.get(p) in kernels for f in found.values()) for p in paths)
        result.reason = WRONG_KNOWN if wrong_known else DISAGREE if named_each else NO_OFFSET
        return result
    picks = {tuple(found[h][p] for h in unknown if h in found) for p in good}
    if len(picks) > 1:
        result.reason = AMBIGUOUS
        return result
    result.path = good[0]
    result.names = {h: found[h][good[0]] for h in unknown if h in found}
    return result


def read_path(read: Reader, handle: int, path: Path_, longest: int) -> str | None:
    """The string an accepted path gives for one more handle (checked by the caller)."""
    mem = _Memory(read, longest)
    addr = handle
    for k in path:
        block = mem.block(addr + k, 8)
        if len(block) < 8:
            return None
        addr = struct.unpack("<Q", block)[0]
    return mem.string(addr)
