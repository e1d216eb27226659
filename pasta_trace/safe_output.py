"""Where pasta-trace writes, and how: one output policy for every verb.

Tracing runs as root, and the processes it traces (a launched command runs as
the user who ran sudo) must not be able to turn root's writes against other
files.  So, when running as root:

- an output path is walked from ``/`` one component at a time, by directory
  fd; a symbolic link on the way is followed only when root owns it (or,
  under sudo, where the walk is the user's, the user), and each
  directory on the way must belong to root or to the user who ran sudo;
- every write is relative to the fd of its directory (opened
  ``O_DIRECTORY|O_NOFOLLOW``); temporaries are created
  ``O_CREAT|O_EXCL|O_NOFOLLOW`` under a random name and renamed into place,
  and a rename replaces a planted link instead of writing through it;
- under sudo (privilege.invoking_user), every directory and file of an
  output is made, renamed and removed with the user's filesystem credentials
  (privilege.as_user): it can only go where the user could write, it is the
  user's from the moment it exists, and nothing is ever chowned;
- run by root itself, a capture directory that existed belongs to root (0700)
  while it is written and gets its owner and mode back at the end.

The offline verbs become the user before they open anything (cli, privilege.
drop_to_user): for them the kernel enforces all of it.  For every verb an
existing output is a usage error (exit 2) unless --force.
"""

from __future__ import annotations

import fnmatch
import os
import secrets
import shutil
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable

from .errors import UsageError
from .privilege import as_user, invoking_user

__all__ = ["OutputDir", "OutputFile", "StagedDir", "invoking_user", "open_adoptable"]

DIR_MODE = 0o700
FILE_MODE = 0o600
#: the kernel's own limit on links followed in one path walk (ELOOP)
MAX_LINKS = 40
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
#: how a file we wrote is reopened to be handed over: never through a link,
#: never blocking on a FIFO put in its place
_HANDOVER = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _guarded() -> bool:
    return os.geteuid() == 0


def _trusted_owner(uid: int) -> bool:
    user = invoking_user()
    return uid == 0 or (user is not None and uid == user[0])


def _trusted_link(uid: int) -> bool:
    """A link root may follow: root's own; under sudo also the user's, since
    every walk is then made with the user's credentials (as_user), and the
    kernel lets it lead only where the user could go themselves."""
    user = invoking_user()
    return uid == 0 or (user is not None and uid == user[0])


def _lstat(dir_fd: int, name: str, shown: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise UsageError(f"{shown}: {e.strerror}") from None


@dataclass
class _Found:
    parent_fd: int  # the directory that holds `name` (the caller closes it)
    parent: str  # its path, for messages
    name: str
    stat: os.stat_result | None  # of `name` itself, None when it does not exist


def _walk(path: Path, *, make_parents: bool) -> _Found:
    """Resolve `path` to its last component inside an open directory, by fd,
    checking every link and directory on the way (see the module docstring)."""
    given = str(path)
    absolute = path if path.is_absolute() else Path(os.getcwd(), path)
    todo = deque(PurePosixPath(absolute).parts[1:])
    held = [os.open("/", _DIR_FLAGS)]
    shown = ["/"]
    links = 0
    try:
        while todo:
            name = todo.popleft()
            if name in ("", "."):
                continue
            if name == "..":
                if len(held) > 1:
                    os.close(held.pop())
                    shown.pop()
                continue
            here = os.path.join(shown[-1], name)
            st = _lstat(held[-1], name, here)
            if st is not None and stat.S_ISLNK(st.st_mode):
                if _guarded() and not _trusted_link(st.st_uid):
                    raise UsageError(f"refusing {given}: {here} is a symbolic link owned by uid {st.st_uid}",
                                     hint="as root only root's links are followed: give the path it points to")
                links += 1
                if links > MAX_LINKS:
                    raise UsageError(f"{given}: too many levels of symbolic links")
                target = PurePosixPath(os.readlink(name, dir_fd=held[-1]))
                todo.extendleft(reversed(target.parts[1:] if target.is_absolute() else target.parts))
                if target.is_absolute():
                    for fd in held[1:]:
                        os.close(fd)
                    del held[1:], shown[1:]
                continue
            if not todo:
                return _Found(held.pop(), shown[-1], name, st)
            if st is None:
                if not make_parents:
                    raise UsageError(f"{here}: no such directory")
                try:
                    os.mkdir(name, 0o755, dir_fd=held[-1])
                except FileExistsError:  # made by someone else meanwhile: look again
                    todo.appendleft(name)
                    continue
                except OSError as e:
                    raise UsageError(f"cannot create {here}: {e.strerror}") from None
            elif not stat.S_ISDIR(st.st_mode):
                raise UsageError(f"{here} is not a directory")
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=held[-1])
            except OSError as e:  # ELOOP: replaced by a link since the lstat
                raise UsageError(f"cannot open {here}: {e.strerror}") from None
            held.append(fd)
            shown.append(here)
            owner = os.fstat(fd).st_uid
            if _guarded() and not _trusted_owner(owner):
                raise UsageError(f"refusing {given}: {here} belongs to uid {owner}, neither root nor you")
        raise UsageError(f"{given} cannot be an output")
    finally:
        for fd in held:
            os.close(fd)


