"""Read CPython code objects out of a live process (/proc/PID/mem): qualname,
file name, first line and the 3.11+ location table, which maps an
instruction to its line (CPython's Objects/locations.md).

A code object is read once per (pid, code address) and kept: the process
may be gone when its stacks are written out."""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from .offsets import PyLayout

_MAX_STRING = 4096
_MAX_LINETABLE = 1 << 20


class Unreadable(Exception):
    """The object is not there any more, or is not what it should be."""


@dataclass(frozen=True)
class Code:
    qualname: str
    filename: str
    firstlineno: int
    code_start: int  # address of the first code unit (co_code_adaptive)
    starts: tuple[int, ...]  # location-table entries: first code unit of each
    lines: tuple[int | None, ...]  # and its line (None: no location)

    def line_at(self, instr: int) -> int | None:
        """Line of the instruction at address ``instr``."""
        unit = (instr - self.code_start) // 2
        if unit < 0:  # a frame that has not started yet: its first line
            return self.firstlineno
        i = bisect.bisect_right(self.starts, unit) - 1
        return self.lines[i] if i >= 0 else self.firstlineno


def _varint(data: bytes, i: int) -> tuple[int, int]:
    b = data[i]
    val, shift = b & 63, 6
    i += 1
    while b & 64:
        b = data[i]
        val |= (b & 63) << shift
        shift += 6
        i += 1
    return val, i


def _svarint(data: bytes, i: int) -> tuple[int, int]:
    v, i = _varint(data, i)
    return (-(v >> 1) if v & 1 else v >> 1), i


def _entry_end(table: bytes, i: int) -> int:
    """Where the entry starting at ``i`` ends (past the table's end when it is cut)."""
    code = (table[i] >> 3) & 15
    i += 1
    varints = {14: 4, 13: 1}.get(code, 0)
    for _ in range(varints):
        while i < len(table) and table[i] & 64:
            i += 1
        i += 1
    return i + (2 if code in (10, 11, 12) else 0 if code in (13, 14, 15) else 1)


def parse_locations(table: bytes, firstlineno: int) -> tuple[tuple[int, ...], tuple[int | None, ...]]:
    """(first code unit, line) of each entry of a 3.11+ location table.  A
    table cut short (the process's own bytes: anything) ends at its last
    whole entry."""
    starts: list[int] = []
    lines: list[int | None] = []
    unit, line, i = 0, firstlineno, 0
    while i < len(table):
        if _entry_end(table, i) > len(table):
            break
        first = table[i]
        code, length = (first >> 3) & 15, (first & 7) + 1
        i += 1
        if code == 15:  # no location
            entry = None
        elif code == 14:  # long form: line delta, end line delta, column, end column
            delta, i = _svarint(table, i)
            line += delta
            for _ in range(3):
                _, i = _varint(table, i)
            entry = line
        elif code == 13:  # no column
            delta, i = _svarint(table, i)
            line += delta
            entry = line
        elif code in (10, 11, 12):  # one line, delta code - 10, two column bytes
            line += code - 10
            i += 2
            entry = line
        else:  # short form: same line, one column byte
            i += 1
            entry = line
        starts.append(unit)
        lines.append(entry)
        unit += length
    return tuple(starts), tuple(lines)


class ProcessMemory:
    """Reads of one process's memory; closed when the process is forgotten."""

    def __init__(self, pid: int, proc: Path = Path("/proc")):
        self.pid = pid
        self._fd = os.open(proc / str(pid) / "mem", os.O_RDONLY)

    def read(self, addr: int, size: int) -> bytes:
        try:
            data = os.pread(self._fd, size, addr)
        except OSError as e:
            raise Unreadable(f"0x{addr:x}: {e.strerror}") from None
        if len(data) != size:
            raise Unreadable(f"0x{addr:x}: short read")
        return data

    def close(self) -> None:
        os.close(self._fd)


def _u64(data: bytes, off: int) -> int:
    return struct.unpack_from("<Q", data, off)[0]


def read_string(mem: ProcessMemory, layout: PyLayout, addr: int) -> str:
    """A str object (compact: every str a code object holds is).  Reads stop
    at the object's end: an object can end where the mapping does."""
    head = mem.read(addr, layout.ascii_size)
    length = _u64(head, layout.unicode_length)
    state = struct.unpack_from("<I", head, layout.unicode_state)[0]
    kind, compact, ascii_ = (state >> 2) & 7, (state >> 5) & 1, (state >> 6) & 1
    if not compact or kind not in (1, 2, 4) or length > _MAX_STRING:
        raise Unreadable(f"0x{addr:x}: not a compact str")
    if ascii_:
        return mem.read(addr + layout.ascii_size, length).decode("ascii", "replace")
    raw = mem.read(addr + layout.compact_size, length * kind)
    return raw.decode({1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}[kind], "replace")


def read_bytes(mem: ProcessMemory, layout: PyLayout, addr: int) -> bytes:
    size = _u64(mem.read(addr + layout.bytes_size, 8), 0)
    if size > _MAX_LINETABLE:
        raise Unreadable(f"0x{addr:x}: not a bytes object")
    return mem.read(addr + layout.bytes_sval, size)


def read_code(mem: ProcessMemory, layout: PyLayout, addr: int, code_type: int = 0) -> Code:
    """The code object at ``addr``; ``code_type`` (PyCode_Type's address, 0 to
    skip) guards against a pointer that is no longer a code object."""
    raw = mem.read(addr, layout.code_adaptive)  # every field we use lies below the bytecode
    if code_type and _u64(raw, layout.ob_type) != code_type:
        raise Unreadable(f"0x{addr:x}: not a code object")
    firstlineno = struct.unpack_from("<i", raw, layout.code_firstlineno)[0]
    try:
        starts, lines = parse_locations(read_bytes(mem, layout, _u64(raw, layout.code_linetable)), firstlineno)
    except (IndexError, ValueError, struct.error) as e:  # the process's bytes: a table parse_locations missed
        raise Unreadable(f"0x{addr:x}: a damaged location table ({e})") from None
    return Code(
        qualname=read_string(mem, layout, _u64(raw, layout.code_qualname)),
        filename=read_string(mem, layout, _u64(raw, layout.code_filename)),
        firstlineno=firstlineno,
        code_start=addr + layout.code_adaptive,
        starts=starts,
        lines=lines,
    )
