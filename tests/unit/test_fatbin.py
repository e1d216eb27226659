"""Kernel names from REAL nvcc fatbins: plain, zstd-compressed, and an LZ4 entry."""

from __future__ import annotations

import struct

import lz4.block
import pytest

from pasta_trace.probes import fatbin

from nvcc_build import KERNELS, compile_cu


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    d = tmp_path_factory.mktemp("fatbin")
    return {
        "plain": compile_cu(d / "k_plain"),
        "compressed": compile_cu(d / "k_compressed", "-Xfatbin", "-compress-all"),
    }


def _entries(blob: bytes) -> list[tuple[int, int, int, bytes]]:
    """(kind, sm_arch, flags, first payload bytes) of each entry of the first container."""
    pos = blob.find(struct.pack("<I", fatbin.FATBIN_MAGIC))
    _, _, hsize, psize = fatbin._CONTAINER.unpack_from(blob, pos)
    out, e = [], pos + hsize
    while e < pos + hsize + psize:
        f = fatbin._ENTRY.unpack_from(blob, e)
        out.append((f[0], f[8], f[11], blob[e + f[2]: e + f[2] + 4]))
        e += f[2] + f[3]
    return out


@pytest.mark.parametrize("variant", ["plain", "compressed"])
def test_kernel_names_of_real_fatbin(binaries, variant):
    assert fatbin.kernel_names(binaries[variant]) == KERNELS


def test_compressed_entries_are_zstd(binaries):
    plain = _entries(fatbin.fatbin_sections(binaries["plain"])[0])
    comp = _entries(fatbin.fatbin_sections(binaries["compressed"])[0])
    assert [(k, sm, head) for k, sm, _, head in plain] == [(2, 80, b"\x7fELF"), (2, 90, b"\x7fELF")]
    assert [(k, sm, fl & 0x8000, head) for k, sm, fl, head in comp] == [
        (2, 80, 0x8000, fatbin.ZSTD_MAGIC), (2, 90, 0x8000, fatbin.ZSTD_MAGIC)]


def test_each_cubin_lists_the_kernels(binaries):
    blob = fatbin.fatbin_sections(binaries["plain"])[0]
    # nvcc 13 emits one kernel-less cubin per arch next to the real ones
    assert sorted(len(fatbin.cubin_kernels(c)) for c in fatbin.cubins(blob)) == [0, 0, 5, 5]


def test_lz4_entry(binaries):
    """Older toolkits compress with LZ4 blocks: repack a real cubin that way."""
    cubin = next(c for c in fatbin.cubins(fatbin.fatbin_sections(binaries["plain"])[0]) if fatbin.cubin_kernels(c))
    packed = lz4.block.compress(cubin, store_size=False)
    padded = packed + b"\0" * (-len(packed) % 8)
    entry = fatbin._ENTRY.pack(2, 0x0101, 64, len(padded), 0, len(packed), 0, 0, 80, 0, 0, 0x8011, 0, len(cubin))
    container = struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, len(entry) + len(padded))
    blob = b"\0" * 24 + container + entry + padded  # sections may hold leading padding
    assert [fatbin.cubin_kernels(c) for c in fatbin.cubins(blob)] == [KERNELS]


def test_damaged_container_is_reported(binaries):
    blob = fatbin.fatbin_sections(binaries["plain"])[0]
    with pytest.raises(fatbin.FatbinError, match="runs past the section"):
        fatbin.cubins(blob[: len(blob) // 2])


def test_file_without_fatbin(tmp_path):
    p = tmp_path / "not_elf"
    p.write_bytes(b"hello")
    assert fatbin.kernel_names(p) == set()
    assert fatbin.kernel_names("/bin/true") == set()


def test_cubin_symbols_read_without_pyelftools_agree_with_it(binaries):
    """cubin_kernels reads the ELF with struct (a large library holds
    thousands of cubins): the same names as pyelftools' reading of each
    cubin; an image that is no ELF64, or whose headers lie past its end, is
    a FatbinError."""
    import io

    from elftools.elf.elffile import ELFFile

    def by_pyelftools(cubin: bytes) -> set[str]:
        elf = ELFFile(io.BytesIO(cubin))
        return {s.name for s in elf.get_section_by_name(".symtab").iter_symbols()
                if s["st_info"]["type"] == "STT_FUNC" and isinstance(s["st_shndx"], int)
                and elf.get_section(s["st_shndx"]).name == f".text.{s.name}"}

    for variant in ("plain", "compressed"):
        for c in fatbin.cubins(fatbin.fatbin_sections(binaries[variant])[0]):
            assert fatbin.cubin_kernels(c) == by_pyelftools(c)
    cubin = next(c for c in fatbin.cubins(fatbin.fatbin_sections(binaries["plain"])[0]) if fatbin.cubin_kernels(c))
    with pytest.raises(fatbin.FatbinError, match="not a little-endian ELF64"):
        fatbin.cubin_kernels(b"\x7fELF\x01\x01" + cubin[6:])
    with pytest.raises(fatbin.FatbinError, match="damaged cubin"):
        fatbin.cubin_kernels(cubin[:200])
