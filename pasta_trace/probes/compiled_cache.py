"""The compiled BPF handlers of a program text, kept between captures.

Compiling the probes program (clang and LLVM, in the tracer) takes 14-20 s
of CPU, nearly all of it in the ~620 handlers (docs/performance.md); the
maps, helpers, discover and stack programs (the text without the handler
instantiations) take about 2 s.  So on a miss the whole text is compiled as
always and each handler's bytecode is saved; on a hit only the text without
the handlers is compiled, and the saved handlers are loaded into that module
(``CachedBPF.load_func``), each when the attach asks for it, as BCC loads
the ones it compiled.

What a handler's bytecode holds that belongs to one module: the fd of each
map it uses, an ``ld_imm64`` with ``src_reg == BPF_PSEUDO_MAP_FD``.  The
entry names the map instead (with its type and sizes, which must match) and
the fd is the new module's map of that name.  Any other relocation (map
values, BTF ids, BPF-to-BPF or kfunc calls) makes the program uncacheable:
it is compiled every time, never loaded half-right.  The handlers are
loaded without the module's BTF func/line info (libbcc finds none for
them), which uprobe programs do not need.

The key is the sha256 of the whole text, BCC's version, libbcc's file, the
kernel (release, build, machine) and its headers: what the bytecode depends
on.  The directory is root's (``DEFAULT_DIR``, or ``$PASTA_TRACE_BPF_CACHE``),
used only when no one else can write it; an entry that does not read back
whole is a miss, and is replaced."""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
import secrets
import stat
import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

ENV = "PASTA_TRACE_BPF_CACHE"
DEFAULT_DIR = "/var/cache/pasta-trace/bpf"
KEEP = 32  # entries kept, most recently used first: one per configuration a machine runs
SUFFIX = ".bpfc"
MAGIC = b"PTBPFC\x00\x01"  # the last byte is the entry format's version
_TMP_PREFIX = ".tmp-"

# eBPF instructions (linux/bpf.h): 8 bytes, code, dst:4|src:4, off, imm
INSN = np.dtype([("code", "u1"), ("regs", "u1"), ("off", "<i2"), ("imm", "<i4")])
LD_IMM64 = 0x18  # BPF_LD | BPF_DW | BPF_IMM: two slots, the second with code 0
CALL = 0x85  # BPF_JMP | BPF_CALL: src_reg 0 is a helper
PSEUDO_MAP_FD = 1


class Uncacheable(ValueError):
    """A handler holds something no other module's maps can stand for."""


@dataclass(frozen=True)
class MapSpec:
    """A map as a handler needs it to be (BCC's table description)."""

    name: str
    type: int
    key_size: int
    leaf_size: int
    max_entries: int
    flags: int


@dataclass
class Handler:
    """A handler's bytecode with its map fds zeroed, and which map each was."""

    code: bytes
    relocs: list[tuple[int, int]]  # (instruction index, index into Entry.maps)


@dataclass
class Entry:
    maps: list[MapSpec]
    handlers: dict[str, Handler]


def _insns(code: bytes) -> np.ndarray:
    if len(code) % INSN.itemsize:
        raise Uncacheable(f"{len(code)} bytes is not a whole number of instructions")
    return np.frombuffer(code, dtype=INSN)


def normalise(code: bytes, map_of_fd: dict[int, int]) -> Handler:
    """``code`` with each map fd zeroed and recorded as its map's index
    (``map_of_fd``: this module's fds); Uncacheable if it refers to anything
    else of its module."""
    ins = _insns(code).copy()
    src = ins["regs"] >> 4
    ld = np.flatnonzero(ins["code"] == LD_IMM64)
    odd = ld[(src[ld] != 0) & (src[ld] != PSEUDO_MAP_FD)]
    if odd.size:
        raise Uncacheable(f"ld_imm64 with src_reg {int(src[odd[0]])} at instruction {int(odd[0])}")
    calls = np.flatnonzero((ins["code"] == CALL) & (src != 0))
    if calls.size:
        raise Uncacheable(f"a call with src_reg {int(src[calls[0]])} at instruction {int(calls[0])}")
    relocs = []
    for i in ld[src[ld] == PSEUDO_MAP_FD].tolist():
        fd = int(ins["imm"][i])
        if fd not in map_of_fd:
            raise Uncacheable(f"fd {fd} at instruction {i} is none of the module's maps")
        relocs.append((i, map_of_fd[fd]))
        ins["imm"][i] = 0
    return Handler(ins.tobytes(), relocs)


