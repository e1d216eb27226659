"""Read a live process's memory and the kernel names of the files it maps,
for the driver-object name scan (capture.naming.name_scan).

Only ordinary readable mappings are read: device mappings (`/dev/...`, a
GPU's registers and memory apertures) and the kernel's special ones are never
touched.  The process may exit at any moment: every read that fails is
"nothing there", never an error."""

from __future__ import annotations

import bisect
import os
import stat
from pathlib import Path

from elftools.common.exceptions import ELFError

from ...probes.fatbin import FatbinError, kernel_names
from ..output.manifest import FILE_PROBLEMS


class ProcessGone(OSError):
    """The process exited (or its memory cannot be opened)."""


def readable_ranges(maps_text: str) -> list[tuple[int, int]]:
    """(start, end) of the readable mappings of a /proc/PID/maps text that
    are safe to read: anonymous memory and files, not devices or [vvar]."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5 or not parts[1].startswith("r"):
            continue
        path = parts[5] if len(parts) == 6 else ""
        if path.startswith("/dev/") or path in ("[vvar]", "[vvar_vclock]", "[vsyscall]"):
            continue
        lo, hi = parts[0].split("-")
        out.append((int(lo, 16), int(hi, 16)))
    return sorted(out)


class ProcessMemory:
    """``read(addr, size)`` over /proc/PID/mem, clipped to one safe mapping."""

    def __init__(self, pid: int, proc: Path = Path("/proc")):
        try:
            self._ranges = readable_ranges((proc / str(pid) / "maps").read_text())
            self._fd = os.open(proc / str(pid) / "mem", os.O_RDONLY)
        except OSError as e:
            raise ProcessGone(e.errno, f"PID {pid}: {e.strerror}") from None
        self._starts = [r[0] for r in self._ranges]

    def read(self, addr: int, size: int) -> bytes | None:
        i = bisect.bisect_right(self._starts, addr) - 1
        if i < 0 or addr >= self._ranges[i][1]:
            return None
        try:
            return os.pread(self._fd, min(size, self._ranges[i][1] - addr), addr) or None
        except OSError:  # EIO: unmapped since; ESRCH: the process exited
            return None

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> "ProcessMemory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class FatbinNames:
    """Kernel names of the fatbins in the files processes map, each file parsed once."""

    def __init__(self) -> None:
        self._by_file: dict[tuple[int, int, int, int], frozenset[str]] = {}

    def of_file(self, path: str) -> frozenset[str]:
        try:
            st = os.stat(path)
        except OSError:
            return frozenset()
        if not stat.S_ISREG(st.st_mode):
            return frozenset()
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in self._by_file:
            try:
                self._by_file[key] = frozenset(kernel_names(path))
            except (OSError, ELFError, FatbinError, ValueError) as e:
                FILE_PROBLEMS.add(path, f"its CUDA fatbin: {str(e).removeprefix(f'{path}: ')}")
                self._by_file[key] = frozenset()
        return self._by_file[key]

    def of_process(self, pid: int, proc: Path = Path("/proc")) -> set[str]:
        """Every fatbin kernel name of the files mapped by ``pid`` (read
        through /proc/PID/root: a container's files).  Raises ProcessGone."""
        try:
            text = (proc / str(pid) / "maps").read_text()
        except OSError as e:
            raise ProcessGone(e.errno, f"PID {pid}: {e.strerror}") from None
        paths = {p.split(maxsplit=5)[5].removesuffix(" (deleted)") for p in text.splitlines()
                 if len(p.split(maxsplit=5)) == 6 and p.split(maxsplit=5)[5].startswith("/")}
        root = proc / str(pid) / "root"
        out: set[str] = set()
        for p in sorted(paths):
            if not p.startswith("/dev/"):
                out |= self.of_file(str(root / p.lstrip("/")))
        return out