def _check_writable(dir_fd: int, shown: str) -> None:
    """Fail now, before anything starts, on a read-only mount or a full quota."""
    name = f".pasta-trace-probe-{secrets.token_hex(6)}"
    try:
        os.close(os.open(name, _NEW_FILE, FILE_MODE, dir_fd=dir_fd))
    except OSError as e:
        raise UsageError(f"cannot write in {shown}: {e.strerror}", hint="choose another output") from None
    os.unlink(name, dir_fd=dir_fd)


def _shared(st: os.stat_result) -> bool:
    """A directory others may write in (/tmp and the like): never ours to take."""
    return bool(st.st_mode & (stat.S_ISVTX | stat.S_IWOTH))


class OutputDir:
    """A directory held open by fd; every file in it is written relative to
    that fd and remembered, so it can be handed over at the end.

    Under sudo every entry is made, renamed and removed as the user who ran
    it (privilege.as_user), by whichever process holds the directory (the
    events writer process too, which inherits SUDO_UID): the user's from the
    start, so there is nothing to hand over."""

    def __init__(self, fd: int, path: Path, *, parent_fd: int | None = None, made: bool = False) -> None:
        self.fd = fd
        self.path = Path(path)
        #: whose filesystem credentials make the entries (None: this process's own)
        self.user = invoking_user()
        #: the directory holding this one, when we opened it by its path (claim)
        self._parent_fd = parent_fd
        self._made = made
        #: owner and mode to give back at the end (an existing directory); None: ours, made 0700
        self._restore: tuple[int, int, int] | None = None
        self.created: set[str] = set()
        self._subdirs: dict[str, OutputDir] = {}
        self._reserve: int | None = None  # fd of the unnamed file holding keep_free()'s room

    # ---------------------------------------------------------------- opening

    @classmethod
    def claim(cls, path: Path, *, force: bool, clean: Iterable[str] = (), reuse_empty: bool = True) -> "OutputDir":
        """Create `path`, or take an existing directory: an empty one (unless
        not `reuse_empty`), or with `force` one whose entries matching `clean`
        are removed first.  Under sudo all of it is done as the user."""
        with as_user():
            return cls._claim(path, force=force, clean=clean, reuse_empty=reuse_empty)

    @classmethod
    def _claim(cls, path: Path, *, force: bool, clean: Iterable[str], reuse_empty: bool) -> "OutputDir":
        found = _walk(Path(path), make_parents=True)
        try:
            if found.stat is None:
                try:
                    os.mkdir(found.name, DIR_MODE, dir_fd=found.parent_fd)
                except FileExistsError:  # made by someone else meanwhile: walk again
                    os.close(found.parent_fd)
                    return cls._claim(path, force=force, clean=clean, reuse_empty=reuse_empty)
                except OSError as e:
                    raise UsageError(f"cannot create the output directory {path}: {e.strerror}",
                                     hint="choose another output") from None
            elif not stat.S_ISDIR(found.stat.st_mode):
                raise UsageError(f"output path {path} exists and is not a directory")
            try:
                fd = os.open(found.name, _DIR_FLAGS, dir_fd=found.parent_fd)
            except OSError as e:
                raise UsageError(f"cannot open {path}: {e.strerror}") from None
        except BaseException:
            os.close(found.parent_fd)
            raise
        out = cls(fd, Path(path), parent_fd=found.parent_fd, made=found.stat is None)
        try:
            st = os.fstat(fd)
            if found.stat is not None:
                out._take(st, force, clean, reuse_empty)
            else:
                _check_writable(fd, str(path))
                if _guarded():
                    os.fchmod(fd, DIR_MODE)  # the umask may have taken bits off, never added: be exact
        except BaseException:
            out.abandon()
            raise
        return out

    def _take(self, st: os.stat_result, force: bool, clean: Iterable[str], reuse_empty: bool) -> None:
        if _guarded() and not _trusted_owner(st.st_uid):
            raise UsageError(f"refusing {self.path}: {self.path} belongs to uid {st.st_uid}, neither root nor you")
        if _guarded() and _shared(st):
            raise UsageError(f"refusing {self.path}: others can write in it",
                             hint="give a directory of its own, e.g. a new one inside it")
        entries = os.listdir(self.fd)
        if (entries or not reuse_empty) and not force:
            raise UsageError(f"output directory {self.path} already exists", hint="use --force to overwrite it")
        # before changing anything: a read-only mount (or, under sudo, a directory
        # the user cannot write in) fails here, with nothing to undo
        _check_writable(self.fd, str(self.path))
        if _guarded() and self.user is None:
            # nobody but root may add or swap entries while we write
            restore = (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))
            try:
                os.fchown(self.fd, 0, 0)
                self._restore = restore
                os.fchmod(self.fd, DIR_MODE)
            except OSError as e:
                raise UsageError(f"cannot take over {self.path}: {e.strerror}", hint="choose another output") from None
        for pattern in clean:
            for name in fnmatch.filter(entries, pattern):
                self._remove(name)

    def _remove(self, name: str) -> None:
        """Unlink a file we are about to replace, or empty and remove a directory
        of ours (never following a link: a link is removed itself)."""
        st = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            fd = os.open(name, _DIR_FLAGS, dir_fd=self.fd)
            try:
                for child in os.listdir(fd):
                    os.unlink(child, dir_fd=fd)
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=self.fd)
        else:
            os.unlink(name, dir_fd=self.fd)

    @property
    def pinned(self) -> Path:
        """A path to this directory that no rename or link can redirect, for
        libraries that take paths (readers, Polars' streaming sinks)."""
        return Path(f"/proc/self/fd/{self.fd}")

    def subdir(self, name: str) -> "OutputDir":
        """A directory of ours inside this one (made 0700 on first use)."""
        if name not in self._subdirs:
            with as_user(self.user):
                try:
                    os.mkdir(name, DIR_MODE, dir_fd=self.fd)
                except FileExistsError:
                    pass
                sub = OutputDir(os.open(name, _DIR_FLAGS, dir_fd=self.fd), self.path / name)
            self._subdirs[name] = sub
            self.created.add(name)
        return self._subdirs[name]

    # ---------------------------------------------------------------- writing

    def new_temp(self, final: str) -> tuple[str, int]:
        """A new hidden file for `final`: (name, fd open for writing)."""
        while True:
            name = f".{final}.{secrets.token_hex(6)}.tmp"
            try:
                with as_user(self.user):
                    return name, os.open(name, _NEW_FILE, FILE_MODE, dir_fd=self.fd)
            except FileExistsError:
                continue

    def write_atomic(self, final: str, write: Callable[[str], object]) -> None:
        """`write(path)` fills a new temporary file, which is then renamed to
        `final`: a reader never sees half a file.  `path` names the open file
        itself (/proc/self/fd/N), for writers that only take paths.  `write`
        runs with this thread's own credentials: a thread it starts (Polars'
        pool) must not inherit the user's for good."""
        name, fd = self.new_temp(final)
        try:
            write(f"/proc/self/fd/{fd}")
            with as_user(self.user):
                os.rename(name, final, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                with as_user(self.user):
                    os.unlink(name, dir_fd=self.fd)
            except OSError:
                pass
            raise
        finally:
            os.close(fd)
        self.created.add(final)

    def write_bytes(self, final: str, data: bytes) -> None:
        def write(path: str) -> None:
            with open(path, "wb") as f:
                f.write(data)

        self.write_atomic(final, write)

    def keep_free(self, nbytes: int) -> None:
        """Hold `nbytes` of this directory's file system in an unnamed file
        (O_TMPFILE), until release_space(): on a full disk that room is still
        there for the last small files.  The kernel frees it when the fd
        closes, so a killed process leaves nothing behind.  Best effort: a file
        system without O_TMPFILE or room gets no reserve."""
        try:
            fd = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, FILE_MODE, dir_fd=self.fd)
        except OSError:
            return
        try:
            os.posix_fallocate(fd, 0, nbytes)
        except OSError:
            os.close(fd)
            return
        self.release_space()
        self._reserve = fd

    def release_space(self) -> bool:
        """Give the room of keep_free() back to the file system; False when none was held."""
        if self._reserve is None:
            return False
        os.close(self._reserve)
        self._reserve = None
        return True

    # ---------------------------------------------------------------- finishing

    def hand_over(self, owner: tuple[int, int] | None, also: Iterable[str] = ()) -> None:
        """Give the files written here (and `also`, written by another process
        through this directory) to `owner`, then the directory itself.  Under
        sudo they are the user's already, and root chowns nothing in a
        directory the user controls: a file of root's moved in there would be
        given away."""
        if self.user is not None:
            return
        if owner is not None:
            for sub in self._subdirs.values():
                sub.hand_over(owner)
            for name in sorted(self.created.union(also) - set(self._subdirs)):
                _fchown_ours(self.fd, name, owner)
        if self._restore is not None:
            uid, gid, mode = self._restore
            os.fchown(self.fd, uid, gid)
            os.fchmod(self.fd, mode)
        elif owner is not None:
            os.fchown(self.fd, *owner)

    def abandon(self) -> None:
        """Nothing was recorded: remove the directory if we made it and it is
        still empty, and close it."""
        if self._made and self._parent_fd is not None and not os.listdir(self.fd):
            try:
                with as_user(self.user):
                    os.rmdir(self.path.name, dir_fd=self._parent_fd)
            except OSError:
                pass
        elif self._restore is not None:
            try:
                self.hand_over(None)
            except OSError:  # cleanup after a failure: that failure is what the user must see
                pass
        self.close()

    def discard(self) -> None:
        """A failed or interrupted output: remove what we wrote here (never
        what was there before), then the directory itself if we made it, and
        close it: nothing is left to block the rerun."""
        with as_user(self.user):
            for sub in self._subdirs.values():
                sub.discard()
            for name in self.created - set(self._subdirs):
                try:
                    os.unlink(name, dir_fd=self.fd)
                except OSError:
                    pass
            for name in self._subdirs:
                try:
                    os.rmdir(name, dir_fd=self.fd)
                except OSError:
                    pass
        self._subdirs.clear()
        self.created.clear()
        self.abandon()

    def close(self) -> None:
        self.release_space()
        for sub in self._subdirs.values():
            sub.close()
        for fd in (self.fd, self._parent_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.fd, self._parent_fd = -1, None

    def staging(self, owner: tuple[int, int] | None) -> tuple[Path, int]:
        """A directory beside this one that `owner` (the launched command) may
        write in: never inside this one, which nobody else may touch while it
        is written.  Returns its path and an fd of it."""
        while True:
            name = f".{self.path.name}.device-{secrets.token_hex(6)}"
            try:
                with as_user(self.user):
                    os.mkdir(name, DIR_MODE, dir_fd=self._parent_fd)
                break
            except FileExistsError:
                continue
        fd = os.open(name, _DIR_FLAGS, dir_fd=self._parent_fd)
        if owner is not None and self.user is None:
            os.fchown(fd, *owner)
        return self.path.parent / name, fd

    def remove_staging(self, name: str) -> bool:
        """rmdir a staging directory made by staging(); False when it is not empty."""
        try:
            with as_user(self.user):
                os.rmdir(name, dir_fd=self._parent_fd)
        except OSError:
            return False
        return True


def _fchown_ours(dir_fd: int, name: str, owner: tuple[int, int]) -> None:
    """fchown a file we wrote, opened without following a link; anything else
    under that name (a link, a FIFO, a hard link to another file) is left alone."""
    try:
        fd = os.open(name, _HANDOVER, dir_fd=dir_fd)
    except OSError:
        return
    try:
        st = os.fstat(fd)
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == 0:
            os.fchown(fd, *owner)
    finally:
        os.close(fd)


def open_adoptable(dir_fd: int, name: str, uid: int | None) -> int | None:
    """An fd of a file someone else wrote (the launched command's device
    records), when it is a plain file with one link, owned by `uid` when
    given; None for anything else under that name (a link, a FIFO, a second
    name of another file)."""
    try:
        fd = os.open(name, _HANDOVER, dir_fd=dir_fd)
    except OSError:
        return None
    st = os.fstat(fd)
    if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and (uid is None or st.st_uid == uid):
        return fd
    os.close(fd)
    return None


class OutputFile:
    """One file to write (an HTML report, a trace): checked now, before any
    work, and written atomically into its directory at the end."""

    def __init__(self, path: Path, *, force: bool, example: str = "out") -> None:
        self.path = Path(path)
        with as_user():
            found = _walk(self.path, make_parents=False)
            self._check(found, force, example)
        self.name = found.name
        self._dir = OutputDir(found.parent_fd, Path(found.parent))

    def _check(self, found: _Found, force: bool, example: str) -> None:
        path = self.path
        try:
            if found.stat is not None:
                if stat.S_ISDIR(found.stat.st_mode):
                    raise UsageError(f"{path} is a directory", hint=f"give a file name, e.g. {self.path / example}")
                if not force:
                    raise UsageError(f"{path} exists", hint="use --force to overwrite it")
                if not stat.S_ISREG(found.stat.st_mode):
                    raise UsageError(f"{path} exists and is not a regular file")
            _check_writable(found.parent_fd, found.parent)
        except BaseException:
            os.close(found.parent_fd)
            raise

    def write(self, write: Callable[[str], object]) -> None:
        """Write through `write(path)` (see OutputDir.write_atomic)."""
        self._dir.write_atomic(self.name, write)  # made as the user under sudo: already theirs
        self._dir.close()


class StagedDir:
    """A directory output written whole under a hidden name beside its final
    name, and renamed into place by commit() (merge's timeline): a failed
    write leaves no half output and never touches the old one.

    Libraries write into it by path, with the credentials of their threads:
    under sudo it is used after privilege.drop_to_user, like every offline
    verb's output."""

    def __init__(self, path: Path, *, force: bool, replaceable: Callable[[Path], bool], kind: str) -> None:
        with as_user():
            self._open(Path(path), force, replaceable, kind)

    def _open(self, path: Path, force: bool, replaceable: Callable[[Path], bool], kind: str) -> None:
        self.path = path
        found = _walk(self.path, make_parents=False)
        self._parent_fd, self.name = found.parent_fd, found.name
        try:
            if found.stat is not None:
                if not force:
                    raise UsageError(f"{path} exists", hint="use --force to replace it")
                if stat.S_ISDIR(found.stat.st_mode) and not replaceable(self.path):
                    raise UsageError(f"{path} is a directory but not {kind}; refusing to replace it")
            _check_writable(found.parent_fd, found.parent)
            while True:
                self._tmp = f".{found.name}.{secrets.token_hex(6)}.tmp"
                try:
                    os.mkdir(self._tmp, DIR_MODE, dir_fd=found.parent_fd)
                    break
                except FileExistsError:
                    continue
        except BaseException:
            os.close(found.parent_fd)
            raise
        self.dir = OutputDir(os.open(self._tmp, _DIR_FLAGS, dir_fd=found.parent_fd), Path(found.parent, self._tmp))

    def commit(self) -> None:
        """Replace the old output (if any) with what was written, and give it
        to the user who ran sudo."""
        _adopt_tree(self.dir)
        self.dir.hand_over(invoking_user())
        with as_user():
            st = _lstat(self._parent_fd, self.name, str(self.path))
            if st is not None and stat.S_ISDIR(st.st_mode):
                shutil.rmtree(self.name, dir_fd=self._parent_fd)
            elif st is not None:
                os.unlink(self.name, dir_fd=self._parent_fd)
            os.rename(self._tmp, self.name, src_dir_fd=self._parent_fd, dst_dir_fd=self._parent_fd)
        self._close()

    def discard(self) -> None:
        with as_user():
            shutil.rmtree(self._tmp, dir_fd=self._parent_fd, ignore_errors=True)
        self._close()

    def _close(self) -> None:
        self.dir.close()
        os.close(self._parent_fd)


def _adopt_tree(d: OutputDir) -> None:
    """Count every entry of a directory only we could write in (a fresh 0700
    one of root's) as ours, for hand_over: libraries wrote them by path."""
    for entry in os.scandir(d.fd):
        if entry.is_dir(follow_symlinks=False):
            _adopt_tree(d.subdir(entry.name))
        elif entry.is_file(follow_symlinks=False):
            d.created.add(entry.name)