def patch(handler: Handler, fds: list[int]) -> bytes:
    """The handler's bytecode with the fd of each of its maps (``fds``, in Entry.maps order)."""
    ins = _insns(handler.code).copy()
    for i, m in handler.relocs:
        ins["imm"][i] = fds[m]
    return ins.tobytes()


def _check(handler: Handler, n_maps: int) -> None:
    """Raises unless every map reference of the bytecode is relocated, and only those."""
    ins = _insns(handler.code)
    ld = np.flatnonzero(ins["code"] == LD_IMM64)
    refs = ld[(ins["regs"][ld] >> 4) == PSEUDO_MAP_FD].tolist()
    if sorted(i for i, _ in handler.relocs) != refs or any(not 0 <= m < n_maps for _, m in handler.relocs):
        raise ValueError("relocations do not match the bytecode")
    normalise(handler.code, {0: 0})  # no other relocation kind, zeroed fds


# ----------------------------------------------------------------- entries


def encode(entry: Entry) -> bytes:
    blob = bytearray()
    handlers = []
    for name, h in entry.handlers.items():
        handlers.append([name, len(blob), len(h.code), h.relocs])
        blob += h.code
    meta = json.dumps({"maps": [list(vars(m).values()) for m in entry.maps], "handlers": handlers}).encode()
    body = zlib.compress(struct.pack("<I", len(meta)) + meta + blob, 1)
    return MAGIC + hashlib.sha256(body).digest() + body


def decode(data: bytes) -> Entry:
    """The entry ``data`` holds; ValueError (or another) if it is not one, whole."""
    if data[: len(MAGIC)] != MAGIC:
        raise ValueError("not a cache entry of this version")
    digest, body = data[len(MAGIC): len(MAGIC) + 32], data[len(MAGIC) + 32:]
    if hashlib.sha256(body).digest() != digest:
        raise ValueError("checksum mismatch")
    raw = zlib.decompress(body)
    (n,) = struct.unpack_from("<I", raw)
    meta = json.loads(raw[4: 4 + n])
    blob = raw[4 + n:]
    maps = [MapSpec(str(a), *(int(v) for v in rest)) for a, *rest in meta["maps"]]
    handlers = {}
    for name, off, size, relocs in meta["handlers"]:
        if not 0 <= off <= off + size <= len(blob):
            raise ValueError("handler out of the entry")
        h = Handler(bytes(blob[off: off + size]), [(int(i), int(m)) for i, m in relocs])
        _check(h, len(maps))
        handlers[str(name)] = h
    return Entry(maps, handlers)


def key(text: str) -> str:
    """What the compiled bytecode of ``text`` depends on, hashed."""
    from bcc import __version__ as bcc_version

    u = os.uname()
    parts = [MAGIC.hex(), bcc_version, _file_id(_libbcc_path()), u.release, u.version, platform.machine(),
             _file_id(os.path.realpath(f"/lib/modules/{u.release}/build")), _file_id("/sys/kernel/kheaders.tar.xz")]
    h = hashlib.sha256("\0".join(parts).encode())
    h.update(b"\0" + text.encode())
    return h.hexdigest()


def _file_id(path: str | None) -> str:
    if not path:
        return "-"
    try:
        st = os.stat(path)
    except OSError:
        return "-"
    return f"{path}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"


