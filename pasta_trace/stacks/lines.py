"""Source file and line of a native frame, from the DWARF line tables of a
library built with -g or of its separate debug file (pyelftools).

Only the compilation unit that holds an address is decoded (found through
``.debug_aranges``), once, when a new stack names it: a debug file such as
libc's holds thousands of units."""

from __future__ import annotations

import bisect
import os
import struct

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from ..elf_tables import ElfImage

#: what pyelftools raises on DWARF it cannot read (it also asserts)
_DWARF_ERRORS = (ValueError, KeyError, IndexError, AssertionError, OSError, AttributeError, TypeError, ELFError,
                 struct.error, EOFError, RecursionError)

#: the largest debug section read (libtorch's debug file holds sections of hundreds of MB)
MAX_SECTION = 1 << 30


class LineTable:
    """file:line lookups in one ELF file (kept open)."""

    def __init__(self, f):
        self._f = f
        # pyelftools reads every debug section whole, and inflates compressed ones: each is
        # checked first against the file (a sparse file's holes hold nothing) and MAX_SECTION
        img = ElfImage(f)
        for i, name in enumerate(img.section_names):
            if name.startswith((".debug_", ".zdebug_")):
                img.check_section(i, MAX_SECTION)
        f.seek(0)
        elf = ELFFile(f)
        self._dwarf = elf.get_dwarf_info() if elf.get_section_by_name(".debug_line") is not None else None
        self._aranges = self._dwarf.get_aranges() if self._dwarf is not None else None
        #: CU offset -> (row addresses, rows (file, line) or None past a sequence's end)
        self._units: dict[int, tuple[list[int], list[tuple[str, int] | None]]] = {}

    @property
    def empty(self) -> bool:
        return self._aranges is None

    def at(self, vaddr: int) -> tuple[str | None, int | None]:
        """(file, line) of the instruction at the file's virtual address ``vaddr``, (None, None) if unknown."""
        if self._aranges is None:
            return None, None
        try:
            off = self._aranges.cu_offset_at_addr(vaddr)
            if off is None:
                return None, None
            if off not in self._units:
                self._units[off] = self._decode(off)
        except _DWARF_ERRORS:
            self._units[off] = ([], [])
        addrs, rows = self._units[off]
        i = bisect.bisect_right(addrs, vaddr) - 1
        return rows[i] if i >= 0 and rows[i] is not None else (None, None)

    def _decode(self, off: int) -> tuple[list[int], list[tuple[str, int] | None]]:
        program = self._dwarf.line_program_for_CU(self._dwarf.get_CU_at(off))
        header = program.header
        v5 = header.version >= 5  # DWARF 5 numbers files and directories from 0, older versions from 1
        dirs = [_text(d) for d in header.include_directory]
        names: list[str] = []
        for entry in header.file_entry:
            d = entry.dir_index if v5 else entry.dir_index - 1
            name = _text(entry.name)
            names.append(name if os.path.isabs(name) or not 0 <= d < len(dirs) else os.path.join(dirs[d], name))
        rows = []
        for e in program.get_entries():
            s = e.state
            if s is None:
                continue
            idx = s.file if v5 else s.file - 1
            rows.append((s.address, None if s.end_sequence or not 0 <= idx < len(names) else (names[idx], s.line)))
        # sequences come in any order; at one address a sequence's end sorts before the row that starts there
        rows.sort(key=lambda r: (r[0], r[1] is not None))
        return [r[0] for r in rows], [r[1] for r in rows]

    def close(self) -> None:
        self._f.close()


def _text(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)
