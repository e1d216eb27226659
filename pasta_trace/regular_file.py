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
