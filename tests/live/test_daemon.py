"""`pasta-trace daemon` and `pasta-trace dump` on stand-in workloads whose every
launch is logged with its time (tests/fixtures/paced_workload.py): a dump
holds exactly the window's events (those before the window's start absent
and counted as dropped), report and export read it; SIGUSR1 dumps every
process; --pid one; the socket refuses a user who is not root, by its mode
and by the peer's credentials; retention keeps the newest dumps; the memory
the window holds stays bounded under a flood; Ctrl-C and SIGTERM end the
daemon with no dump, nothing left stopped and the socket gone."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl
import pytest

import expect
import users
from pasta_run import Tracer, pasta_command, read_report, run_pasta, tracer_env, wait_for_file
from pasta_trace import schema
from pasta_trace.parquet_scan import scan_events

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "paced_workload.py"


@pytest.fixture
def sock():
    """The control socket's path, in a root-owned 0755 directory under /tmp (a test user can reach it)."""
    with tempfile.TemporaryDirectory(prefix="pasta-daemon-", dir="/tmp") as d:
        os.chmod(d, 0o755)
        yield Path(d) / "daemon.sock"


def start_daemon(tmp_path: Path, sock: Path, *args: str) -> Tracer:
    # --metrics off: daemons of tests that run at once would ask for the same default port (test_daemon_metrics)
    daemon = Tracer(["daemon", "-o", str(tmp_path / "dumps"), "--socket", str(sock), "--metrics", "off", *args],
                    tmp_path / "daemon.log")
    daemon.wait_ready(timeout=180)  # the first start of a configuration compiles the BPF program
    return daemon


class Paced:
    """paced_workload.py, started and made ready (its library attached), not yet going."""

    def __init__(self, cuda_stub: Path, where: Path, rate: int, seconds: float, *extra: str):
        where.mkdir()
        self.dir = where
        self.proc = subprocess.Popen([sys.executable, str(WORKLOAD), "--cuda", str(cuda_stub), "--dir", str(where),
                                      "--rate", str(rate), "--seconds", str(seconds), *extra])
        self.pid = int(wait_for_file(where / "ready", 60, self.proc))

    def go(self) -> None:
        (self.dir / "go").touch()

    def done(self) -> dict:
        return json.loads(wait_for_file(self.dir / "done", 60, self.proc))

    def state(self) -> str:
        return Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def dump(sock: Path, *args: str) -> Path:
    r = run_pasta(["dump", "--socket", str(sock), *args])
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.strip())


def events_of(d: Path, pid: int) -> pl.DataFrame:
    return scan_events(sorted(d.glob("events-*.parquet"))).collect().filter(pl.col("pid") == pid)


def test_a_dump_holds_exactly_the_window_and_report_reads_it(cuda_stub, sock, tmp_path):
    daemon = start_daemon(tmp_path, sock, "--window", "2", "--keep", "3")
    # the workload asks for its dump itself, the moment its last launch returns (paced_workload.py)
    w = Paced(cuda_stub, tmp_path / "w", 1000, 4, "--dump-socket", str(sock))
    try:
        w.go()
        log = w.done()
        d = Path(log["dump"]["dir"])
        assert d.parent == tmp_path / "dumps" and d.name.startswith("dump-") and d.name.endswith(f"-demand-pid{w.pid}")
        manifest = json.loads((d / "manifest.json").read_text())
        assert manifest["complete"] is True
        assert manifest["format_version"] == "%d.%d" % schema.CAPTURE_FORMAT_VERSION
        trigger = manifest["trigger"]
        assert trigger["kind"] == "demand" and trigger["pid"] == w.pid and trigger["window_s"] == 2
        assert trigger["cause"] == f"pasta-trace dump from uid 0 (PID {w.pid})"
        start = trigger["window_start_ns"]
        assert manifest["clock"]["start_ns"] == start
        assert manifest["clock"]["end_ns"] - start < 2.01e9
        ev = events_of(d, w.pid)
        made = len(log["before"])
        assert made == 4000
        # launches m..4000 are in, in order, none missing; 1..m-1 are not
        first = ev["grid_x"][0]
        assert ev["grid_x"].to_list() == list(range(first, made + 1))
        assert ev["ts_ns"].min() >= start
        # by the workload's own clock: launch k fired between before[k-1] and before[k] (end for the last)
        before = log["before"] + [log["end"]]
        assert first == 1 or before[first - 2] < start  # launch first-1 had begun before the window
        assert before[first] >= start  # launch first ended within it
        assert 1 < first < made  # the window began mid-run
        assert trigger["dropped_events"] == first - 1
        assert manifest["counts"]["events"] == ev.height == made - first + 1
        assert log["dump"] == {"dir": str(d), "events": ev.height, "dropped": first - 1}
        assert manifest["pids"] == [w.pid]
        r = run_pasta(["report", str(d)])
        assert r.returncode == 0, r.stderr
        assert f"top kernel  unknown@0x0: {ev.height} launches, pid {w.pid} " in r.stdout
        assert re.search(rf"^ *events  ({ev.height}|{ev.height:,})$", r.stdout, re.M), r.stdout
        r = run_pasta(["export", str(d), "--format", "csv", "-o", str(tmp_path / "csv")])
        assert r.returncode == 0, r.stderr
        r = run_pasta(["merge", str(d), "-o", str(tmp_path / "timeline.parquet")])
        assert r.returncode == 0, r.stderr
        merged = pl.read_parquet(tmp_path / "timeline.parquet" / "events.parquet")
        assert merged.filter(pl.col("pid") == w.pid)["grid_x"].to_list() == ev["grid_x"].to_list()

        # retention: --keep 3, so after four more dumps the three newest are left
        names = [d.name] + [dump(sock, "--pid", str(w.pid)).name for _ in range(4)]
        assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == sorted(names)[-3:]
        assert names == sorted(names)  # named in time order
        assert f"removed {tmp_path / 'dumps' / names[0]} (retention)" in daemon.stderr()

        # Ctrl-C: exit 0, no dump of its own, the socket gone, the workload running
        assert daemon.stop() == 0, daemon.stderr()
        assert sorted(p.name for p in (tmp_path / "dumps").iterdir()) == sorted(names)[-3:]
        assert "stopped; 5 dumps written" in daemon.stderr()
        assert not sock.exists()
        assert w.state() in "RS"
    finally:
        daemon.kill()
        w.kill()


