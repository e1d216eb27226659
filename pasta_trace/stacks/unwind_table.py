"""What unwinding and naming a native frame needs from one ELF file, as
arrays: its unwind rows (from ``.eh_frame``, read with pyelftools), its
function symbols (``.symtab`` and ``.dynsym``, and those of its debug file
under ``/usr/lib/debug/.build-id/``) and its PT_LOAD segments.

Parsing a large library's ``.eh_frame`` takes seconds, so the arrays are kept
on disk, per user and by content: ``~/.cache/pasta-trace/unwind/uid-<uid>/
<sha256 of the file>.npz`` (``$PASTA_TRACE_CACHE`` replaces
``~/.cache/pasta-trace``).  Under sudo the directory is root's own (root's
home, whatever the environment says) and one per invoking user, never
writable by that user; the key is the hash of the very bytes read through the
descriptor the tables are parsed from.  A build-id is no key: anyone can copy
one into a binary of theirs, and tables kept under it would give every later
capture of the real file that binary's frames.

Unwind rows keep only what an x86-64 unwinder of return addresses needs: the
CFA (a register, rsp or rbp, plus an offset), where the return address and
the caller's rbp are saved relative to the CFA.  Other rules (CFA
expressions, CFA in another register) mark the row unusable: the unwinder
then tries the frame pointer.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import stat
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from elftools.common.exceptions import ELFError
from elftools.dwarf.callframe import FDE
from elftools.elf.elffile import ELFFile

from ..elf_tables import ElfImage
from ..privilege import invoking_user
from ..regular_file import open_library

#: DWARF register numbers on x86-64
RBP, RSP, RA = 6, 7, 16

#: cfa_reg values that are not a register
CFA_NONE = -1  # no FDE covers the address
CFA_OTHER = -2  # an expression or another register: not followed

#: ra_off meaning "the return address is undefined": the outermost frame (_start, clone)
RA_UNDEFINED = 1
#: rbp_off meaning "rbp keeps its value in the caller"
RBP_SAME = 0

CACHE_VERSION = 1

#: the largest .eh_frame parsed (libtorch_cuda's is tens of MB; pyelftools holds it whole)
MAX_EH_FRAME = 256 << 20

# DW_CFA opcodes (DWARF 5, 6.4.2; the GNU extension 0x2e)
_ADVANCE, _OFFSET, _RESTORE = 0x40, 0x80, 0xC0
_SET_LOC, _ADVANCE1, _ADVANCE2, _ADVANCE4 = 0x01, 0x02, 0x03, 0x04
_OFFSET_EXT, _RESTORE_EXT, _UNDEFINED, _SAME_VALUE, _REGISTER = 0x05, 0x06, 0x07, 0x08, 0x09
_REMEMBER, _RESTORE_STATE = 0x0A, 0x0B
_DEF_CFA, _DEF_CFA_REG, _DEF_CFA_OFF, _DEF_CFA_EXPR = 0x0C, 0x0D, 0x0E, 0x0F
_EXPRESSION, _OFFSET_EXT_SF, _DEF_CFA_SF, _DEF_CFA_OFF_SF = 0x10, 0x11, 0x12, 0x13
_VAL_OFFSET, _VAL_OFFSET_SF, _VAL_EXPRESSION = 0x14, 0x15, 0x16


def cache_dir() -> Path:
    """This user's directory of tables.  Under sudo: in root's home, one per
    invoking user; the environment (HOME, XDG_CACHE_HOME, PASTA_TRACE_CACHE,
    which sudo may pass on) is the user's and is not followed."""
    user = invoking_user()
    if user is not None:
        return Path(pwd.getpwuid(os.geteuid()).pw_dir) / ".cache/pasta-trace/unwind" / f"uid-{user[0]}"
    env = os.environ.get("PASTA_TRACE_CACHE")
    base = Path(env) if env else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pasta-trace"
    return base / "unwind" / f"uid-{os.geteuid()}"


def trusted_dir(d: Path) -> bool:
    """Whether ``d`` (made here if missing, mode 0700) and every directory
    above it can be changed by no one but us and root: a directory someone
    else may write (a sticky one excepted, like /tmp) lets them swap in an
    entry of theirs, a link anywhere could lead the tables elsewhere."""
    try:
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for part in (d, *d.parents):
            st = os.lstat(part)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid not in (0, os.geteuid()):
                return False
            if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and part != d):
                return False
        return True
    except OSError:
        return False


def content_key(f) -> str:
    """sha256 of the whole file ``f`` is open on, read through that descriptor."""
    f.seek(0)
    key = hashlib.file_digest(f, "sha256").hexdigest()
    f.seek(0)
    return key


