"""Unwinding a copied user stack into native frames, naming them, and
interleaving them with the Python frames of the same moment.

The BPF side (bpf/nativestack.h) copies ip, sp, bp and up to
schema.NATIVE_STACK_BYTES of the stack.  Here each return address is placed
in the process's mappings (/proc/PID/maps, read while it runs), turned into
the file's virtual address, and the file's ``.eh_frame`` row for it gives the
caller's CFA, return address and rbp (unwind_table).  Where no row covers an
address, the frame pointer is followed (rbp -> saved rbp, return address
above it): code built with frame pointers unwinds without CFI.  The walk ends
at a frame whose return address is undefined (``_start``, ``clone``: the
stack is complete), or where the copy ends or nothing more can be followed
(the stack is marked truncated).

Interleaving (see :func:`interleave`): CPython runs many Python frames in
one C activation of its eval loop.  Each activation of
``_PyEval_EvalFrameDefault`` (innermost first) is replaced by the Python
frames it was running (innermost first), taken in order from the Python
stack, whose entry frames (3.12+: the C-stack shim; 3.11: ``is_entry``) mark
where one activation's frames end.
"""

from __future__ import annotations

import bisect
import concurrent.futures as cf
import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from elftools.common.exceptions import ELFError

from .. import schema
from ..regular_file import open_library
from . import unwind_table as ut
from .interpreter import Mapping, parse_maps
from .lines import LineTable

#: native frames followed per stack at most
MAX_FRAMES = schema.MAX_STACK_DEPTH

#: functions whose activation runs Python frames (".cold": the part gcc moves away)
EVAL_FRAME = "_PyEval_EvalFrameDefault"

_U64 = struct.Struct("<Q")


@dataclass(frozen=True)
class NativeFrame:
    addr: int  # the return address into this frame (what backtrace() reports)
    module: str | None  # the file as the process maps it
    function: str | None
    file: str | None = None  # from DWARF line tables, where the library or its debug file has them
    line: int | None = None


@dataclass(frozen=True)
class Frame:
    """One row of a stack in stacks.parquet."""

    kind: str  # python | native
    function: str | None
    file: str | None
    line: int | None
    module: str | None
    addr: int


#: AddressSpace.locate: the file's tables are being built (Unwinder raises Pending)
PENDING = object()

#: what a damaged or unexpected file makes the parsers raise: pyelftools also asserts, indexes
#: past its lists, and finds attributes missing (a section of another type than its name says)
_ELF_ERRORS = (ELFError, ValueError, OSError, AssertionError, KeyError, IndexError, AttributeError, TypeError,
               struct.error, EOFError, RecursionError, MemoryError)


class Pending(Exception):
    """A file on the stack has its tables built in the background: unwind again later."""