def test_sigusr1_dumps_every_process_and_sigterm_ends_it(cuda_stub, sock, tmp_path):
    daemon = start_daemon(tmp_path, sock, "--window", "30")
    a = Paced(cuda_stub, tmp_path / "a", rate=500, seconds=0.5)
    b = Paced(cuda_stub, tmp_path / "b", rate=1000, seconds=0.5)
    try:
        a.go()
        b.go()
        made = {a.pid: len(a.done()["before"]), b.pid: len(b.done()["before"])}
        assert made == {a.pid: 250, b.pid: 500}
        daemon.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while not (found := list((tmp_path / "dumps").glob("dump-*-signal/manifest.json"))) or \
                not json.loads(found[0].read_text())["complete"]:
            assert time.monotonic() < deadline, daemon.stderr()
            time.sleep(0.05)
        d = found[0].parent
        manifest = json.loads(found[0].read_text())
        assert manifest["trigger"]["kind"] == "signal" and manifest["trigger"]["cause"] == "SIGUSR1"
        assert manifest["trigger"]["pid"] is None
        assert {a.pid, b.pid} <= set(manifest["pids"])  # other processes of the machine may be there too
        for w in (a, b):
            assert events_of(d, w.pid)["grid_x"].to_list() == list(range(1, made[w.pid] + 1))
        procs = pl.read_parquet(d / "processes.parquet")
        assert {a.pid, b.pid} <= set(procs["pid"].to_list())
        assert run_pasta(["report", str(d)]).returncode == 0
        daemon.proc.send_signal(signal.SIGTERM)
        assert daemon.finish() == 0, daemon.stderr()
        assert len(list((tmp_path / "dumps").iterdir())) == 1
        assert not sock.exists()
        assert a.state() in "RS" and b.state() in "RS"
    finally:
        daemon.kill()
        a.kill()
        b.kill()


def _dump_as(user: users.User, sock: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*pasta_command(), "dump", "--socket", str(sock)], capture_output=True, text=True,
                          timeout=60, env=tracer_env(), user=user.uid, group=user.gid, extra_groups=[])


@pytest.mark.skipif(users.unavailable() is not None, reason=str(users.unavailable()))
def test_the_socket_refuses_a_user_who_is_not_root(sock, tmp_path):
    daemon = start_daemon(tmp_path, sock)
    try:
        assert sock.stat().st_mode & 0o777 == 0o600 and sock.stat().st_uid == 0
        with users.temporary_user() as user:
            r = _dump_as(user, sock)
            assert r.returncode == 77, r.stderr
            assert r.stderr.strip() == (f"pasta-trace: error: may not connect to the daemon's socket {sock} (run it "
                                        "as root, or as a member of the daemon's --socket-group)")
            sock.chmod(0o666)  # a mode loosened by mistake: the peer's credentials still refuse
            r = _dump_as(user, sock)
            assert r.returncode == 77, r.stderr
            assert r.stderr.strip() == (f"pasta-trace: error: the daemon at {sock} refused the request: "
                                        f"uid {user.uid} is not root")
        assert not (tmp_path / "dumps").exists()  # nothing was dumped
        assert daemon.stop() == 0
    finally:
        daemon.kill()


