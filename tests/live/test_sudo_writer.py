"""Under sudo every file of a capture is made with the user's file-system
credentials (pasta_trace.privilege.as_user), by the tracer's threads and by
the events writer process alike: the user's from the moment it exists, so a
tracer killed at any point leaves nothing of root's in the user's directory;
and the threads that make them are root's again after."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from users import unavailable, users_directory  # tests/fixtures/users.py

from pasta_trace import schema
from pasta_trace.capture.output.writer import CaptureWriter
from pasta_trace.privilege import as_user
from pasta_trace.read import open_capture
from pasta_trace.safe_output import OutputDir

pytestmark = [pytest.mark.live, pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

APIS = ["cuLaunchKernel", "cuMemAlloc_v2"]



@pytest.fixture
def home(user):
    with users_directory(user, "pasta-writer-") as d:
        yield d


def _launch(ts: int) -> np.ndarray:
    rec = np.zeros(1, schema.HOST_EVENT.dtype)
    rec["api"], rec["kind"], rec["pid"], rec["tid"], rec["comm"] = 0, int(schema.Kind.launch), 100, 101, b"app"
    rec["ts_ns"], rec["func"] = ts, 0xA
    rec["valid"] = 1 << schema.PAYLOAD_BITS["func"]
    return rec


def _owners(path: Path) -> set[tuple[str, int, int, int]]:
    return {(p.name, p.lstat().st_uid, p.lstat().st_gid, stat.S_IMODE(p.lstat().st_mode)) for p in path.iterdir()}


def test_every_file_is_the_users_while_it_is_written(user, home, monkeypatch):
    monkeypatch.setenv("SUDO_UID", str(user.uid))
    monkeypatch.setenv("SUDO_GID", str(user.gid))
    out = OutputDir.claim(home / "cap", force=False)
    w = CaptureWriter(out, APIS)
    w.add_events(np.concatenate([_launch(1), _launch(2)]))
    w.flush()
    # the events writer process wrote the first file: already the user's, before any hand-over
    assert _owners(home / "cap") == {("events-00000.parquet", user.uid, user.gid, 0o600)}
    w.add_events(_launch(3))
    w.close()
    out.write_bytes("notes.txt", b"written by the tracer")
    out.subdir("device").write_bytes("x.bin", b"x")
    assert _owners(home / "cap") == {("events-00000.parquet", user.uid, user.gid, 0o600),
                                     ("events-00001.parquet", user.uid, user.gid, 0o600),
                                     ("notes.txt", user.uid, user.gid, 0o600),
                                     ("device", user.uid, user.gid, 0o700)}
    assert _owners(home / "cap" / "device") == {("x.bin", user.uid, user.gid, 0o600)}
    st = (home / "cap").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (user.uid, user.gid, 0o700)
    out.hand_over((user.uid, user.gid), also=[f.name for f in w.event_files])  # nothing left to do
    out.close()
    assert open_capture(home / "cap").events.collect()["ts_ns"].sort().to_list() == [1, 2, 3]


def test_as_user_is_this_threads_alone_and_ends_with_the_block(user, home):
    root_only = home / "root-only"
    root_only.mkdir(mode=0o700)
    os.chown(root_only, 0, 0)
    groups = os.getgroups()
    seen: dict[str, object] = {}
    inside = threading.Event()
    done = threading.Event()

    def other_thread() -> None:  # started before the block: root's throughout
        inside.wait()
        seen["other"] = os.listdir(root_only)
        done.set()

    t = threading.Thread(target=other_thread)
    t.start()
    with as_user((user.uid, user.gid)):
        with pytest.raises(PermissionError):
            os.listdir(root_only)  # no CAP_DAC_OVERRIDE while the fsuid is the user's
        (home / "made").mkdir()
        inside.set()
        done.wait(30)
    t.join()
    assert seen["other"] == []
    assert os.listdir(root_only) == [] and os.getgroups() == groups  # root's again
    st = (home / "made").stat()
    assert (st.st_uid, st.st_gid) == (user.uid, user.gid)
