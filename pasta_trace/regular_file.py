"""Open only regular files, and read small ones with a bound.

Captures and timelines are input that anyone may have edited: a FIFO, a
device such as /dev/zero, or a directory in place of one of their files
would otherwise block a reader for good or feed it without end.  Opening
with O_NONBLOCK never waits for a FIFO's writer; fstat then says what was
opened, and only a regular file is read.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .errors import FormatError

_KINDS = {
    stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket", stat.S_IFLNK: "a symbolic link",
}


def _not_regular(mode: int) -> str:
    return f"{_KINDS.get(stat.S_IFMT(mode), 'a special file')}, not a regular file"


def not_regular(path: Path) -> str | None:
    """Why `path` is no regular file (a link counts as none: captures never
    hold links), or None when it is one."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"cannot read ({e.strerror})"
    return None if stat.S_ISREG(st.st_mode) else _not_regular(st.st_mode)


def open_regular(path: str | os.PathLike, *, follow: bool = False) -> int:
    """A read-only descriptor of the regular file at `path`; FormatError with
    the reason otherwise.  `follow`: accept a link to a regular file (a path
    the user named), else a link is refused like any other non-regular file."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow:
            raise FormatError(f"{path}: {_not_regular(stat.S_IFLNK)}") from None
        raise FormatError(f"{path}: cannot read ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise FormatError(f"{path}: {_not_regular(mode)}")
    return fd


def read_limited(path: Path, limit: int, what: str) -> bytes:
    """The whole of a regular file of at most `limit` bytes (`what` names it
    in the error for a larger one)."""
    with os.fdopen(open_regular(path), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        data = f.read(limit + 1) if size <= limit else b""
    if size > limit or len(data) > limit:
        raise FormatError(f"{path}: {max(size, len(data))} bytes, more than a {what} can hold "
                          f"({limit >> 20} MiB); not a pasta-trace {what}")
    return data


class NotRegularFile(OSError):
    """A file a traced process can name (a library, an executable, a debug
    file) that is no regular file: an OSError, so that every reader that
    already copes with an unreadable file copes with this one too."""


def open_library(path: str | os.PathLike):
    """A binary file object of the regular file at `path`, links followed
    (library paths are links: libcuda.so.1, /proc/PID/fd/N, map_files).

    Any process can put a FIFO, a device or a link to one where a library
    name is expected.  The path is resolved first with O_PATH, which opens
    nothing (no FIFO waits for a writer, no device driver's open runs: a
    watchdog or a tape would act on it), and only when that descriptor is a
    regular file is the same inode opened for reading, through
    /proc/self/fd, with O_NONBLOCK: a rename in between cannot swap in
    another file.  NotRegularFile (an OSError) says what it was."""
    try:
        pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError as e:
        raise NotRegularFile(e.errno, f"cannot open ({e.strerror})", str(path)) from None
    try:
        st = os.fstat(pfd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, _not_regular(st.st_mode), str(path))
        fd = os.open(f"/proc/self/fd/{pfd}", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except NotRegularFile:
        raise
    except OSError as e:
        raise NotRegularFile(e.errno, f"cannot open ({e.strerror})", str(path)) from None
    finally:
        os.close(pfd)
    f = os.fdopen(fd, "rb")
    f.raw.name = os.fspath(path)  # errors name the path, not /proc/self/fd/N
    return f


def allocated_bytes(st: os.stat_result) -> int:
    """The bytes the file system holds for a file (a sparse file's holes hold
    none): what a table read from it can really be made of."""
    return st.st_blocks * 512