@dataclass
class Tables:
    """The arrays of one ELF file; addresses are the file's virtual addresses."""

    # unwind rows, sorted by pc: each holds from its pc to the next row's
    pc: np.ndarray  # u64
    cfa_reg: np.ndarray  # i8: RSP, RBP, CFA_NONE or CFA_OTHER
    cfa_off: np.ndarray  # i32
    ra_off: np.ndarray  # i32: offset from the CFA, or RA_UNDEFINED
    rbp_off: np.ndarray  # i32: offset from the CFA, or RBP_SAME
    # function symbols, sorted by address
    sym_addr: np.ndarray  # u64
    sym_end: np.ndarray  # u64 (== sym_addr for a symbol of unknown size)
    sym_name: np.ndarray  # str
    # PT_LOAD segments, sorted by file offset
    seg_offset: np.ndarray  # u64
    seg_vaddr: np.ndarray  # u64
    seg_filesz: np.ndarray  # u64
    debug_file: str  # the separate debug file the symbols came from, "" if none

    def row(self, vaddr: int) -> int:
        """Index of the unwind row covering ``vaddr``, -1 when none."""
        return int(np.searchsorted(self.pc, vaddr, side="right")) - 1

    def symbol(self, vaddr: int) -> str | None:
        i = int(np.searchsorted(self.sym_addr, vaddr, side="right")) - 1
        if i < 0:
            return None
        if vaddr < self.sym_end[i] or self.sym_end[i] == self.sym_addr[i]:
            return str(self.sym_name[i])
        return None

    def vaddr(self, file_offset: int) -> int | None:
        """The virtual address of a byte of the file, None outside every PT_LOAD."""
        for off, vaddr, size in zip(self.seg_offset.tolist(), self.seg_vaddr.tolist(), self.seg_filesz.tolist()):
            # a mapping starts at the page holding the segment's first byte
            if off & ~0xFFF <= file_offset < off + size:
                return file_offset - off + vaddr
        return None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, version=np.array([CACHE_VERSION]), debug_file=np.array([self.debug_file]),
                     **{k: getattr(self, k) for k in _ARRAYS})
        tmp.replace(path)  # atomic: a concurrent tracer never reads half a file

    @classmethod
    def load(cls, path: Path) -> "Tables | None":
        try:
            with np.load(path, allow_pickle=False) as z:
                if int(z["version"][0]) != CACHE_VERSION:
                    return None
                return cls(**{k: z[k] for k in _ARRAYS}, debug_file=str(z["debug_file"][0]))
        except (OSError, KeyError, ValueError, zipfile.BadZipFile):
            return None


_ARRAYS = ("pc", "cfa_reg", "cfa_off", "ra_off", "rbp_off", "sym_addr", "sym_end", "sym_name", "seg_offset",
           "seg_vaddr", "seg_filesz")


# ----------------------------------------------------------------------------- .eh_frame


class _Rules:
    """The rules of one row while a CIE's and an FDE's instructions run."""

    __slots__ = ("cfa_reg", "cfa_off", "ra", "rbp")

    def __init__(self) -> None:
        self.cfa_reg, self.cfa_off, self.ra, self.rbp = CFA_OTHER, 0, RA_UNDEFINED, RBP_SAME

    def copy(self) -> "_Rules":
        r = _Rules()
        r.cfa_reg, r.cfa_off, r.ra, r.rbp = self.cfa_reg, self.cfa_off, self.ra, self.rbp
        return r

    def set_reg(self, reg: int, off: int | None) -> None:
        """Register ``reg`` saved at CFA + off; None: its value is not recoverable here."""
        if reg == RA:
            self.ra = off if off is not None else RA_UNDEFINED
        elif reg == RBP:
            self.rbp = off if off is not None else RBP_SAME


