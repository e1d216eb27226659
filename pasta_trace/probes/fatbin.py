"""Kernel names from the CUDA fatbins embedded in a binary (no GPU, no CUDA).

Layout (as nvcc 13.0 writes it): the `.nv_fatbin` section
(`__nv_relfatbin` in relocatable objects) holds one or more containers
(magic 0xBA55ED50, u16 version, u16 header size, u64 payload size); each
payload is a run of entries (u16 kind: 1 PTX, 2 cubin ELF; u32 header size;
u32 padded payload size; ...; u64 flags; ...; u64 uncompressed size).
Compressed payloads are zstd (nvcc 13) or LZ4 block (older toolkits), told
apart by magic.  In a cubin, kernels are STT_FUNC symbols whose section is
`.text.<name>`.
"""

from __future__ import annotations

import io
import struct
from pathlib import Path

import lz4.block
import zstandard
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_CUBIN = 2
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ELF_MAGIC = b"\x7fELF"

_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIIIIIIIIIQQQ")  # the fields up to uncompressed_size (64 B)


class FatbinError(ValueError):
    """A damaged fatbin (the message says where)."""


def _payload(raw: bytes, compressed_size: int, uncompressed_size: int) -> bytes:
    """The entry's bytes, decompressed when they are not a plain ELF."""
    if raw.startswith(ELF_MAGIC):
        return raw
    body = raw[:compressed_size] if compressed_size else raw
    if body.startswith(ZSTD_MAGIC):
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=uncompressed_size or 1 << 30)
    if uncompressed_size:
        return lz4.block.decompress(body, uncompressed_size=uncompressed_size)
    return raw


def cubins(blob: bytes) -> list[bytes]:
    """Every cubin ELF image in a fatbin section's bytes (several containers may follow each other)."""
    out: list[bytes] = []
    pos = blob.find(struct.pack("<I", FATBIN_MAGIC))
    while pos != -1 and pos + _CONTAINER.size <= len(blob):
        magic, _version, header_size, payload_size = _CONTAINER.unpack_from(blob, pos)
        if magic != FATBIN_MAGIC:
            break
        entry, end = pos + header_size, pos + header_size + payload_size
        if end > len(blob):
            raise FatbinError(f"container at {pos:#x} runs past the section ({end:#x} > {len(blob):#x})")
        while entry + _ENTRY.size <= end:
            f = _ENTRY.unpack_from(blob, entry)
            kind, ehdr_size, padded_size, compressed_size, uncompressed_size = f[0], f[2], f[3], f[5], f[13]
            if ehdr_size < _ENTRY.size or entry + ehdr_size + padded_size > end:
                raise FatbinError(f"entry at {entry:#x} has a bad size")
            if kind == KIND_CUBIN:
                raw = blob[entry + ehdr_size: entry + ehdr_size + padded_size]
                out.append(_payload(raw, compressed_size, uncompressed_size))
            entry += ehdr_size + padded_size
        pos = blob.find(struct.pack("<I", FATBIN_MAGIC), end)
    return out


def cubin_kernels(cubin: bytes) -> set[str]:
    """STT_FUNC symbols defined in a `.text.<name>` section of one cubin."""
    elf = ELFFile(io.BytesIO(cubin))
    symtab = elf.get_section_by_name(".symtab")
    if symtab is None:
        return set()
    names = set()
    for sym in symtab.iter_symbols():
        if sym["st_info"]["type"] != "STT_FUNC" or not isinstance(sym["st_shndx"], int):
            continue
        if elf.get_section(sym["st_shndx"]).name == f".text.{sym.name}":
            names.add(sym.name)
    return names


def fatbin_sections(path: str | Path) -> list[bytes]:
    """The raw fatbin sections of an ELF file ([] for files without one)."""
    try:
        with open(path, "rb") as f:
            elf = ELFFile(f)
            return [s.data() for s in elf.iter_sections()
                    if s.name in FATBIN_SECTIONS and s["sh_type"] != "SHT_NOBITS"]
    except ELFError:
        return []


def kernel_names(path: str | Path) -> set[str]:
    """Every kernel (mangled name) in the fatbins of the ELF file at `path`."""
    return {k for blob in fatbin_sections(path) for c in cubins(blob) for k in cubin_kernels(c)}
