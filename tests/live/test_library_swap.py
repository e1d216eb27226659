"""A user who owns a mount namespace cannot move the probes onto a decoy.

A real unprivileged user runs, under `sudo pasta-trace -- CMD` (SUDO_* set),
`unshare -Urm` and, inside it, a program that dlopens the stub libcuda.so.1
at path P.  The discover program stops it at that open; while it is stopped
the user bind-mounts a copy of the library (a decoy: same symbols, another
inode) over P, and unmounts it again 12-25 ms later.  The tracer must attach
to the file the process opened, not to whatever P names meanwhile: every
call of the program is captured, nothing is lost, and the manifest's device
and inode are the real file's."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from cli_run import cli  # tests/fixtures/cli_run.py
from pasta_run import copy_library  # tests/fixtures/pasta_run.py
from pasta_trace.probes.catalog import APIS
from pasta_trace.read import open_capture
from users import unavailable  # tests/fixtures/users.py

pytestmark = [pytest.mark.live, pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

PROBED = {a.symbol for a in APIS}
REPEAT = 10  # rounds of real_libs_calls' sequence
#: how long the decoy stays mounted, one capture each (the report: unmounted 12-25 ms after the stop)
HOLD_MS = (12, 18, 25)

#: run as the user inside `unshare -Urm`: start the program, wait for its stop at the
#: library open, swap the decoy in while it is stopped, take it away, report what happened
ATTACKER = r"""
import ctypes, json, os, subprocess, sys, time
prog, real, decoy, calls, hold_ms = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MNT_DETACH = 4096, 2
with open(calls, "w") as out:
    child = subprocess.Popen([prog, "cuda", real, "--repeat", "%d"], stdout=out)
def state():
    with open(f"/proc/{child.pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]
def at_open():
    # stopped with the library open: the stop at its open, not one at its exec
    try:
        fds = [os.readlink(f"/proc/{child.pid}/fd/{n}") for n in os.listdir(f"/proc/{child.pid}/fd")]
    except OSError:
        return False
    return state() == "T" and real in fds
deadline = time.monotonic() + 60
while not at_open() and child.poll() is None and time.monotonic() < deadline:
    pass
stopped = at_open()
if libc.mount(decoy.encode(), real.encode(), None, MS_BIND, None) != 0:
    sys.exit("mount: " + os.strerror(ctypes.get_errno()))
mounted_while_stopped = state() == "T"
time.sleep(hold_ms / 1000)
if libc.umount2(real.encode(), MNT_DETACH) != 0:
    sys.exit("umount: " + os.strerror(ctypes.get_errno()))
print(json.dumps({"pid": child.pid, "stopped": stopped, "mounted_while_stopped": mounted_while_stopped,
                  "rc": child.wait()}))
""" % REPEAT



@pytest.fixture
def base(families):
    """A directory the user can pass through, with the real library and the decoy (a copy)."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    d = Path(tempfile.mkdtemp(prefix="pasta-swap-"))
    d.chmod(0o755)
    copy_library(families[0].stub, d / "real")
    copy_library(families[0].stub, d / "decoy")
    (d / "attacker.py").write_text(ATTACKER)
    yield d
    shutil.rmtree(d)


def test_a_decoy_mounted_over_the_library_during_the_stop_gets_no_probe(require_bpf, user, base, families,
                                                                         real_libs_program):
    real, decoy = base / "real" / families[0].soname, base / "decoy" / families[0].soname
    mine = base / "mine"  # the user's own directory: captures and the program's report go there
    mine.mkdir()
    os.chown(mine, user.uid, user.gid)
    for attempt, hold_ms in enumerate(HOLD_MS):
        out = mine / f"cap{attempt}"
        calls = mine / f"calls{attempt}.json"
        calls.touch()
        os.chown(calls, user.uid, user.gid)
        r = cli("-o", str(out), "--", "unshare", "-Urm", "/usr/bin/python3", str(base / "attacker.py"),
                str(real_libs_program), str(real), str(decoy), str(calls), str(hold_ms),
                env=user.sudo_env, timeout=300)
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout.splitlines()[-1] if r.stdout.strip() else "{}") or pytest.fail(r.stderr)
        # the swap really happened while the process waited for its probes
        assert (seen["stopped"], seen["mounted_while_stopped"], seen["rc"]) == (True, True, 0)
        want = Counter(c["api"] for c in json.loads(calls.read_text()) if c["api"] in PROBED)
        assert want and set(want.values()) == {REPEAT}  # each probed call once a round

        cap = open_capture(out)
        assert cap.complete, cap.problems
        st = real.stat()
        libs = [lib for lib in cap.manifest["libraries"] if lib["path"] == str(real)]
        assert [(lib["dev"], lib["inode"]) for lib in libs] == [(st.st_dev, st.st_ino)], cap.manifest["notes"]
        assert decoy.stat().st_ino not in {lib["inode"] for lib in cap.manifest["libraries"]}
        assert cap.losses == {}
        events = cap.events.collect()
        got = Counter(events.filter(pid=seen["pid"])["api"].cast(str).to_list())
        assert got == want, (hold_ms, cap.manifest["notes"], events.group_by("pid").len().rows())