@pytest.mark.skipif(users.unavailable() is not None, reason=str(users.unavailable()))
def test_a_socket_group_lets_its_members_ask(sock, tmp_path):
    with users.temporary_user() as member, users.temporary_user() as other:
        daemon = start_daemon(tmp_path, sock, "--socket-group", member.name)
        try:
            st = sock.stat()
            assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, member.gid, 0o660)
            r = _dump_as(member, sock)
            assert r.returncode == 0, r.stderr
            d = Path(r.stdout.strip())
            assert json.loads((d / "manifest.json").read_text())["trigger"]["cause"].startswith(
                f"pasta-trace dump from uid {member.uid} (PID ")
            assert d.stat().st_uid == 0  # the daemon's, root's: the member asked, and reads what root lets it
            r = _dump_as(other, sock)
            assert r.returncode == 77 and "may not connect to the daemon's socket" in r.stderr, r.stderr
            assert daemon.stop() == 0
        finally:
            daemon.kill()


def test_the_window_stays_bounded_under_a_flood(cuda_stub, cuda_workload, sock, tmp_path):
    budget = 4 << 20
    daemon = start_daemon(tmp_path, sock, "--window-bytes", "4M")
    report = tmp_path / "report.json"
    try:
        rss = [_rss(daemon.proc.pid)]
        flood = subprocess.Popen([str(cuda_workload), "--lib", str(cuda_stub), "--report", str(report),
                                  "--threads", "1", "--flood", "1000000"])
        began = time.monotonic()
        while flood.poll() is None:
            rss.append(_rss(daemon.proc.pid))
            time.sleep(0.02)
        took = time.monotonic() - began
        assert flood.returncode == 0
        made = read_report(report)["flood"]["calls"] + len(expect.expected_calls(read_report(report),
                                                                                  {"setup", "before_go", "run"}))
        d = dump(sock, "--pid", str(flood.pid))
        manifest = json.loads((d / "manifest.json").read_text())
        events = manifest["counts"]["events"]
        assert events * schema.HOST_EVENT.dtype.itemsize <= budget
        assert events + manifest["trigger"]["dropped_events"] + manifest["counts"]["lost_events"] == made
        assert events_of(d, flood.pid).height == events
        # 168 MB of events went through; the daemon grew by the window (4 MiB), its open segment, a drain
        # and its decoded copies, and the allocator's slack: measured 7 MiB on a 2-core VM
        growth = max(rss) - rss[0]
        print(f"daemon RSS {rss[0] >> 20} MiB, peak {max(rss) >> 20} MiB over {made:,} events in {took:.1f} s; "
              f"{events:,} held ({events * schema.HOST_EVENT.dtype.itemsize >> 20} MiB)")
        assert growth < 6 * budget
        assert daemon.stop() == 0
    finally:
        daemon.kill()


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.skipif(users.unavailable() is not None, reason=str(users.unavailable()))
def test_under_sudo_the_socket_and_the_dumps_are_the_invoking_users(sock, tmp_path):
    """`sudo pasta-trace daemon` (SUDO_* as sudo sets them): the socket is the user's, whose
    `sudo pasta-trace dump` becomes the user and is let in; another user's is not, and the dump is the user's."""
    with users.temporary_user() as u1, users.temporary_user() as u2, users.users_directory(u1) as home:
        log = tmp_path / "daemon.log"
        with open(log, "w") as err:
            proc = subprocess.Popen([*pasta_command(), "daemon", "-o", str(home / "dumps"), "--socket", str(sock),
                                     "--metrics", "off"],
                                    stdout=subprocess.DEVNULL, stderr=err, start_new_session=True,
                                    env={**tracer_env(), **u1.sudo_env})
        try:
            deadline = time.monotonic() + 180
            while "Ctrl-C to end" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            assert (sock.stat().st_uid, sock.stat().st_mode & 0o777) == (u1.uid, 0o600)

            def sudo_dump(user: users.User) -> subprocess.CompletedProcess:
                return subprocess.run([*pasta_command(), "dump", "--socket", str(sock)], capture_output=True,
                                      text=True, timeout=60, env={**tracer_env(), **user.sudo_env})

            r = sudo_dump(u1)
            assert r.returncode == 0, r.stderr
            d = Path(r.stdout.strip())
            assert d.parent == home / "dumps"
            assert {p.stat().st_uid for p in [d, *d.iterdir()]} == {u1.uid}
            assert json.loads((d / "manifest.json").read_text())["complete"] is True
            r = sudo_dump(u2)
            assert r.returncode == 77, r.stderr
            assert r.stderr.strip() == (
                f"pasta-trace: error: may not connect to the daemon's socket {sock} (under sudo, pasta-trace dump "
                f"connects as you (uid {u2.uid}): a daemon of root's lets in root itself (`sudo env -u SUDO_UID "
                "pasta-trace dump`) and the members of its --socket-group)")
            sock.chmod(0o666)
            r = sudo_dump(u2)
            assert r.returncode == 77, r.stderr
            assert r.stderr.strip() == (f"pasta-trace: error: the daemon at {sock} refused the request: uid {u2.uid} "
                                        f"is not root or uid {u1.uid}")
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=60) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
