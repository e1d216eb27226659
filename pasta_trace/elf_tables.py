"""Section headers, symbol tables, PT_LOAD segments and the build-id of an
ELF64 file, read with numpy and bounded by size.

Any process can make the tracer read a file (an executable, a library it
opens): the file's own numbers must not decide what that costs.  A
``.dynsym`` of millions of entries in a sparse file of a few blocks took
pyelftools a minute per open, the opener stopped all that time, and a
``.symtab`` section of another type made it raise AttributeError.  Here
every table is read in one bounded read and decoded as an array; a table
larger than MAX_TABLE_BYTES, than the file, or than the bytes the file
system holds for it (a sparse file's holes hold none), or one of the wrong
type, is refused with BadElf naming the file and the section.

Little-endian ELF64 only: the machines we trace (x86-64)."""

from __future__ import annotations

import os

import numpy as np
from elftools.common.exceptions import ELFError

from .regular_file import allocated_bytes

#: the largest symbol or string table read (libcuda's .dynsym is 100 KB; a
#: large executable's .symtab tens of MB): 2.8 million symbols
MAX_TABLE_BYTES = 64 << 20
#: a table this small is read even from a file that reports fewer allocated
#: blocks (inline data, compressing file systems): its cost is bounded anyway
SMALL_TABLE = 1 << 20
#: section headers read at most (a header table is 64 bytes an entry)
MAX_SECTIONS = 1 << 16
#: a note section read for the build-id
MAX_NOTES = 1 << 20

SHT_NOBITS, SHT_NOTE, SHT_SYMTAB, SHT_DYNSYM, SHT_STRTAB = 8, 7, 2, 11, 3
STT_FUNC = 2
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
PT_LOAD = 1
SHF_COMPRESSED = 0x800
ET_DYN = 3
NT_GNU_BUILD_ID = 3
_SHT_NAMES = {0: "SHT_NULL", 1: "SHT_PROGBITS", 2: "SHT_SYMTAB", 3: "SHT_STRTAB", 4: "SHT_RELA", 5: "SHT_HASH",
              6: "SHT_DYNAMIC", 7: "SHT_NOTE", 8: "SHT_NOBITS", 9: "SHT_REL", 11: "SHT_DYNSYM"}

EHDR = np.dtype([("ident", "S16"), ("type", "<u2"), ("machine", "<u2"), ("version", "<u4"), ("entry", "<u8"),
                 ("phoff", "<u8"), ("shoff", "<u8"), ("flags", "<u4"), ("ehsize", "<u2"), ("phentsize", "<u2"),
                 ("phnum", "<u2"), ("shentsize", "<u2"), ("shnum", "<u2"), ("shstrndx", "<u2")])
SHDR = np.dtype([("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"),
                 ("size", "<u8"), ("link", "<u4"), ("info", "<u4"), ("addralign", "<u8"), ("entsize", "<u8")])
PHDR = np.dtype([("type", "<u4"), ("flags", "<u4"), ("offset", "<u8"), ("vaddr", "<u8"), ("paddr", "<u8"),
                 ("filesz", "<u8"), ("memsz", "<u8"), ("align", "<u8")])
SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"),
                ("size", "<u8")])


class BadElf(ELFError):
    """A file or table that is not what it claims, or beyond the bounds (the message names the file)."""


class NotElf(BadElf):
    """No file of the kind read here: a script, a data file, a 32-bit or big-endian program."""


def _cstr(data: bytes, off: int) -> str:
    end = data.find(b"\0", off)
    return data[off: end if end >= 0 else len(data)].decode("utf-8", "replace")


class Symbols:
    """One symbol table: the entries as an array and their string table."""

    def __init__(self, table: np.ndarray, strings: bytes):
        self.table = table
        self.strings = strings

    def name(self, i: int) -> str:
        off = int(self.table["name"][i])
        return _cstr(self.strings, off) if off < len(self.strings) else ""

    def function_mask(self, *, exported: bool = False, at: np.ndarray | None = None) -> np.ndarray:
        """Which entries (of those at indices ``at``, None: all) are defined,
        named FUNC symbols (not GNU_IFUNC: its value is its resolver's
        address); ``exported``: global or weak ones only."""
        t = self.table if at is None else self.table[at]
        ok = ((t["info"] & 0xF) == STT_FUNC) & (t["shndx"] != 0) & (t["name"] != 0)
        if exported:
            bind = t["info"] >> 4
            ok &= (bind == STB_GLOBAL) | (bind == STB_WEAK)
        return ok

    def functions(self, *, exported: bool = False) -> np.ndarray:
        """Indices (table order) of function_mask's entries."""
        return np.flatnonzero(self.function_mask(exported=exported))

    def named(self, names: set[str]) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(indices in table order, the name of each as an index into the
        third, the names sorted) of the entries named one of ``names``: a
        name is found in the string table, not by decoding every entry's."""
        order = sorted(names)
        offsets, which = [], []
        for k, name in enumerate(order):
            needle = name.encode() + b"\0"
            at = self.strings.find(needle)
            while at >= 0:
                offsets.append(at)
                which.append(k)
                at = self.strings.find(needle, at + 1)
        offs = np.array(offsets, dtype=np.uint32)
        by_off = np.argsort(offs, kind="stable")
        idx = np.flatnonzero(np.isin(self.table["name"], offs))
        at = by_off[np.searchsorted(offs[by_off], self.table["name"][idx])] if idx.size else by_off[:0]
        return idx, np.array(which, dtype=np.int64)[at], order


