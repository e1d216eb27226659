"""Kernel names from the CUDA fatbins embedded in a binary (no GPU, no CUDA).

Layout (as nvcc 13.0 writes it): the `.nv_fatbin` section
(`__nv_relfatbin` in relocatable objects) holds one or more containers
(magic 0xBA55ED50, u16 version, u16 header size, u64 payload size); each
payload is a run of entries (u16 kind: 1 PTX, 2 cubin ELF; u32 header size;
u32 padded payload size; ...; u64 flags; ...; u64 uncompressed size).
Compressed payloads are zstd (nvcc 13) or LZ4 block (older toolkits), told
apart by magic.  In a cubin, kernels are STT_FUNC symbols whose section is
`.text.<name>`.

Any process can map a file with a `.nv_fatbin` section, and the tracer reads
it: a 128 KB zstd payload once decompressed to 4.4 GiB.  So each section is
read bounded (elf_tables: no more than the file holds), each cubin is
decompressed streamed up to MAX_CUBIN, and all of one file's cubins up to a
budget that grows with its sections' size (a real fatbin compresses a few
times, a bomb thousands of times); past either, FatbinError names the entry.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterator
from pathlib import Path

import lz4.block
import zstandard

from ..elf_tables import ElfImage, NotElf
from ..regular_file import open_library

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTIONS = (".nv_fatbin", "__nv_relfatbin")
KIND_CUBIN = 2
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
ELF_MAGIC = b"\x7fELF"

_CONTAINER = struct.Struct("<IHHQ")
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr: [6] e_shoff, [11] e_shentsize, [12] e_shnum, [13] e_shstrndx
_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, ...
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size
SHT_SYMTAB, STT_FUNC = 2, 2
_ENTRY = struct.Struct("<HHIIIIIIIIIQQQ")  # the fields up to uncompressed_size (64 B)

#: the largest cubin decompressed (NCCL 2.32's largest is a few MB)
MAX_CUBIN = 256 << 20
#: all of one file's cubins decompress to at most this many times its fatbin
#: sections' bytes (NCCL 2.32: 1.7 GiB from a few hundred MB), and at least MIN_BUDGET
RATIO = 64
MIN_BUDGET = 256 << 20
#: the largest fatbin section read (cuBLASLt's is about 500 MB)
MAX_SECTION = 1 << 30
_CHUNK = 1 << 20


class FatbinError(ValueError):
    """A damaged fatbin (the message says where)."""


class Budget:
    """Bytes the cubins of one file may still decompress to."""

    def __init__(self, left: int):
        self.total = self.left = left

    def cap(self) -> tuple[int, str]:
        """The most the next cubin may decompress to, and how to say it was passed."""
        if self.left < MAX_CUBIN:
            return self.left, f"past the {self.total >> 20} MiB all of this file's cubins may take"
        return MAX_CUBIN, f"to more than {MAX_CUBIN >> 20} MiB"

    def take(self, n: int) -> None:
        self.left -= n


def _zstd(body: bytes, cap: int, where: str, past: str) -> bytes:
    """``body`` decompressed, streamed: never more than ``cap`` bytes held."""
    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(body, read_across_frames=True) as r:
            while chunk := r.read(_CHUNK):
                out += chunk
                if len(out) > cap:
                    raise FatbinError(f"{where} decompresses {past}")
    except zstandard.ZstdError as e:
        raise FatbinError(f"{where}: {e}") from None
    return bytes(out)


def _payload(raw: bytes, compressed_size: int, uncompressed_size: int, budget: Budget | None = None,
             where: str = "an entry") -> bytes:
    """The entry's bytes, decompressed when they are not a plain ELF."""
    if raw.startswith(ELF_MAGIC):
        return raw
    body = raw[:compressed_size] if compressed_size else raw
    budget = budget if budget is not None else Budget(MAX_CUBIN)
    cap, past = budget.cap()
    if body.startswith(ZSTD_MAGIC):
        data = _zstd(body, cap, where, past)
    elif uncompressed_size:
        if uncompressed_size > cap:
            raise FatbinError(f"{where} claims {uncompressed_size} bytes decompressed, {past}")
        try:
            data = lz4.block.decompress(body, uncompressed_size=uncompressed_size)
        except lz4.block.LZ4BlockError as e:
            raise FatbinError(f"{where}: {e}") from None
    else:
        return raw
    budget.take(len(data))
    return data