class ModuleCache:
    """Tables of each file by identity (device, inode, size, mtime), shared by all processes.

    With ``background``, a file whose tables are not in the disk cache is
    parsed in a worker thread (seconds for a large library): the drain goes
    on meanwhile, and ``tables`` answers PENDING until it is done."""

    def __init__(self, cache: Path | None = None, *, background: bool = False):
        self.cache = cache
        self._tables: dict[tuple, ut.Tables | None] = {}
        self._lines: dict[tuple, LineTable | None] = {}
        self._building: dict[tuple, tuple[str, cf.Future]] = {}
        self._pool = cf.ThreadPoolExecutor(1, thread_name_prefix="pasta-unwind") if background else None
        #: files that could not be read or parsed: path -> why (for -v and the manifest)
        self.problems: dict[str, str] = {}

    def tables(self, opener: Callable[[], object], path: str, debug_roots: tuple[str, ...]):
        """The tables of the file ``opener`` opens: Tables, None (unreadable) or PENDING."""
        try:
            f = opener()
        except OSError as e:
            self.problems.setdefault(path, f"cannot open: {e.strerror or e}")
            return None
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._tables or key in self._building:
            f.close()
            return self._settled(key)
        if self._pool is None:
            return self._store(key, path, lambda: self._build(f, debug_roots))
        # the cache's key hashes the whole file (about a second a GiB): on the worker too
        self._building[key] = (path, self._pool.submit(self._build, f, debug_roots))
        return PENDING

    def lines(self, opener: Callable[[], object], tables: ut.Tables) -> LineTable | None:
        """The line tables of the debug file the symbols came from, else of the file itself (-g)."""
        try:
            f = open_library(tables.debug_file) if tables.debug_file else opener()
        except OSError:
            return None
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in self._lines:
            try:
                self._lines[key] = LineTable(f)
            except _ELF_ERRORS:
                self._lines[key] = None
            if self._lines[key] is None or self._lines[key].empty:
                f.close()
                return None
        else:
            f.close()
        return self._lines[key]

    def _build(self, f, debug_roots: tuple[str, ...]) -> ut.Tables:
        """The tables of ``f`` from the disk cache, else parsed (and kept there); closes ``f``."""
        with f:
            hit = ut.cached(f, self.cache)
            return hit if hit is not None else ut.build_and_save(f, debug_roots=debug_roots, cache=self.cache)

    def _settled(self, key: tuple):
        if key in self._building:
            path, fut = self._building[key]
            if not fut.done():
                return PENDING
            del self._building[key]
            return self._store(key, path, fut.result)
        return self._tables[key]

    def _store(self, key: tuple, path: str, get: Callable[[], ut.Tables]) -> ut.Tables | None:
        try:
            self._tables[key] = get()
        except _ELF_ERRORS as e:
            return self._failed(key, path, e)
        return self._tables[key]

    def _failed(self, key: tuple, path: str, e: Exception) -> None:
        self._tables[key] = None
        self.problems.setdefault(path, f"not readable as ELF: {e}")
        return None

    @property
    def building(self) -> bool:
        """Some file's tables are still being built."""
        return any(not fut.done() for _, fut in self._building.values())

    def wait(self, timeout: float | None) -> None:
        """Until every table being built is done, or ``timeout`` seconds."""
        cf.wait([fut for _, fut in self._building.values()], timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        for t in self._lines.values():
            if t is not None and not t.empty:
                t.close()


def _beside(first: list[Mapping], older: list[Mapping]) -> list[Mapping]:
    """``first`` with the mappings of ``older`` that overlap none of it, by start address."""
    first = sorted(first, key=lambda m: m.start)
    starts = [m.start for m in first]
    out = list(first)
    for m in older:
        i = bisect.bisect_left(starts, m.end)  # the mappings of `first` starting before m ends
        if i == 0 or first[i - 1].end <= m.start:
            # the last of them ends before m starts; `first` does not overlap itself, so none
            # of the earlier ones reaches m either
            out.append(m)
    return sorted(out, key=lambda m: m.start)


class AddressSpace:
    """The executable file mappings of one process and the tables of their files."""

    def __init__(self, pid: int, modules: ModuleCache, *, proc: Path = Path("/proc"),
                 saved_maps: Callable[[int], str | None] = lambda pid: None):
        self.pid = pid
        self._modules = modules
        self._proc = proc
        self._saved = saved_maps
        self._maps: list[Mapping] = []
        self._starts: list[int] = []
        self._tables: dict[tuple[int, int], ut.Tables | None] = {}
        self._lines: dict[tuple[int, int], LineTable | None] = {}
        self._refreshed = False
        self.refresh()

    def refresh(self) -> None:
        """Read the maps again (a library loaded since).  What they no longer
        show (an exited process's maps are empty even before it is reaped)
        is taken from what this space read before, then from the copy the
        tracker saved: a mapping read earlier is dropped only when a mapping
        read now overlaps it (the address range reused)."""
        try:
            live = parse_maps((self._proc / str(self.pid) / "maps").read_text(), executable=True)
        except OSError:
            live = []
        known = _beside(live, self._maps)
        saved = parse_maps(self._saved(self.pid) or "", executable=True)
        self._maps = _beside(known, saved)
        self._starts = [m.start for m in self._maps]

    def _mapping(self, addr: int) -> Mapping | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self._maps[i].end:
            return self._maps[i]
        return None

    def locate(self, addr: int) -> tuple[Mapping, ut.Tables | None] | None:
        """The mapping holding ``addr`` and its file's tables; None outside every file mapping."""
        m = self._mapping(addr)
        if m is None and not self._refreshed:
            self._refreshed = True  # once per sample at most (reset by the unwinder)
            self.refresh()
            m = self._mapping(addr)
        if m is None:
            return None
        key = (m.start, m.end)
        if key not in self._tables:
            tables = self._modules.tables(lambda: self._open(m), m.path, self._debug_roots())
            if tables is PENDING:
                return m, PENDING
            self._tables[key] = tables
        return m, self._tables[key]

    def _debug_roots(self) -> tuple[str, ...]:
        return (str(self._proc / str(self.pid) / "root"), "/")

    def _open(self, m: Mapping):
        """The file the process really mapped (also in a container, or deleted), else its path
        while the file there is the one mapped (the device and inode of its maps line): an
        exited process's path may hold another file by now, even a link to one it could not read."""
        base = self._proc / str(self.pid)
        for p in (base / "map_files" / f"{m.start:x}-{m.end:x}", base / "root" / m.path.lstrip("/"), Path(m.path)):
            try:
                f = open_library(p)  # a regular file only: a FIFO named like a library would block
            except OSError as e:
                err = e
                continue
            st = os.fstat(f.fileno())
            if f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}" == m.dev and st.st_ino == m.inode:
                return f
            f.close()
            err = OSError(errno.ESTALE, f"not the file the process mapped (device {m.dev} inode {m.inode})", str(p))
        raise err

    def new_sample(self) -> None:
        self._refreshed = False

    def with_source(self, f: NativeFrame) -> NativeFrame:
        """``f`` with its source file and line, where DWARF line tables give them."""
        loc = self.locate(f.addr - 1)
        if loc is None or not isinstance(loc[1], ut.Tables):
            return f
        m, tables = loc
        key = (m.start, m.end)
        if key not in self._lines:
            self._lines[key] = self._modules.lines(lambda: self._open(m), tables)
        vaddr = tables.vaddr(f.addr - 1 - m.start + m.offset)
        if self._lines[key] is None or vaddr is None:
            return f
        file, line = self._lines[key].at(vaddr)
        return NativeFrame(f.addr, f.module, f.function, file, line)