class ElfImage:
    """The headers of one open ELF64 file (``f``: a binary file object;
    ``path`` names it in errors)."""

    def __init__(self, f, path: str | os.PathLike | None = None):
        self._f = f
        self.path = str(path if path is not None else getattr(f, "name", "?"))
        st = os.fstat(f.fileno())
        self.size = st.st_size
        self.allocated = allocated_bytes(st)
        f.seek(0)
        head = f.read(EHDR.itemsize)
        if len(head) < EHDR.itemsize or head[:4] != b"\x7fELF":
            raise NotElf(f"{self.path}: not an ELF file")
        if head[4:6] != b"\x02\x01":
            raise NotElf(f"{self.path}: not a little-endian ELF64 file")
        self.header = np.frombuffer(head, EHDR)[0]
        self.dynamic = int(self.header["type"]) == ET_DYN
        self.sections = self._section_headers()
        names = self._strings_of(int(self._shstrndx)) if len(self.sections) else b""
        self.section_names = [_cstr(names, int(n)) if n < len(names) else "" for n in self.sections["name"]]
        self.loads = self._loads()

    # ------------------------------------------------------------------ bounded reads

    def _read(self, offset: int, size: int, what: str, limit: int = MAX_TABLE_BYTES) -> bytes:
        """``size`` bytes at ``offset``, or BadElf when they cannot be in the file."""
        self._check(offset, size, what, limit)
        self._f.seek(offset)
        data = self._f.read(size)
        if len(data) != size:
            raise BadElf(f"{self.path}: {what}: short read")
        return data

    def _check(self, offset: int, size: int, what: str, limit: int) -> None:
        if size > limit:
            raise BadElf(f"{self.path}: {what} is {size} bytes, more than the {limit >> 20} MiB read of one")
        if offset + size > self.size:
            raise BadElf(f"{self.path}: {what} ({size} bytes at {offset:#x}) runs past the end of the file "
                         f"({self.size} bytes)")
        if size > max(self.allocated, SMALL_TABLE):
            raise BadElf(f"{self.path}: {what} is {size} bytes, more than the {self.allocated} bytes the file "
                         "system holds for the file (a sparse file)")

    def _section_headers(self) -> np.ndarray:
        h = self.header
        shoff, shnum, entsize = int(h["shoff"]), int(h["shnum"]), int(h["shentsize"])
        self._shstrndx = int(h["shstrndx"])
        if shoff == 0:
            return np.zeros(0, SHDR)
        if entsize != SHDR.itemsize:
            raise BadElf(f"{self.path}: section headers of {entsize} bytes, not {SHDR.itemsize}")
        first = np.frombuffer(self._read(shoff, SHDR.itemsize, "the section header table"), SHDR)[0]
        if shnum == 0:  # extended numbering: the count is the first header's size
            shnum = int(first["size"])
        if self._shstrndx == 0xFFFF:
            self._shstrndx = int(first["link"])
        if shnum > MAX_SECTIONS:
            raise BadElf(f"{self.path}: {shnum} sections, more than the {MAX_SECTIONS} read")
        return np.frombuffer(self._read(shoff, shnum * SHDR.itemsize, "the section header table"), SHDR)

    def _strings_of(self, i: int) -> bytes:
        if not 0 < i < len(self.sections):
            return b""
        s = self.sections[i]
        if int(s["type"]) == SHT_NOBITS:
            return b""
        return self._read(int(s["offset"]), int(s["size"]), f"section {i}'s strings")

    def _loads(self) -> np.ndarray:
        h = self.header
        phoff, phnum, entsize = int(h["phoff"]), int(h["phnum"]), int(h["phentsize"])
        if phnum == 0xFFFF and len(self.sections):  # extended numbering
            phnum = int(self.sections[0]["info"])
        if phoff == 0 or phnum == 0:
            return np.zeros(0, PHDR)
        if entsize != PHDR.itemsize:
            raise BadElf(f"{self.path}: program headers of {entsize} bytes, not {PHDR.itemsize}")
        phdrs = np.frombuffer(self._read(phoff, phnum * PHDR.itemsize, "the program header table"), PHDR)
        return phdrs[phdrs["type"] == PT_LOAD]

    # ------------------------------------------------------------------ what readers use

    def section(self, name: str) -> int | None:
        """Index of the first section called ``name``."""
        try:
            return self.section_names.index(name)
        except ValueError:
            return None

    def section_data(self, i: int, limit: int = MAX_TABLE_BYTES) -> bytes:
        """The bytes of section ``i`` (none for SHT_NOBITS), bounded."""
        s = self.sections[i]
        if int(s["type"]) == SHT_NOBITS:
            return b""
        return self._read(int(s["offset"]), int(s["size"]), f"section {self.section_names[i]}", limit)

    def check_section(self, i: int, limit: int) -> None:
        """BadElf unless section ``i`` lies in the file, within ``limit`` bytes
        (for a reader that reads it itself: pyelftools), and, when compressed
        (SHF_COMPRESSED, or a .zdebug section), expands to at most ``limit``."""
        s = self.sections[i]
        if int(s["type"]) == SHT_NOBITS:
            return
        name = self.section_names[i]
        offset, size = int(s["offset"]), int(s["size"])
        self._check(offset, size, f"section {name}", limit)
        expands = None
        if int(s["flags"]) & SHF_COMPRESSED and size >= 16:
            expands = int(np.frombuffer(self._read(offset, 16, f"section {name}"), "<u8", 1, 8)[0])
        elif name.startswith(".zdebug") and size >= 12:
            head = self._read(offset, 12, f"section {name}")
            expands = int.from_bytes(head[4:12], "big") if head[:4] == b"ZLIB" else None
        if expands is not None and expands > limit:
            raise BadElf(f"{self.path}: section {name} expands to {expands} bytes, more than the "
                         f"{limit >> 20} MiB read of one")

    def symbols(self, name: str) -> Symbols | None:
        """The symbol table called ``name`` (.dynsym, .symtab); None when the
        file has none (or it was stripped to SHT_NOBITS)."""
        i = self.section(name)
        if i is None or int(self.sections[i]["type"]) == SHT_NOBITS:
            return None
        s = self.sections[i]
        kind = int(s["type"])
        if kind not in (SHT_SYMTAB, SHT_DYNSYM):
            raise BadElf(f"{self.path}: {name} is a {_SHT_NAMES.get(kind, hex(kind))} section, not a symbol table")
        if int(s["entsize"]) not in (0, SYM.itemsize):
            raise BadElf(f"{self.path}: {name} has entries of {int(s['entsize'])} bytes, not {SYM.itemsize}")
        data = self._read(int(s["offset"]), int(s["size"]) // SYM.itemsize * SYM.itemsize, name)
        link = int(s["link"])
        if not 0 < link < len(self.sections) or int(self.sections[link]["type"]) != SHT_STRTAB:
            raise BadElf(f"{self.path}: {name} links to section {link}, not a string table")
        strings = self._read(int(self.sections[link]["offset"]), int(self.sections[link]["size"]),
                             f"the strings of {name}")
        return Symbols(np.frombuffer(data, SYM), strings)

    def file_offsets(self, vaddrs: np.ndarray) -> np.ndarray:
        """file_offset of each of ``vaddrs`` (int64), -1 outside every PT_LOAD."""
        out = np.full(len(vaddrs), -1, dtype=np.int64)
        for seg in self.loads[::-1]:  # the first segment that holds an address wins
            start, size, off = int(seg["vaddr"]), int(seg["filesz"]), int(seg["offset"])
            inside = (vaddrs >= start) & (vaddrs < start + size)
            out[inside] = (vaddrs[inside] - np.uint64(start)).astype(np.int64) + off
        return out

    def file_offset(self, vaddr: int) -> int | None:
        """Where the byte at virtual address ``vaddr`` lies in the file."""
        for seg in self.loads:
            start = int(seg["vaddr"])
            if start <= vaddr < start + int(seg["filesz"]):
                return vaddr - start + int(seg["offset"])
        return None

    def build_id(self) -> str | None:
        """The GNU build-id as lowercase hex, None when the file has none."""
        for i in np.flatnonzero(self.sections["type"] == SHT_NOTE):
            data = self.section_data(int(i), MAX_NOTES)
            pos = 0
            while pos + 12 <= len(data):
                namesz, descsz, kind = np.frombuffer(data, "<u4", 3, pos).tolist()
                name_at = pos + 12
                desc_at = name_at + (namesz + 3) // 4 * 4
                end = desc_at + (descsz + 3) // 4 * 4
                if end > len(data):
                    break
                if kind == NT_GNU_BUILD_ID and data[name_at:name_at + namesz] == b"GNU\0":
                    return data[desc_at:desc_at + descsz].hex()
                pos = end
        return None
