"""A library file held open by the tracer, so that its probes, its symbols
and its build-id all come from the one inode a process mapped or opened.

A path is looked up again at every use, and a user who owns a mount
namespace (``unshare -Urm``) can mount another file over it between our
check and our attach: the probes then land on a decoy while the manifest
names the real file.  So the file is opened once, through a link that names
the very file the process holds (``/proc/PID/fd/N``, ``/proc/PID/map_files/
START-END``, ``/proc/PID/exe``) when there is one, its (device, inode) is
checked against what the process has, and everything after goes through
``/proc/self/fd/M`` of that descriptor: the kernel resolves that magic link
to the open file itself, whatever is mounted where since.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

#: O_PATH opens nothing: no FIFO put where a library was expected waits for a
#: writer, no device's open runs.  The kernel and the readers reach the file
#: through /proc/self/fd/N, which an O_PATH descriptor serves as well as any.
_OPEN_FLAGS = os.O_PATH | os.O_CLOEXEC


class IdentityError(OSError):
    """No candidate path reached the file the process has (gone, or another file there now)."""


@dataclass
class PinnedFile:
    fd: int
    dev: int  # stat's st_dev
    inode: int
    source: str  # the path it was opened through

    @property
    def path(self) -> str:
        """A path that reaches this open file and nothing else (for BCC, the kernel, pyelftools)."""
        return f"/proc/self/fd/{self.fd}"

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def pin(dev: int, inode: int, candidates: Iterable[str]) -> PinnedFile:
    """The first of ``candidates`` that opens a regular file whose (st_dev,
    st_ino) is (``dev``, ``inode``).  Raises IdentityError saying what each
    candidate was (its errno is ENOENT when every one was gone)."""
    why: list[str] = []
    gone = True
    for path in candidates:
        try:
            fd = os.open(path, _OPEN_FLAGS)
        except OSError as e:
            gone = gone and e.errno in (errno.ENOENT, errno.ESRCH)
            why.append(f"{path}: {e.strerror}")
            continue
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) == (dev, inode):
            return PinnedFile(fd, st.st_dev, st.st_ino, path)
        os.close(fd)
        gone = False
        what = "not a regular file" if not stat.S_ISREG(st.st_mode) else f"device {st.st_dev} inode {st.st_ino}"
        why.append(f"{path} is another file now ({what})")
    detail = "; ".join(why[:3]) or "no path to it"
    raise IdentityError(errno.ENOENT if gone else errno.ESTALE,
                        f"not the file the process has (device {dev} inode {inode}): {detail}")


def mapped_files(pid: int, dev: int, inode: int, proc: Path = Path("/proc")) -> Iterator[str]:
    """``/proc/PID/map_files`` links of ``pid``'s mappings of the file (``dev``,
    ``inode``): each reaches exactly what the process mapped.  Lazy: each
    link is stat'ed only when the ones before did not do."""
    d = proc / str(pid) / "map_files"
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return
    for name in names:
        try:
            st = os.stat(d / name)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (dev, inode):
            yield str(d / name)
