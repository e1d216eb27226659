"""The daemon's control socket: a Unix stream socket on which `pasta-trace
dump` asks for a dump, one JSON line each way.

Only root may connect: the socket is 0600 root's (0660 and the group's with
--socket-group) in a directory root owns that nobody else may write.  A
daemon run under sudo traces the invoking user's processes only (as -a does)
and its socket is that user's: `sudo pasta-trace dump` becomes the user
before it connects (cli.AS_USER), so a user with sudo pasta-trace can dump
their own daemon and nobody else's.  The file mode is one lock; the peer's
credentials (SO_PEERCRED) are checked as well, so that a socket whose mode
someone loosened still refuses other users.
"""

from __future__ import annotations

import errno
import json
import os
import queue
import socket
import stat
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from ..errors import PastaError, PermissionsError, UsageError

DEFAULT_SOCKET = Path("/run/pasta-trace/daemon.sock")
#: the most a request may hold: a peer that sends more is refused
MAX_REQUEST = 4096
#: peers read at once; more wait in the listen queue
MAX_PEERS = 8
#: how long a connected peer may take to send its request
REQUEST_TIMEOUT_S = 1.0
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass
class Request:
    conn: socket.socket
    pid: int  # the peer's
    uid: int
    pid_filter: int | None  # dump only this process

    def reply(self, answer: dict) -> None:
        try:
            self.conn.settimeout(REQUEST_TIMEOUT_S)
            self.conn.sendall((json.dumps(answer) + "\n").encode())
        except OSError:
            pass  # the client went away: the dump is written all the same
        finally:
            self.conn.close()


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end, as the kernel saw it connect."""
    return _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))


def _groups_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


class ControlSocket:
    def __init__(self, path: Path, group: int | None = None, user: int | None = None):
        """``group``: a group whose members may ask too; ``user``: the user who ran sudo, who may too."""
        self.path = Path(path)
        self.group = group
        self.user = user
        _make_parent(self.path.parent)
        _clear_stale(self.path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)  # never connectable by others, not even between bind and chmod
        try:
            self.sock.bind(str(self.path))
        except OSError as e:
            self.sock.close()
            raise UsageError(f"cannot make the control socket {self.path}: {e.strerror}",
                             hint="choose another --socket") from None
        finally:
            os.umask(old)
        self._ino = os.lstat(self.path).st_ino
        if group is not None or user is not None:
            os.chown(self.path, user or 0, -1 if group is None else group)
        if group is not None:
            os.chmod(self.path, 0o660)
        self.sock.listen(16)
        self._readers: set[threading.Thread] = set()
        self._ready: queue.Queue[Request] = queue.Queue()

    def fileno(self) -> int:
        return self.sock.fileno()

    def accept(self) -> list[Request]:
        """The requests that arrived since the last call.  Each peer is read by
        a thread of its own (a peer that connects and sends nothing must not
        hold the drain up); one refused or malformed is answered and closed there."""
        while len(self._readers) < MAX_PEERS:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                break
            t = threading.Thread(target=self._read, args=(conn,), name="pasta-control", daemon=True)
            self._readers.add(t)
            t.start()
        self._readers = {t for t in self._readers if t.is_alive()}
        out = []
        while True:
            try:
                out.append(self._ready.get_nowait())
            except queue.Empty:
                return out

    def _read(self, conn: socket.socket) -> None:
        pid, uid, gid = peer_credentials(conn)
        bad = Request(conn, pid, uid, None)
        try:
            # read first, even from a peer refused: closing a socket with its request unread
            # would reset the connection, and the peer would never see why
            conn.settimeout(REQUEST_TIMEOUT_S)
            data = b""
            while not data.endswith(b"\n") and len(data) <= MAX_REQUEST:
                chunk = conn.recv(MAX_REQUEST)
                if not chunk:
                    break
                data += chunk
        except OSError:
            conn.close()
            return
        if not self._allowed(pid, uid, gid):
            who = " or ".join(["root", *([f"uid {self.user}"] if self.user is not None else []),
                                  *([f"the group {self.group}"] if self.group is not None else [])])
            bad.reply({"error": f"refused the request: uid {uid} is not {who}", "refused": True})
            return
        try:
            doc = json.loads(data)
            pid_filter = doc.get("pid")
            if doc.get("dump") is not True or not (pid_filter is None or type(pid_filter) is int):
                raise ValueError("not a dump request")
        except (ValueError, AttributeError):
            bad.reply({"error": "refused a malformed request"})
            return
        self._ready.put(Request(conn, pid, uid, pid_filter))

    def _allowed(self, pid: int, uid: int, gid: int) -> bool:
        if uid == 0 or uid == self.user:
            return True
        return self.group is not None and (gid == self.group or self.group in _groups_of(pid))

    def close(self) -> None:
        self.sock.close()
        try:
            if os.lstat(self.path).st_ino == self._ino:  # ours still: not one a later daemon made
                os.unlink(self.path)
        except OSError:
            pass


def _make_parent(d: Path) -> None:
    """The socket's directory: made root's 0755 when missing; refused when
    anyone but root may write it (a user could replace the socket there)."""
    try:
        os.mkdir(d, 0o755)
    except FileExistsError:
        pass
    except OSError as e:
        raise UsageError(f"cannot make {d}: {e.strerror}", hint="choose another --socket") from None
    st = os.stat(d)
    if st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UsageError(f"{d} may be written by others than root: refusing to put the control socket there",
                         hint="choose another --socket")


def _clear_stale(path: Path) -> None:
    """Remove a socket no daemon listens on any more; refuse one in use, or a file that is no socket."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UsageError(f"{path} exists and is not a socket", hint="choose another --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe.connect(str(path))
    except ConnectionRefusedError:
        os.unlink(path)
        return
    except OSError:
        os.unlink(path)
        return
    finally:
        probe.close()
    raise UsageError(f"a daemon already listens on {path}", hint="stop it, or give this one another --socket")


