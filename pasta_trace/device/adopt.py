"""Copying a staged device record file into the capture, bounded.

The staging directory is the traced user's: what lies there may be a file
of any apparent size (a sparse 1 GiB file costs its maker nothing) or one
still growing.  A file is copied only when the capture's file system has
room for it and KEEP_FREE_BYTES more (the manifest and the last small files
must still fit), and no more bytes than it had when measured are copied.
A file not copied is said, not fatal: the capture stays complete."""

from __future__ import annotations

import os

from ..safe_output import OutputDir

#: room left on the capture's file system after a device file is copied
KEEP_FREE_BYTES = 1 << 20
#: bytes per sendfile call
CHUNK = 1 << 24


def copy_problem(src_fd: int, dest: OutputDir) -> str | None:
    """Why the open staged file `src_fd` is not to be copied into `dest`; None when it fits."""
    size = os.fstat(src_fd).st_size
    st = os.fstatvfs(dest.fd)
    free = st.f_bavail * st.f_frsize
    if size + KEEP_FREE_BYTES > free:
        return (f"{size:,} bytes, more than the capture's file system has free ({free:,} bytes, "
                f"{KEEP_FREE_BYTES >> 20} MiB of it kept free)")
    return None


def copy_bounded(dest: OutputDir, final: str, src_fd: int) -> None:
    """Copy `src_fd` in as `final`: at most the size it has now (a file that
    grows meanwhile is cut there), written whole or not at all."""
    size = os.fstat(src_fd).st_size

    def copy(path: str) -> None:
        with open(path, "wb") as out:
            offset = 0
            while offset < size and (n := os.sendfile(out.fileno(), src_fd, offset, min(CHUNK, size - offset))):
                offset += n

    dest.write_atomic(final, copy)
