"""The GNU build-id of each file a traced process maps executable, read
while it runs, so that offline naming (capture.naming.symbolize) can tell the file
it mapped from another one at the same path later: a device and inode can be
those of a new file once the mapped one was deleted, or rewritten in place.

Read through /proc/PID/map_files (the very file mapped, whatever its path
holds now), regular files only and bounded (regular_file.open_library,
elf_tables.ElfImage).  Cached by (device, inode, size, mtime): a file mapped
by many processes, or listed again at each re-read of a process's maps, is
parsed once; a file already recorded for a process costs nothing."""

from __future__ import annotations

import os
from pathlib import Path

from elftools.common.exceptions import ELFError

from ...elf_tables import ElfImage
from ...regular_file import open_library

#: files whose build-id is kept (a 40-character string each); past it the cache starts over
MAX_FILES = 8192

#: a maps line's file: (device as maps writes it, "fd:01"; inode)
MapsFile = tuple[str, int]


class BuildIds:
    def __init__(self, proc: Path = Path("/proc")):
        self._proc = proc
        self._by_file: dict[tuple[int, int, int, int], str | None] = {}
        #: pid -> the build-id (None: the file has none) of each file its latest maps map executable
        self.of_pid: dict[int, dict[MapsFile, str | None]] = {}

    def record(self, pid: int, maps: str) -> None:
        """Read the build-ids of the executable file mappings of ``maps`` (the
        text just read from /proc/PID/maps) that ``pid`` has not had recorded;
        a file that cannot be read now is left out (named offline by its
        device and inode only)."""
        had = self.of_pid.get(pid, {})
        now: dict[MapsFile, str | None] = {}
        for line in maps.splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) != 6 or "x" not in parts[1] or not parts[5].startswith("/"):
                continue
            try:
                key = (parts[3], int(parts[4]))
            except ValueError:
                continue
            if key in now:
                continue
            if key in had:
                now[key] = had[key]
            elif (read := self._read(pid, parts[0])) is not None:
                now[key] = read[0]
        self.of_pid[pid] = now

    def _read(self, pid: int, span: str) -> tuple[str | None] | None:
        """(build-id or None,) of the file mapped at ``span`` ("start-end"); None if unreadable."""
        path = self._proc / str(pid) / "map_files" / span
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._by_file:
            return (self._by_file[key],)
        try:
            with open_library(path) as f:
                opened = os.fstat(f.fileno())
                if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
                    return None  # unmapped, and its range mapped again, between the two looks
                try:
                    found = ElfImage(f, path).build_id()
                except (ELFError, ValueError):
                    found = None  # not an ELF file we can read: it has no build-id to check
        except OSError:
            return None
        if len(self._by_file) >= MAX_FILES:
            self._by_file.clear()
        self._by_file[key] = found
        return (found,)