def cubins(blob: bytes) -> list[bytes]:
    """Every cubin ELF image in a fatbin section's bytes (several containers may follow each other)."""
    return list(iter_cubins(blob))


def iter_cubins(blob: bytes, budget: Budget | None = None) -> Iterator[bytes]:
    """cubins(), one decompressed image at a time: a large library's fatbins
    decompress to gigabytes (NCCL 2.32's: 1,315 cubins, 1.7 GiB).
    ``budget``: what all of them may decompress to (None: RATIO x the blob)."""
    if budget is None:
        budget = Budget(max(MIN_BUDGET, RATIO * len(blob)))
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
                yield _payload(raw, compressed_size, uncompressed_size, budget, f"the cubin at {entry:#x}")
            entry += ehdr_size + padded_size
        pos = blob.find(struct.pack("<I", FATBIN_MAGIC), end)


def _cstr(table: bytes, off: int) -> bytes:
    return table[off: table.find(b"\0", off)]


def cubin_kernels(cubin: bytes) -> set[str]:
    """STT_FUNC symbols defined in a `.text.<name>` section of one cubin.

    Read with struct, not pyelftools: a cubin is a little-endian ELF64
    image, and a large library holds thousands of them."""
    if len(cubin) < _EHDR.size or cubin[:4] != ELF_MAGIC or cubin[4:6] != b"\x02\x01":
        raise FatbinError("a cubin that is not a little-endian ELF64 image")
    shoff, shentsize, shnum, shstrndx = (_EHDR.unpack_from(cubin)[i] for i in (6, 11, 12, 13))
    try:
        shdrs = [_SHDR.unpack_from(cubin, shoff + i * shentsize) for i in range(shnum)]
        shstr = shdrs[shstrndx]
        names = cubin[shstr[4]: shstr[4] + shstr[5]]
        section_names = [_cstr(names, h[0]) for h in shdrs]
        symtab = next((h for h in shdrs if h[1] == SHT_SYMTAB), None)
        if symtab is None:
            return set()
        strtab = shdrs[symtab[6]]
        strings = cubin[strtab[4]: strtab[4] + strtab[5]]
        syms = cubin[symtab[4]: symtab[4] + symtab[5] // _SYM.size * _SYM.size]
    except (struct.error, IndexError) as e:
        raise FatbinError(f"a damaged cubin ({e})") from None
    out = set()
    for name_off, info, _other, shndx, _value, _size in _SYM.iter_unpack(syms):
        if info & 0xF == STT_FUNC and 0 < shndx < len(section_names):
            name = _cstr(strings, name_off)
            if section_names[shndx] == b".text." + name:
                out.add(name.decode(errors="replace"))
    return out


def fatbin_sections(path: str | Path) -> list[bytes]:
    """The raw fatbin sections of an ELF file ([] for files without one)."""
    return list(_iter_fatbin_sections(path))


def _iter_fatbin_sections(path: str | Path, sizes: list[int] | None = None) -> Iterator[bytes]:
    """fatbin_sections(), one in memory at a time, each bounded (elf_tables);
    ``sizes`` gets every one's size before the first is read."""
    with open_library(path) as f:
        try:
            img = ElfImage(f, path)
        except NotElf:
            return  # no fatbin; a damaged ELF file is the caller's to note
        found = [i for i, name in enumerate(img.section_names) if name in FATBIN_SECTIONS]
        if sizes is not None:
            sizes += [int(img.sections[i]["size"]) for i in found]
        for i in found:
            yield img.section_data(i, MAX_SECTION)


def kernel_names(path: str | Path) -> set[str]:
    """Every kernel (mangled name) in the fatbins of the ELF file at `path`;
    FatbinError (naming the file) past the bounds of the module text."""
    sizes: list[int] = []
    sections = _iter_fatbin_sections(path, sizes)
    first = next(sections, None)
    if first is None:
        return set()
    budget = Budget(max(MIN_BUDGET, RATIO * sum(sizes)))
    try:
        return {k for blob in itertools.chain((first,), sections) for c in iter_cubins(blob, budget) for k in cubin_kernels(c)}
    except FatbinError as e:
        raise FatbinError(f"{path}: {e}") from None