def _run(instructions, rules: _Rules, initial: _Rules | None, caf: int, daf: int, pc: int,
         out: list[tuple]) -> int:
    """Apply CFI ``instructions`` from ``pc``, appending a row at each advance."""
    stack: list[_Rules] = []
    for ins in instructions:
        op, args = int(ins.opcode), ins.args
        if op in (_ADVANCE, _ADVANCE1, _ADVANCE2, _ADVANCE4, _SET_LOC):
            out.append((pc, rules.cfa_reg, rules.cfa_off, rules.ra, rules.rbp))
            pc = args[0] if op == _SET_LOC else pc + args[0] * caf
        elif op == _DEF_CFA:
            rules.cfa_reg, rules.cfa_off = _cfa_reg(args[0]), args[1]
        elif op == _DEF_CFA_SF:
            rules.cfa_reg, rules.cfa_off = _cfa_reg(args[0]), args[1] * daf
        elif op == _DEF_CFA_REG:
            rules.cfa_reg = _cfa_reg(args[0])
        elif op == _DEF_CFA_OFF:
            rules.cfa_off = args[0]
        elif op == _DEF_CFA_OFF_SF:
            rules.cfa_off = args[0] * daf
        elif op == _DEF_CFA_EXPR:
            rules.cfa_reg = CFA_OTHER
        elif op in (_OFFSET, _OFFSET_EXT, _OFFSET_EXT_SF):
            rules.set_reg(args[0], args[1] * daf)
        elif op in (_UNDEFINED, _SAME_VALUE):
            rules.set_reg(args[0], None)
        elif op in (_REGISTER, _EXPRESSION, _VAL_OFFSET, _VAL_OFFSET_SF, _VAL_EXPRESSION):
            if args[0] == RA:
                rules.cfa_reg = CFA_OTHER  # a return address we cannot follow: stop here
            elif args[0] == RBP:
                rules.rbp = RBP_SAME
        elif op in (_RESTORE, _RESTORE_EXT):
            if initial is not None:
                if args[0] == RA:
                    rules.ra = initial.ra
                elif args[0] == RBP:
                    rules.rbp = initial.rbp
        elif op == _REMEMBER:
            stack.append(rules.copy())
        elif op == _RESTORE_STATE and stack:
            saved = stack.pop()
            rules.cfa_reg, rules.cfa_off, rules.ra, rules.rbp = saved.cfa_reg, saved.cfa_off, saved.ra, saved.rbp
        # nop, GNU_args_size, AArch64 ops: nothing an x86-64 unwinder of return addresses needs
    return pc


def _cfa_reg(reg: int) -> int:
    return reg if reg in (RSP, RBP) else CFA_OTHER


def unwind_rows(elf: ELFFile) -> tuple[np.ndarray, ...]:
    """(pc, cfa_reg, cfa_off, ra_off, rbp_off) of every .eh_frame row, sorted,
    with a CFA_NONE row where an FDE's range ends and no other begins."""
    rows: list[tuple] = []
    gaps: list[int] = []
    dwarf = elf.get_dwarf_info(relocate_dwarf_sections=False, follow_links=False) if elf.has_dwarf_info() else None
    entries = dwarf.EH_CFI_entries() if dwarf is not None and dwarf.has_EH_CFI() else []
    cie_rules: dict[int, _Rules] = {}
    for e in entries:
        if not isinstance(e, FDE):
            continue
        cie = e.cie
        caf, daf = cie["code_alignment_factor"], cie["data_alignment_factor"]
        start, size = e["initial_location"], e["address_range"]
        key = id(cie)
        if key not in cie_rules:
            r = _Rules()
            _run(cie.instructions, r, None, caf, daf, 0, [])
            cie_rules[key] = r
        initial = cie_rules[key]
        r = initial.copy()
        end = _run(e.instructions, r, initial, caf, daf, start, rows)
        if end < start + size:  # the rules after the last advance hold to the end of the range
            rows.append((end, r.cfa_reg, r.cfa_off, r.ra, r.rbp))
        gaps.append(start + size)
    return _sorted_rows(rows, gaps)


def _sorted_rows(rows: list[tuple], gaps: list[int]) -> tuple[np.ndarray, ...]:
    gap_rows = [(g, CFA_NONE, 0, RA_UNDEFINED, RBP_SAME) for g in gaps]
    allr = gap_rows + rows  # gaps first: at an equal pc the later (real) row wins
    if not allr:
        return (np.zeros(0, np.uint64), np.zeros(0, np.int8), *(np.zeros(0, np.int32) for _ in range(3)))
    a = np.array(allr, dtype=np.int64)
    order = np.argsort(a[:, 0], kind="stable")
    a = a[order]
    keep = np.ones(len(a), bool)
    keep[:-1] = a[1:, 0] != a[:-1, 0]  # the last of each pc
    a = a[keep]
    return (a[:, 0].astype(np.uint64), a[:, 1].astype(np.int8), a[:, 2].astype(np.int32),
            a[:, 3].astype(np.int32), a[:, 4].astype(np.int32))


# ----------------------------------------------------------------------------- symbols


