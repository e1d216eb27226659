"""Under sudo, the Python stack collector reads nothing of a process that
has become another uid's.  After an exec, a process whose executable is named
like an interpreter is looked at again for up to EXEC_RETRY_S (its loader may
map libpython later): a process of the user's that execs a setuid-root
Python in that window is root's by the next look, and must not be read (its
maps, its interpreter file, its memory).  Real user, real setuid-root copy of
the interpreter, real capture of a launched command."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import users
from pasta_run import run_pasta
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

#: named like an interpreter (the collector looks at it again after its exec), it
#: waits a little, then execs argv[1] with the rest
HOP = r"""
#include <unistd.h>
int main(int argc, char **argv)
{
    (void)argc;
    usleep(300000);
    execv(argv[1], argv + 1);
    return 127;
}
"""

#: the setuid program's own proof that it ran as root
SCRIPT = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.geteuid())); time.sleep(1.0)"


@pytest.fixture
def user():
    if (why := users.unavailable()) is not None:
        pytest.skip(why)
    with users.temporary_user() as u:
        yield u


def test_a_setuid_exec_during_the_exec_retry_is_not_read(user, tmp_path):
    root_dir = Path(tempfile.mkdtemp(prefix="pasta-suid-", dir="/tmp"))  # root's, reachable by the user
    try:
        root_dir.chmod(0o755)
        hop = root_dir / "python-hop"
        (tmp_path / "hop.c").write_text(HOP)
        subprocess.run(["cc", "-O1", "-o", str(hop), str(tmp_path / "hop.c")], check=True)
        real = Path(os.path.realpath(sys.executable))
        (root_dir / "bin").mkdir(mode=0o755)
        suid_python = root_dir / "bin" / real.name  # the interpreter finder knows it by its name (python3.11)
        shutil.copy(real, suid_python)
        os.chown(suid_python, 0, 0)
        suid_python.chmod(0o4755)
        with users.users_directory(user) as home:
            proof, out = home / "euid", home / "cap"
            r = run_pasta(["-o", str(out), "--", str(hop), str(suid_python), "-c", SCRIPT, str(proof)],
                          timeout=300, env=user.sudo_env)
            assert r.returncode == 0, r.stderr
            assert proof.read_text() == "0"  # the setuid program did run as root
            cap = open_capture(out)
            assert cap.complete, cap.problems
            pid = cap.manifest["launched"]["pid"]
            status = cap.manifest["stacks"]["processes"]
            # looked at as the user's (the hop, no interpreter), never as root's Python
            assert str(pid) not in status, status
    finally:
        shutil.rmtree(root_dir, ignore_errors=True)
