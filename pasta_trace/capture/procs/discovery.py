"""Find the CUDA driver, CUDA runtime, HIP, PyTorch (libc10) and NCCL libraries that processes have mapped.

/proc/PID/maps shows each mapping's path as seen inside the process's mount
namespace; /proc/PID/map_files/<start>-<end> gives the file actually mapped
(its real dev and inode, even across namespaces or after the file was
replaced), and /proc/PID/root/<path> reaches that file from the host, which is
what the uprobe attach needs.  Libraries are de-duplicated on (dev, inode):
one attach covers every process that maps the same file.

The CUDA runtime may also be linked into the executable itself or into a
shared library (nvcc links libcudart_static by default, `nvcc -shared` too): any
mapped file whose .symtab defines the runtime's functions is traced as a
`cudart` library too, probed at those local symbols.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

#: Libraries we attach to, by file name (maps shows the resolved name,
#: e.g. libcuda.so.535.261.03, not the libcuda.so.1 symlink).
TRACED = {
    "cuda": re.compile(r"^libcuda\.so(\.[0-9.]+)?$"),
    "hip": re.compile(r"^libamdhip64\.so(\.[0-9.]+)?$"),
    "cudart": re.compile(r"^libcudart\.so(\.[0-9.]+)?$"),
    # PyTorch's core library, wherever a wheel, conda or a container put it
    "c10": re.compile(r"^libc10\.so(\.[0-9.]+)?$"),
    "nccl": re.compile(r"^libnccl\.so(\.[0-9.]+)?$"),
}

#: Functions whose definition in an executable's .symtab says the CUDA
#: runtime is linked into it.
STATIC_CUDART_MARKERS = frozenset({"cudaLaunchKernel", "cudaMalloc"})

#: Other GPU libraries worth naming when a process has not loaded a traced one yet.
OTHER_GPU = re.compile(
    r"^(libnvrtc|libcupti|libcublas(Lt)?|libcufft|libcurand|libcusparse|libcusolver|libcudnn\w*"
    r"|libnvidia-ml|libnvJitLink|libtorch_cuda|libc10_cuda|libhsa-runtime64|librocblas|libMIOpen|librccl"
    r"|libhiprtc|libamd_comgr|libroctracer64|librocprofiler\w*)\.so(\.[0-9.]+)?$"
)

DELETED = " (deleted)"


def family_of(path: str) -> str | None:
    base = os.path.basename(path.removesuffix(DELETED))
    for fam, rx in TRACED.items():
        if rx.match(base):
            return fam
    return None


@dataclass(frozen=True)
class Library:
    """One traced library file, as found in one process."""

    family: str
    path: str  # inside the process's mount namespace
    attach_path: str  # reachable from here
    dev: int
    inode: int
    pid: int

    @property
    def key(self) -> tuple[int, int]:
        return (self.dev, self.inode)


@dataclass
class ProcessLibraries:
    pid: int
    traced: list[Library] = field(default_factory=list)
    other_gpu: list[str] = field(default_factory=list)


def _maps_lines(pid: int, proc: Path) -> list[str]:
    return (proc / str(pid) / "maps").read_text().splitlines()


def scan_pid(pid: int, proc: Path = Path("/proc")) -> ProcessLibraries:
    """Traced and other GPU libraries mapped by ``pid``.  Raises OSError
    (FileNotFoundError / ProcessLookupError) when the process is gone."""
    out = ProcessLibraries(pid)
    seen: set[tuple[int, int]] = set()
    others: dict[str, None] = {}
    for line in _maps_lines(pid, proc):
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5]
        fam = family_of(path)
        if fam is None:
            base = os.path.basename(path.removesuffix(DELETED))
            if OTHER_GPU.match(base):
                others[path.removesuffix(DELETED)] = None
            if "x" not in parts[1]:
                continue  # the runtime linked into a file is in its code: one look per file
        mapped = proc / str(pid) / "map_files" / parts[0]
        try:
            st = os.stat(mapped)
        except OSError:
            continue  # the mapping went away between the two reads
        if (st.st_dev, st.st_ino) in seen:
            continue
        if fam is None:
            # read through the mapping: the file the process holds, whatever its path leads to now
            if not _holds_cudart(str(mapped), st):
                continue
            fam = "cudart"
        seen.add((st.st_dev, st.st_ino))
        # a replaced file has no path any more: attach through the mapping itself
        attach = str(mapped) if path.endswith(DELETED) else f"{proc}/{pid}/root{path}"
        out.traced.append(Library(fam, path.removesuffix(DELETED), attach, st.st_dev, st.st_ino, pid))
    exe = static_cudart(pid, proc)
    if exe is not None and exe.key not in seen:
        out.traced.append(exe)
    out.other_gpu = list(others)
    return out


#: files (dev, inode, size, mtime) known to hold the runtime or not: -a asks for
#: every file of every process, and most processes map the same few files
_CUDART_FILES: dict[tuple[int, int, int, int], bool] = {}
_CUDART_FILES_MAX = 16384


def _holds_cudart(path: str, st: os.stat_result) -> bool:
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    found = _CUDART_FILES.get(key)
    if found is None:
        found = _links_cudart(path, key)
        if len(_CUDART_FILES) >= _CUDART_FILES_MAX:
            _CUDART_FILES.clear()
        _CUDART_FILES[key] = found
    return found


@lru_cache(maxsize=256)
def _links_cudart(path: str, key: tuple[int, int, int, int]) -> bool:
    """``path`` (identified by ``key``: dev, inode, size, mtime) defines the
    CUDA runtime's functions in its .symtab (an executable, or a shared
    library built with the runtime linked in).  Cached: -a asks for every
    process, and most processes run one of a few executables."""
    from elftools.common.exceptions import ELFError

    from ...elf_tables import NotElf
    from ...probes import elf
    from ..output.manifest import FILE_PROBLEMS

    try:
        return bool(elf.local_functions(path, set(STATIC_CUDART_MARKERS)))
    except NotElf:
        return False  # a script, say: nothing to say
    except ELFError as e:  # an ELF executable with a damaged or oversized table: named in the manifest
        FILE_PROBLEMS.add(os.path.realpath(path), str(e).removeprefix(f"{path}: "))
        return False
    except (OSError, ValueError):
        return False


def links_cudart(path: str) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _links_cudart(path, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


def holds_cudart(path: str) -> bool:
    """Whether the file at ``path`` (a stopped process's /proc/PID/fd/N, say)
    has the runtime linked in; remembered by the file's identity, not its path."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return _holds_cudart(path, st)


def static_cudart(pid: int, proc: Path = Path("/proc")) -> Library | None:
    """``pid``'s executable, as a `cudart` library, if the runtime is linked into it.
    Attached through /proc/PID/exe, which reaches the file from any mount namespace."""
    exe = proc / str(pid) / "exe"
    try:
        st = os.stat(exe)
        ns_path = os.readlink(exe).removesuffix(DELETED)
    except OSError:
        return None  # a kernel thread, or gone
    if not links_cudart(str(exe)):
        return None
    return Library("cudart", ns_path, str(exe), st.st_dev, st.st_ino, pid)


def executable_library(path: str) -> Library | None:
    """An executable or a shared library given by path on this host (launch
    mode), as a `cudart` library if the runtime is linked into it."""
    real = os.path.realpath(path)
    if not links_cudart(real):
        return None
    st = os.stat(real)
    return Library("cudart", real, real, st.st_dev, st.st_ino, 0)


def cudart_places(libs: list[Library]) -> str:
    """Where a process's CUDA runtime lives, in words: the shared
    libcudart.so.N it maps, or the files it is linked into."""
    shared = [lib.path for lib in libs if lib.family == "cudart" and family_of(lib.path)]
    linked = [lib.path for lib in libs if lib.family == "cudart" and not family_of(lib.path)]
    parts = [f"shared {', '.join(shared)}"] if shared else []
    parts += [f"static, linked into {', '.join(linked)}"] if linked else []
    return "; ".join(parts) or "none mapped"


def process_cudart(p: ProcessLibraries, proc: Path = Path("/proc")) -> str:
    """One line: a process and where its CUDA runtime lives."""
    try:
        comm = (proc / str(p.pid) / "comm").read_text().strip()
    except OSError:
        comm = "?"
    return f"PID {p.pid} ({comm}): CUDA runtime {cudart_places(p.traced)}"


def all_pids(proc: Path = Path("/proc")) -> list[int]:
    return sorted(int(p.name) for p in proc.iterdir() if p.name.isdigit())


def scan_all(proc: Path = Path("/proc"), skip: set[int] | None = None,
             uid: int | None = None) -> list[ProcessLibraries]:
    """Every process that maps a traced library (processes that vanish mid-scan
    are skipped); with ``uid``, only that user's (capture.procs.reach: nothing of
    another user's process is read)."""
    from .reach import may_trace

    out = []
    for pid in all_pids(proc):
        if skip and pid in skip:
            continue
        if not may_trace(pid, uid, proc):
            continue
        try:
            found = scan_pid(pid, proc)
        except OSError:
            continue
        if found.traced:
            out.append(found)
    return out


def unique_libraries(found: list[ProcessLibraries]) -> list[Library]:
    """One Library per (dev, inode), first process wins."""
    by_key: dict[tuple[int, int], Library] = {}
    for p in found:
        for lib in p.traced:
            by_key.setdefault(lib.key, lib)
    return list(by_key.values())


def resolve_library_file(path: str) -> Library | None:
    """A library file given by path on this host (launch mode: before the
    command maps anything)."""
    fam = family_of(path)
    if fam is None:
        return None
    real = os.path.realpath(path)
    st = os.stat(real)
    return Library(fam, real, real, st.st_dev, st.st_ino, 0)
