"""The daemon's control socket (pasta_trace.daemon.control) on real Unix
sockets in a temporary directory: a request and its answer, a malformed one
refused, a silent peer that holds no one up, a stale socket replaced, one in
use refused, and a directory others may write refused."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

from pasta_trace.daemon import control
from pasta_trace.errors import PastaError, UsageError


def _requests(ctl: control.ControlSocket, n: int, timeout: float = 5.0) -> list[control.Request]:
    got: list[control.Request] = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        assert time.monotonic() < deadline, f"{len(got)} of {n} requests"
        got += ctl.accept()
        time.sleep(0.005)
    return got


def _ask(path: Path, pid: int | None, out: dict) -> None:
    try:
        out["answer"] = control.request_dump(path, pid, timeout=10)
    except PastaError as e:
        out["error"] = e


@pytest.fixture
def ctl(tmp_path: Path):
    c = control.ControlSocket(tmp_path / "run" / "daemon.sock")
    yield c
    c.close()


def test_a_request_is_answered_and_the_socket_is_root_s_only(ctl: control.ControlSocket) -> None:
    st = ctl.path.stat()
    assert (st.st_uid, st.st_mode & 0o777) == (0, 0o600)
    out: dict = {}
    t = threading.Thread(target=_ask, args=(ctl.path, 1234, out))
    t.start()
    (req,) = _requests(ctl, 1)
    assert (req.uid, req.pid, req.pid_filter) == (0, os.getpid(), 1234)
    req.reply({"dir": "/x/dump-1", "events": 3, "dropped": 0})
    t.join()
    assert out == {"answer": {"dir": "/x/dump-1", "events": 3, "dropped": 0}}


def test_a_malformed_request_is_refused_and_a_silent_peer_holds_no_one_up(ctl: control.ControlSocket) -> None:
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.connect(str(ctl.path))  # says nothing: read by a thread of its own for a second
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.connect(str(ctl.path))
    bad.sendall(b'{"dump": "yes"}\n')
    out: dict = {}
    t = threading.Thread(target=_ask, args=(ctl.path, None, out))
    t.start()
    began = time.monotonic()
    (req,) = _requests(ctl, 1)
    assert time.monotonic() - began < control.REQUEST_TIMEOUT_S  # not after the silent peer's second
    assert req.pid_filter is None
    req.reply({"dir": "d", "events": 0, "dropped": 0})
    t.join()
    assert bad.recv(4096) == b'{"error": "refused a malformed request"}\n'
    bad.close()
    silent.close()


def test_a_stale_socket_is_replaced_and_one_in_use_refused(tmp_path: Path, ctl: control.ControlSocket) -> None:
    with pytest.raises(UsageError, match=f"a daemon already listens on {ctl.path}"):
        control.ControlSocket(ctl.path)
    stale = tmp_path / "run" / "stale.sock"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(stale))
    s.close()  # bound, never listened: nothing answers there
    control.ControlSocket(stale).close()
    assert not stale.exists()  # ours removed it at close
    (tmp_path / "run" / "file").write_text("")
    with pytest.raises(UsageError, match="exists and is not a socket"):
        control.ControlSocket(tmp_path / "run" / "file")


def test_a_directory_others_may_write_is_refused(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(UsageError, match="may be written by others than root"):
        control.ControlSocket(open_dir / "daemon.sock")
    assert list(open_dir.iterdir()) == []


def test_no_daemon_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(PastaError, match=f"no daemon listens on {tmp_path / 'none.sock'}"):
        control.request_dump(tmp_path / "none.sock", None, timeout=1)