class Unwinder:
    """Unwinds the samples of one process."""

    def __init__(self, space: AddressSpace):
        self.space = space

    def unwind(self, *, ip: int, sp: int, bp: int, stack: bytes, at_entry: bool) -> tuple[list[NativeFrame], bool]:
        """(frames innermost first, truncated).  Frame 0 is the caller of the
        probed function: at its entry [sp] is the return address into it.
        Raises Pending while a file on the stack has its tables built."""
        self.space.new_sample()
        top = sp + len(stack)

        def read(addr: int) -> int | None:
            if sp <= addr and addr + 8 <= top:
                return _U64.unpack_from(stack, addr - sp)[0]
            return None

        cur_sp, cur_bp = sp, bp
        if at_entry:
            pc = read(sp)
            cur_sp = sp + 8
        else:
            pc = ip
        frames: list[NativeFrame] = []
        while pc and len(frames) < MAX_FRAMES:
            loc = self.space.locate(pc - 1)  # a return address: the call is the byte before it
            m, tables = loc if loc is not None else (None, None)
            if tables is PENDING:
                raise Pending(m.path)
            vaddr = tables.vaddr(pc - 1 - m.start + m.offset) if tables is not None else None
            frames.append(NativeFrame(pc, m.path if m else None,
                                      tables.symbol(vaddr) if vaddr is not None else None))
            row = tables.row(vaddr) if vaddr is not None else -1
            if row >= 0 and tables.cfa_reg[row] != ut.CFA_NONE:
                reg = int(tables.cfa_reg[row])
                if reg == ut.CFA_OTHER:
                    return frames, True
                ra_off = int(tables.ra_off[row])
                if ra_off == ut.RA_UNDEFINED:
                    return frames, False  # the outermost frame
                base = cur_sp if reg == ut.RSP else cur_bp
                if base is None:
                    return frames, True
                cfa = base + int(tables.cfa_off[row])
                rbp_off = int(tables.rbp_off[row])
                ret = read(cfa + ra_off)
                if rbp_off != ut.RBP_SAME:
                    cur_bp = read(cfa + rbp_off)
            else:  # no CFI here: the frame pointer, if this code keeps one
                if cur_bp is None or not cur_sp <= cur_bp < top:
                    return frames, True
                cfa, ret, cur_bp = cur_bp + 16, read(cur_bp + 8), read(cur_bp)
            if ret is None or cfa <= cur_sp:
                return frames, True  # past the copy, or no progress
            pc, cur_sp = ret, cfa
        return frames, bool(pc)


def is_eval_frame(function: str | None) -> bool:
    return function is not None and (function == EVAL_FRAME or function.startswith(EVAL_FRAME + "."))


def activations(owners: Sequence[int], shim: int | None, entry_marks: bool) -> list[int | None]:
    """For each Python frame (innermost first, by its owner byte): the
    eval-loop activation running it, 0 for the innermost, None for a C-stack
    shim.  3.12+ (``shim``: the owner value of shims) push a shim frame where
    each activation begins; 3.11 (``entry_marks``: the owner byte holds
    is_entry) mark the first frame it ran instead."""
    out: list[int | None] = []
    g = 0
    for i, owner in enumerate(owners):
        if shim is not None and owner >= shim:
            out.append(None)
            if i + 1 < len(owners):  # the outermost shim starts nothing
                g += 1
            continue
        out.append(g)
        if entry_marks and owner:
            g += 1
    return out


def interleave(native: Sequence[NativeFrame], groups: Sequence[Sequence[Frame]] | None) -> list[Frame]:
    """The stack innermost first: each eval-loop activation among ``native``
    replaced by the next group of Python frames (``groups``: the Python
    stack cut at its entry frames, innermost group first).  Groups left over
    when the native frames end (a copy cut short) follow them; eval-loop
    frames left over when the groups end (a Python stack cut at
    --stack-depth) stay native frames."""
    out: list[Frame] = []
    pending = list(groups or [])
    for f in native:
        if pending and is_eval_frame(f.function):
            out.extend(pending.pop(0))
            continue
        out.append(Frame("native", f.function, f.file, f.line, f.module, f.addr))
    for g in pending:
        out.extend(g)
    return out
