"""The daemon's pace (daemon.pacing) on a real daemon: idle, its main thread
sleeps between drains as long as its events ring allows (about 21 turns a
second with the default ring, where it turned 100 times), and a flood that
starts on it, idle, loses nothing.

The daemon traces a user made for the test (as `sudo pasta-trace daemon`
from that user would): the BPF programs drop every other user's processes,
so other work on the machine neither wakes it nor counts here."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

import expect
import users
from pasta_run import Tracer, read_report, run_pasta

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]


@pytest.fixture(scope="module")
def user():
    if (why := users.unavailable()) is not None:
        pytest.skip(why)
    with users.temporary_user() as u:
        yield u


@pytest.fixture(scope="module")
def home(user):
    with users.users_directory(user) as d:
        yield d


@pytest.fixture(scope="module")
def daemon(user, home):
    sock_dir = Path(home.parent) / f"{home.name}-sock"  # root's: the daemon refuses a socket directory others own
    sock_dir.mkdir(mode=0o755)
    sock = sock_dir / "daemon.sock"
    daemon = Tracer(["daemon", "-o", str(home / "dumps"), "--socket", str(sock), "--metrics", "off"],
                    home / "daemon.log", env=user.sudo_env)
    try:
        daemon.wait_ready(timeout=180)  # the first start of a configuration compiles the BPF program
        yield daemon.proc, sock
        assert daemon.stop() == 0, daemon.stderr()
    finally:
        daemon.kill()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _sleeps(pid: int) -> int:
    """The voluntary context switches of ``pid``'s main thread: each a wait of its loop's poll."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for {pid}")


def test_an_idle_daemon_wakes_about_20_times_a_second(daemon):
    proc, _ = daemon
    time.sleep(1.0)  # its first turns (the first rescan) are behind it
    before, t0 = _sleeps(proc.pid), time.monotonic()
    time.sleep(3.0)
    rate = (_sleeps(proc.pid) - before) / (time.monotonic() - t0)
    print(f"idle daemon: {rate:.1f} waits a second")
    # 47.7 ms apart with the default ring (21 a second); the 10 ms pace of a busy drain would be 100
    assert 5 < rate < 40


def test_a_flood_that_starts_on_the_idle_daemon_loses_nothing(daemon, user, home, cuda_stub, cuda_workload):
    proc, sock = daemon
    lib = home / "lib" / "libcuda.so.1"  # where the test's user can read it
    lib.parent.mkdir()
    lib.write_bytes(cuda_stub.read_bytes())
    workload = home / "cuda_workload"
    workload.write_bytes(cuda_workload.read_bytes())
    workload.chmod(0o755)
    report = home / "report.json"
    time.sleep(0.5)  # idle: the daemon sleeps the idle pace when the flood begins
    flood = subprocess.Popen([str(workload), "--lib", str(lib), "--report", str(report), "--threads", "1",
                              "--flood", "300000"], user=user.uid, group=user.gid, extra_groups=[])
    assert flood.wait(timeout=120) == 0
    made = read_report(report)["flood"]["calls"] + len(expect.expected_calls(read_report(report),
                                                                              {"setup", "before_go", "run"}))
    r = run_pasta(["dump", "--socket", str(sock), "--pid", str(flood.pid)])  # as root: always let in
    assert r.returncode == 0, r.stderr
    d = Path(r.stdout.strip())
    manifest = json.loads((d / "manifest.json").read_text())  # written before dump answered
    assert manifest["counts"]["lost_events"] == 0
    assert manifest["trigger"]["dropped_events"] == 0
    assert manifest["counts"]["events"] == made
