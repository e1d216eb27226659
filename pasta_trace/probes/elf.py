"""Functions and build-id of a library or executable.

Read with pasta_trace.elf_tables (numpy, bounded), not pyelftools: any
process can open a file under a traced library's name, and these tables are
read while it waits for its probes; the file is opened only when it is a
regular file (regular_file.open_library).  A file that is not one, or holds
a damaged or oversized table, raises OSError or ELFError naming it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..elf_tables import ElfImage
from ..regular_file import open_library


@dataclass(frozen=True)
class Sym:
    vaddr: int
    file_offset: int
    size: int


def _functions(path: str, section: str, names: set[str] | None, *, exported: bool) -> dict[str, Sym]:
    """Defined FUNC symbols of ``section`` (among ``names``, None: all; global
    or weak ones with ``exported``), by name (the first of a name wins)."""
    out: dict[str, Sym] = {}
    with open_library(path) as f:
        img = ElfImage(f, path)
        table = img.symbols(section)
        if table is None:
            return out
        t = table.table
        # an IFUNC's address is its resolver, not the function: not probed
        if names is None:
            found = [(i, table.name(i)) for i in table.functions(exported=exported).tolist()]
        else:  # vectorized: a table may name one function millions of times
            idx, which, order = table.named(names)
            keep = table.function_mask(exported=exported, at=idx) & (img.file_offsets(t["value"][idx]) >= 0)
            idx, which = idx[keep], which[keep]
            _, first = np.unique(which, return_index=True)  # idx is in table order: the first of each name
            found = sorted(zip(idx[first].tolist(), (order[w] for w in which[first].tolist())))
        for i, name in found:
            value = int(t["value"][i])
            off = img.file_offset(value)
            if name and off is not None:
                out.setdefault(name, Sym(value, off, int(t["size"][i])))
    return out


def exported_symbols(path: str) -> dict[str, Sym]:
    """Defined FUNC symbols of .dynsym by name (version suffixes dropped, the
    default version wins over hidden ones)."""
    return _functions(path, ".dynsym", None, exported=True)


def local_functions(path: str, names: set[str]) -> dict[str, Sym]:
    """Defined FUNC symbols of .symtab among ``names``, of any binding: a
    library linked statically into an executable (libcudart_static) keeps its
    functions there, as local symbols, where the executable keeps .symtab."""
    return _functions(path, ".symtab", names, exported=False)


def probe_symbols(path: str, names: set[str]) -> dict[str, Sym]:
    """Where each of ``names`` is defined in ``path``: its export, else its
    .symtab entry (an executable with the library linked in)."""
    found = _functions(path, ".dynsym", names, exported=True)
    if len(found) < len(names):
        found |= local_functions(path, names - found.keys())
    return found


def build_id(path: str) -> str | None:
    """GNU build-id as lowercase hex, or None if the file has none."""
    with open_library(path) as f:
        return ElfImage(f, path).build_id()