def _symbols(images: list[ElfImage]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Function symbols of ``images`` (.dynsym, then .symtab); at one address a
    global name wins over a weak one, a weak one over a local one, then the
    larger size, then the first seen.  Read bounded (elf_tables): any process
    can map a file whose tables claim millions of entries."""
    addrs, sizes, ranks, names = [], [], [], []
    for img in images:
        for sec_name in (".dynsym", ".symtab"):
            table = img.symbols(sec_name)
            if table is None:
                continue
            t = table.table
            idx = table.functions()  # an IFUNC's value is its resolver's address, named by the resolver's symbol
            idx = idx[t["value"][idx] != 0]
            bind = t["info"][idx] >> 4
            addrs.append(t["value"][idx])
            sizes.append(t["size"][idx])
            ranks.append(np.where(bind == 1, 0, np.where(bind == 2, 1, 2)))
            names.append((table, idx))
    if not addrs:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64), np.zeros(0, dtype=str)
    addr, size, rank = np.concatenate(addrs), np.concatenate(sizes), np.concatenate(ranks)
    order = np.lexsort((-size.astype(np.int64), rank, addr))  # stable: the first seen wins a tie
    first = np.ones(len(order), bool)
    first[1:] = addr[order][1:] != addr[order][:-1]
    pick = order[first]
    where = np.concatenate([np.full(len(idx), k) for k, (_, idx) in enumerate(names)])
    row = np.concatenate([idx for _, idx in names])
    out_names = np.array([names[w][0].name(int(r)) for w, r in zip(where[pick].tolist(), row[pick].tolist())],
                         dtype=str)
    return addr[pick].astype(np.uint64), (addr[pick] + size[pick]).astype(np.uint64), out_names


def _segments(img: ElfImage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    loads = np.sort(img.loads, order="offset")
    return (loads["offset"].astype(np.uint64), loads["vaddr"].astype(np.uint64),
            loads["filesz"].astype(np.uint64))


def build_id_of(f) -> str | None:
    """The build-id of the open ELF file ``f`` (or of an ELFFile's), read bounded (elf_tables)."""
    return ElfImage(f.stream if isinstance(f, ELFFile) else f).build_id()


def debug_file_for(build_id: str | None, roots: tuple[str, ...] = ("/",)) -> Path | None:
    """The separate debug file of a build-id (Debian's *-dbg / *-dbgsym packages), under each root."""
    if not build_id or len(build_id) < 3:
        return None
    for root in roots:
        p = Path(root) / "usr/lib/debug/.build-id" / build_id[:2] / f"{build_id[2:]}.debug"
        if p.is_file():
            return p
    return None


def build(f, debug_roots: tuple[str, ...] = ("/",)) -> tuple[str | None, Tables]:
    """(build-id, tables) of the open ELF file ``f``.  Every table is read
    bounded (.eh_frame: MAX_EH_FRAME, and no more than the file holds); a
    file past a bound raises ELFError naming it."""
    img = ElfImage(f)
    bid = img.build_id()
    debug = debug_file_for(bid, debug_roots)
    eh = img.section(".eh_frame")
    if eh is not None:
        img.check_section(eh, MAX_EH_FRAME)
    f.seek(0)
    pcs = unwind_rows(ELFFile(f))
    images = [img]
    dbg_handle = None
    if debug is not None:
        try:
            dbg_handle = open_library(debug)
            images.append(ElfImage(dbg_handle, debug))
        except (OSError, ELFError):
            debug = None
    try:
        syms = _symbols(images)
    finally:
        if dbg_handle is not None:
            dbg_handle.close()
    return bid, Tables(*pcs, *syms, *_segments(img), debug_file=str(debug) if debug else "")


def _entry(f, cache: Path | None) -> Path | None:
    """Where the tables of the file ``f`` are kept, None where no directory is safe to keep them in."""
    d = cache_dir() if cache is None else cache
    return d / f"{content_key(f)}.npz" if trusted_dir(d) else None


def cached(f, cache: Path | None = None) -> Tables | None:
    """The tables of the open ELF file ``f`` from the cache (hashing the file:
    about 1 s a GiB), None when not there."""
    entry = _entry(f, cache)
    return Tables.load(entry) if entry is not None else None


def build_and_save(f, *, debug_roots: tuple[str, ...] = ("/",), cache: Path | None = None) -> Tables:
    """Parse the open ELF file ``f`` (seconds for a large library) and keep the
    tables in the cache, when the file held the same bytes before and after
    the parse (a file rewritten meanwhile would keep one content's tables under
    another's key)."""
    entry = _entry(f, cache)
    f.seek(0)
    _, tables = build(f, debug_roots)
    if entry is not None and content_key(f) == entry.stem:
        try:
            tables.save(entry)
        except OSError:
            pass  # a read-only home: parse again next time
    return tables


def tables_for(f, *, debug_roots: tuple[str, ...] = ("/",), cache: Path | None = None) -> Tables:
    """The tables of the open ELF file ``f``, from the cache when its build-id is there."""
    hit = cached(f, cache)
    return hit if hit is not None else build_and_save(f, debug_roots=debug_roots, cache=cache)
