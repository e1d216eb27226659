"""Functions and build-id of a library or executable, read with pyelftools."""

from __future__ import annotations

from dataclasses import dataclass

from elftools.elf.elffile import ELFFile


@dataclass(frozen=True)
class Sym:
    vaddr: int
    file_offset: int
    size: int


def _vaddr_to_offset(elf: ELFFile, vaddr: int) -> int | None:
    for seg in elf.iter_segments():
        if seg["p_type"] == "PT_LOAD" and seg["p_vaddr"] <= vaddr < seg["p_vaddr"] + seg["p_filesz"]:
            return vaddr - seg["p_vaddr"] + seg["p_offset"]
    return None


def _functions(path: str, section: str, keep) -> dict[str, Sym]:
    """Defined FUNC symbols of ``section`` for which ``keep(symbol)`` holds,
    by name (the first of a name wins)."""
    out: dict[str, Sym] = {}
    with open(path, "rb") as f:
        elf = ELFFile(f)
        table = elf.get_section_by_name(section)
        if table is None:
            return out
        for s in table.iter_symbols():
            # an IFUNC's address is its resolver, not the function: not probed
            if s["st_info"]["type"] != "STT_FUNC" or s["st_shndx"] == "SHN_UNDEF" or not s.name or not keep(s):
                continue
            off = _vaddr_to_offset(elf, s["st_value"])
            if off is not None:
                out.setdefault(s.name, Sym(s["st_value"], off, s["st_size"]))
    return out


def exported_symbols(path: str) -> dict[str, Sym]:
    """Defined FUNC symbols of .dynsym by name (version suffixes dropped, the
    default version wins over hidden ones)."""
    return _functions(path, ".dynsym", lambda s: s["st_info"]["bind"] in ("STB_GLOBAL", "STB_WEAK"))


def local_functions(path: str, names: set[str]) -> dict[str, Sym]:
    """Defined FUNC symbols of .symtab among ``names``, of any binding: a
    library linked statically into an executable (libcudart_static) keeps its
    functions there, as local symbols, where the executable keeps .symtab."""
    return _functions(path, ".symtab", lambda s: s.name in names)


def probe_symbols(path: str, names: set[str]) -> dict[str, Sym]:
    """Where each of ``names`` is defined in ``path``: its export, else its
    .symtab entry (an executable with the library linked in)."""
    found = {n: s for n, s in exported_symbols(path).items() if n in names}
    if len(found) < len(names):
        found |= {n: s for n, s in local_functions(path, names - found.keys()).items()}
    return found


def build_id(path: str) -> str | None:
    """GNU build-id as lowercase hex, or None if the file has none."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for sec in elf.iter_sections():
            if sec["sh_type"] != "SHT_NOTE":
                continue
            for note in sec.iter_notes():
                if note["n_type"] == "NT_GNU_BUILD_ID":
                    return note["n_desc"]
    return None