@lru_cache(maxsize=1)
def _libbcc_path() -> str | None:
    """The libbcc file this process loaded (its clang and rewriter made the bytecode)."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and "/libbcc.so" in fields[5]:
                    return fields[5].strip()
    except OSError:
        pass
    return None


# --------------------------------------------------------------- directory


class Refused(Exception):
    """The cache directory cannot be trusted or used; says why."""


def cache_dir() -> Path:
    return Path(os.environ.get(ENV) or DEFAULT_DIR)


class Cache:
    """The entries of one directory, read and written through its descriptor:
    checked once, it cannot be swapped for another under us."""

    def __init__(self, path: Path, keep: int = KEEP):
        self.path = path
        self.keep = keep
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            self.fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as e:
            raise Refused(f"cannot use {path}: {e.strerror}") from None
        st = os.fstat(self.fd)
        why = ("not owned by root" if st.st_uid != 0
               else "writable by others than root" if st.st_mode & 0o022 else None)
        if why:
            os.close(self.fd)
            raise Refused(f"not using {path}: {why}")

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "Cache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def get(self, k: str) -> Entry | None:
        """The entry of key ``k``, None when there is none that reads back whole."""
        name = k + SUFFIX
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                return None
            with os.fdopen(os.dup(fd), "rb") as f:
                entry = decode(f.read())
            try:
                os.utime(fd)  # used: the last to be pruned (a read-only cache still serves)
            except OSError:
                pass
            return entry
        except Exception:  # noqa: BLE001 - whatever is wrong with the file, it is a miss and is replaced
            return None
        finally:
            os.close(fd)

    def put(self, k: str, entry: Entry) -> None:
        """Writes the entry (a temporary file renamed over the name), then
        keeps the ``keep`` most recently used."""
        data = encode(entry)
        tmp = f"{_TMP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.rename(tmp, k + SUFFIX, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=self.fd)
            except OSError:
                pass
            raise
        self.prune()

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """(name, stat) of each entry, most recently used first."""
        out = []
        for name in os.listdir(self.fd):
            if name.endswith(SUFFIX):
                try:
                    out.append((name, os.stat(name, dir_fd=self.fd, follow_symlinks=False)))
                except OSError:
                    pass
        return sorted(out, key=lambda e: e[1].st_mtime_ns, reverse=True)

    def prune(self) -> None:
        for name, _ in self.entries()[self.keep:]:
            try:
                os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass


def state(path: Path | None = None) -> tuple[bool, str]:
    """(usable, what it holds) of the cache directory, without making it (for doctor)."""
    path = path or cache_dir()
    if not path.exists():
        return True, f"{path}: not made yet (the first capture makes it)"
    try:
        with Cache(path) as cache:
            entries = cache.entries()
    except Refused as e:
        return False, f"{e}: every capture compiles all its handlers"
    return True, f"{path}: {len(entries)} programs, {sum(st.st_size for _, st in entries) // 1024} KiB"


# ------------------------------------------------------------ BCC modules


@lru_cache(maxsize=1)
def _libbcc():
    """libbcc with the prototypes of the table functions bcc's Python does not declare
    (a handle of our own: BCC's ``lib`` stays as BCC set it)."""
    from bcc import lib

    own = ctypes.CDLL(lib._name, use_errno=True)
    own.bpf_num_tables.restype = ctypes.c_size_t
    own.bpf_num_tables.argtypes = [ctypes.c_void_p]
    own.bpf_table_name.restype = ctypes.c_char_p
    for fn in ("bpf_table_name", "bpf_table_fd_id", "bpf_table_type_id", "bpf_table_key_size_id",
               "bpf_table_leaf_size_id", "bpf_table_max_entries_id", "bpf_table_flags_id"):
        getattr(own, fn).argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    for fn in ("bpf_table_fd_id", "bpf_table_type_id", "bpf_table_flags_id"):
        getattr(own, fn).restype = ctypes.c_int
    for fn in ("bpf_table_key_size_id", "bpf_table_leaf_size_id", "bpf_table_max_entries_id"):
        getattr(own, fn).restype = ctypes.c_size_t
    return own


def module_maps(bpf) -> dict[str, tuple[int, MapSpec]]:
    """{name: (fd, spec)} of every map of ``bpf``'s module."""
    lib = _libbcc()
    m = bpf.module
    out = {}
    for i in range(lib.bpf_num_tables(m)):
        name = lib.bpf_table_name(m, i).decode()
        spec = MapSpec(name, lib.bpf_table_type_id(m, i), lib.bpf_table_key_size_id(m, i),
                       lib.bpf_table_leaf_size_id(m, i), lib.bpf_table_max_entries_id(m, i),
                       lib.bpf_table_flags_id(m, i))
        out[name] = (lib.bpf_table_fd_id(m, i), spec)
    return out


def extract(bpf, names: list[str]) -> Entry:
    """The entry of the handlers ``names`` of compiled ``bpf`` (those it has);
    Uncacheable if one of them cannot be moved to another module."""
    maps = module_maps(bpf)
    specs = [spec for _, spec in maps.values()]
    index = {fd: i for i, (fd, _) in enumerate(maps.values())}
    handlers = {}
    for name in names:
        try:
            code = bpf.dump_func(name.encode())
        except Exception:  # noqa: BLE001 - BCC's "Unknown program": not in this text
            continue
        handlers[name] = normalise(code, index)
    return Entry(specs, handlers)


def compile_program(bcc, text: str, short_text, handlers: list[str], note):
    """``bcc.BPF(text=text)``, its handlers from the cache when they are
    there.  ``short_text()``: the text without the handlers; ``handlers``:
    their names; ``note``: told, in one line, what the cache did."""
    try:
        cache = Cache(cache_dir())
    except Refused as e:
        note(f"BPF cache: {e}; compiling")
        return bcc.BPF(text=text.encode())
    with cache:
        k = key(text)
        entry = cache.get(k)
        if entry is not None:
            bpf = load(bcc, short_text(), entry)
            if bpf is not None:
                note(f"BPF cache: {len(entry.handlers)} handlers from {cache.path / (k + SUFFIX)}")
                return bpf
            note(f"BPF cache: {cache.path / (k + SUFFIX)} does not fit this program's maps; compiling")
        bpf = bcc.BPF(text=text.encode())
        try:
            entry = extract(bpf, handlers)
            verify(bcc, bpf, entry)
            cache.put(k, entry)
            note(f"BPF cache: compiled, saved as {cache.path / (k + SUFFIX)}")
        except (Uncacheable, OSError) as e:
            note(f"BPF cache: compiled, not saved: {e}")
        return bpf


def verify(bcc, bpf, entry: Entry) -> None:
    """Loads each handler of ``entry`` into the kernel as a hit will (without
    the module's BTF info, with the uprobe handlers' attach type), and closes
    it: Uncacheable if the kernel refuses one (0.2-0.5 s for ~620 handlers,
    on a miss only)."""
    from . import uprobe_link

    attach_type = uprobe_link.BPF_TRACE_UPROBE_MULTI if uprobe_link.available() else -1
    fds = [module_maps(bpf)[m.name][0] for m in entry.maps]
    for name, handler in entry.handlers.items():
        fd = _load(bcc, bpf, b"pt_cache_check", patch(handler, fds), bcc.BPF.KPROBE, None, attach_type)
        if fd < 0:
            raise Uncacheable(f"the kernel refuses {name} loaded alone: {os.strerror(ctypes.get_errno())}")
        os.close(fd)


def _load(bcc, bpf, name: bytes, code: bytes, prog_type: int, device, attach_type: int, log_level: int = 0) -> int:
    """libbcc's load of ``code`` as program ``name`` of ``bpf``'s module: its
    BTF info is that of the function of that name (none for a cached handler)."""
    lib = bcc.lib
    return lib.bcc_func_load(bpf.module, prog_type, name, ctypes.create_string_buffer(code, len(code)), len(code),
                             lib.bpf_module_license(bpf.module), lib.bpf_module_kern_version(bpf.module),
                             log_level, None, 0, device, attach_type)


def load(bcc, short_text: str, entry: Entry):
    """A bcc.BPF of ``short_text`` (the program without the handlers) that
    loads the handlers of ``entry`` as its own, or None (after freeing it)
    when its maps are not those the handlers were compiled against."""
    bpf = _cached_class(bcc)(text=short_text.encode())
    maps = module_maps(bpf)
    if any(m.name not in maps or maps[m.name][1] != m for m in entry.maps):
        bpf.cleanup()
        return None
    bpf.cached_handlers = entry.handlers
    bpf.cached_fds = [maps[m.name][0] for m in entry.maps]
    return bpf


@lru_cache(maxsize=1)
def _cached_class(bcc):
    class CachedBPF(bcc.BPF):
        """A bcc.BPF whose handlers come from the cache: loaded on demand with
        BCC's own loader (the same program type and attach type as the
        caller asks), so the attach code is the same as for a compiled one."""

        cached_handlers: dict[str, Handler] = {}
        cached_fds: list[int] = []

        def _cached(self, func_name) -> Handler | None:
            name = func_name.decode() if isinstance(func_name, bytes) else func_name
            return self.cached_handlers.get(name)

        def load_func(self, func_name, prog_type, device=None, attach_type=-1):
            handler = self._cached(func_name)
            name = func_name if isinstance(func_name, bytes) else func_name.encode()
            if handler is None or name in self.funcs:
                return super().load_func(func_name, prog_type, device, attach_type)
            log_level = 2 if self.debug & bcc.DEBUG_BPF_REGISTER_STATE else 1 if self.debug & bcc.DEBUG_BPF else 0
            fd = _load(bcc, self, name, patch(handler, self.cached_fds), prog_type, device, attach_type, log_level)
            if fd < 0:
                err = ctypes.get_errno()
                raise Exception(f"Failed to load BPF program {name.decode()}: {os.strerror(err)}")
            fn = bcc.BPF.Function(self, name, fd)
            self.funcs[name] = fn
            return fn

        def dump_func(self, func_name):
            handler = self._cached(func_name)
            return super().dump_func(func_name) if handler is None else patch(handler, self.cached_fds)

    return CachedBPF
