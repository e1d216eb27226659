"""Find the CPython interpreter of a running process: the file that defines
``_PyRuntime`` (the python executable, static like Debian's ET_EXEC
/usr/bin/python3.11, or ``libpython3.X.so`` for pyenv and conda builds), its
load bias, its version and its layout.

Files are opened through /proc/PID/map_files (the file the process really
mapped, also inside a container or a venv, even when deleted), falling back
to /proc/PID/root/PATH."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError

from ..elf_tables import ElfImage
from ..regular_file import open_library
from .offsets import DEBUG_GROUPS, PyLayout, Unsupported, debug_offsets_size, layout_for

#: python3.12, python3.12d, libpython3.12.so.1.0, libpython3.12d.so ...
_PYTHON_FILE = re.compile(r"^(?:lib)?python(\d)\.(\d+)[a-z]*(?:\.so[.\d]*)?$")


class NotPython(Exception):
    """The process maps no CPython 3 interpreter."""


@dataclass(frozen=True)
class Interpreter:
    pid: int
    path: str  # as the process sees it
    version: int  # PY_VERSION_HEX
    runtime: int  # address of _PyRuntime
    code_type: int  # address of PyCode_Type (0: unknown): code objects are checked against it
    layout: PyLayout

    @property
    def version_text(self) -> str:
        v = self.version
        return f"{v >> 24}.{(v >> 16) & 0xFF}.{(v >> 8) & 0xFF}"


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    offset: int
    path: str
    dev: str = ""  # "major:minor" in hex, as maps writes it
    inode: int = 0


def parse_maps(text: str, *, executable: bool = False) -> list[Mapping]:
    """The file mappings of a /proc/PID/maps text (``executable``: only those that hold code), by address."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/") or (executable and "x" not in parts[1]):
            continue
        lo, _, hi = parts[0].partition("-")
        out.append(Mapping(int(lo, 16), int(hi, 16), int(parts[2], 16), parts[5].removesuffix(" (deleted)"),
                           parts[3], int(parts[4]) if parts[4].isdigit() else 0))
    return sorted(out, key=lambda m: m.start)


def _mappings(pid: int, proc: Path) -> list[Mapping]:
    return parse_maps((proc / str(pid) / "maps").read_text())


def _open_mapped(pid: int, proc: Path, path: str, maps: list[Mapping]):
    """A binary file object of ``path`` as mapped by ``pid`` (a regular file
    only, opened without blocking: the process chose what the path names)."""
    m = next((m for m in maps if m.path == path), None)
    if m is not None:
        try:
            return open_library(proc / str(pid) / "map_files" / f"{m.start:x}-{m.end:x}")
        except OSError:
            pass
    return open_library(proc / str(pid) / "root" / path.lstrip("/"))


def _symbols(img: ElfImage, names: set[str]) -> dict[str, int]:
    """Defined symbols of ``names`` (st_value), from .dynsym then .symtab (read bounded: elf_tables)."""
    found: dict[str, int] = {}
    for sec_name in (".dynsym", ".symtab"):
        table = img.symbols(sec_name)
        if table is None:
            continue
        t = table.table
        idx, which, order = table.named(names - found.keys())
        for i, name in zip(idx.tolist(), (order[w] for w in which.tolist())):
            if name not in found and t["shndx"][i] != 0 and t["value"][i]:
                found[name] = int(t["value"][i])
    return found


@dataclass(frozen=True)
class _ElfFacts:
    symbols: dict[str, int]
    dynamic: bool  # ET_DYN: loaded at a bias
    load_delta: int  # p_vaddr - p_offset of the lowest PT_LOAD


def _elf_facts(f) -> _ElfFacts:
    img = ElfImage(f)
    seg = min(img.loads, key=lambda s: int(s["offset"])) if len(img.loads) else None
    return _ElfFacts(_symbols(img, {"_PyRuntime", "PyCode_Type", "Py_Version"}), img.dynamic,
                     int(seg["vaddr"]) - int(seg["offset"]) if seg is not None else 0)


def _bias(facts: _ElfFacts, maps: list[Mapping], path: str) -> int:
    """Load bias: where the file's address 0 is in the process."""
    if not facts.dynamic:
        return 0
    first = next((m for m in maps if m.path == path and m.offset == 0), None)
    if first is None:
        raise Unsupported(f"{path}: its first segment is not mapped")
    return first.start - facts.load_delta


def read_memory(pid: int, addr: int, size: int, proc: Path = Path("/proc")) -> bytes:
    fd = os.open(proc / str(pid) / "mem", os.O_RDONLY)
    try:
        return os.pread(fd, size, addr)
    finally:
        os.close(fd)


class Finder:
    """Finds interpreters; an interpreter file is parsed once (by device and
    inode), however many processes run it."""

    def __init__(self, proc: Path = Path("/proc")):
        self.proc = proc
        self._facts: dict[tuple[int, int], _ElfFacts] = {}

    def _facts_of(self, pid: int, path: str, maps: list[Mapping]) -> _ElfFacts:
        with _open_mapped(pid, self.proc, path, maps) as f:
            st = os.fstat(f.fileno())
            key = (st.st_dev, st.st_ino)
            if key not in self._facts:
                self._facts[key] = _elf_facts(f)
            return self._facts[key]

    def find(self, pid: int) -> Interpreter:
        """The interpreter of ``pid``.  Raises NotPython, Unsupported (with the
        reason: too old, stripped, unknown layout) or OSError (the process is gone)."""
        proc = self.proc
        maps = _mappings(pid, proc)
        candidates = list(dict.fromkeys(m.path for m in maps if _PYTHON_FILE.match(os.path.basename(m.path))))
        if not candidates:
            raise NotPython(f"PID {pid} maps no python3 interpreter")
        # the library first: a pyenv executable only refers to libpython's _PyRuntime
        candidates.sort(key=lambda p: not os.path.basename(p).startswith("lib"))
        reasons = []
        for path in candidates:
            major, minor = map(int, _PYTHON_FILE.match(os.path.basename(path)).groups())
            if major != 3:
                continue
            try:
                facts = self._facts_of(pid, path, maps)
            except (ELFError, ValueError) as e:
                reasons.append(f"{path}: not a readable ELF file ({e})")
                continue
            if "_PyRuntime" not in facts.symbols:
                reasons.append(f"{path}: no _PyRuntime symbol (stripped?)")
                continue
            bias = _bias(facts, maps, path)
            syms = facts.symbols
            runtime = syms["_PyRuntime"] + bias
            version = (3 << 24) | (minor << 16)
            if "Py_Version" in syms:
                version = int.from_bytes(read_memory(pid, syms["Py_Version"] + bias, 4, proc), "little")
                if (version >> 24, (version >> 16) & 0xFF) != (3, minor):
                    raise Unsupported(f"{path}: Py_Version 0x{version:x} does not match its name")
            debug = None
            if (3, minor) in DEBUG_GROUPS:
                debug = read_memory(pid, runtime, debug_offsets_size((3, minor)), proc)
            layout = layout_for((3, minor), debug)
            code_type = syms["PyCode_Type"] + bias if "PyCode_Type" in syms else 0
            return Interpreter(pid, path, version, runtime, code_type, layout)
        raise Unsupported("; ".join(reasons) or f"PID {pid}: no CPython 3 interpreter found")