# ---------------------------------------------------------------------- the client (pasta-trace dump)

def _who_may() -> str:
    """What to do when the socket refused us."""
    if os.getuid() != 0 and os.environ.get("SUDO_UID", "0") != "0":  # sudo pasta-trace dump, dropped to the user
        return (f"under sudo, pasta-trace dump connects as you (uid {os.getuid()}): a daemon of root's lets in root "
                "itself (`sudo env -u SUDO_UID pasta-trace dump`) and the members of its --socket-group")
    return "run it as root, or as a member of the daemon's --socket-group"


def request_dump(path: Path, pid: int | None, timeout: float) -> dict:
    """Ask the daemon at ``path`` for a dump and wait for its answer."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    conn.settimeout(timeout)
    try:
        try:
            conn.connect(str(path))
        except PermissionError:
            raise PermissionsError(f"may not connect to the daemon's socket {path}", hint=_who_may()) from None
        except (FileNotFoundError, ConnectionRefusedError):
            raise PastaError(f"no daemon listens on {path}",
                             hint="start one with `pasta-trace daemon -o DIR`, or give its --socket") from None
        try:
            try:
                conn.sendall((json.dumps({"dump": True, "pid": pid}) + "\n").encode())
            except (BrokenPipeError, ConnectionResetError):
                pass  # it answered already (a refusal): read why
            data = b""
            while not data.endswith(b"\n"):
                chunk = conn.recv(1 << 16)
                if not chunk:
                    break
                data += chunk
        except socket.timeout:
            raise PastaError(f"the daemon at {path} did not answer within {timeout:g} s") from None
        except OSError as e:
            if e.errno in (errno.ECONNRESET, errno.EPIPE):
                raise PastaError(f"the daemon at {path} closed the connection without an answer") from None
            raise
    finally:
        conn.close()
    try:
        answer = json.loads(data)
    except ValueError:
        raise PastaError(f"the daemon at {path} did not answer") from None
    if "error" in answer:
        cls = PermissionsError if answer.get("refused") else PastaError
        raise cls(f"the daemon at {path} {answer['error']}")
    return answer
