#!/usr/bin/env python3
"""What Python stacks cost the daemon: its CPU with stacks (the default) and
with --no-stacks, while a Python program calls the stand-in libcuda.so.1 at a
fixed rate (tests/fixtures/paced_workload.py: every call from the same
stack), in alternating rounds (run as root).

The daemon runs as `sudo` from a temporary user would run it (SUDO_UID: it
traces that user's processes only) and the workload as that user, so other
work on the machine is neither traced nor counted.  CPU is utime + stime of
the daemon and its children, from /proc/PID/stat, over the workload's run,
in percent of one core.  Each run ends with a dump of the workload, which
must hold every call (each with a stack, with stacks on).

    sudo .venv/bin/python scripts/bench_daemon_stacks.py --rate 10000 --seconds 10 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from pasta_trace.daemon.control import request_dump
from pasta_trace.parquet_scan import scan_events
from pasta_trace.testing.bench_load import parent_of, process_ticks

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import build  # noqa: E402  (tests/fixtures/build.py)
import users  # noqa: E402  (tests/fixtures/users.py)

TICKS = os.sysconf("SC_CLK_TCK")
WORKLOAD = ROOT / "tests" / "fixtures" / "paced_workload.py"


def cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` and of its children now."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if int(d.name) == pid or parent_of(int(d.name)) == pid:
                total += process_ticks(int(d.name))
        except OSError:
            continue
    return total


def wait_for(path: Path, timeout: float, proc: subprocess.Popen) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{proc.args[1]} exited or timed out before writing {path}")
        time.sleep(0.02)
    return path.read_text()


def run(stacks: bool, user: users.User, home: Path, cuda: Path, a: argparse.Namespace) -> float:
    """The daemon's CPU (% of a core) over one paced run."""
    where = Path(tempfile.mkdtemp(prefix="run-", dir=home))
    os.chown(where, user.uid, user.gid)
    with tempfile.TemporaryDirectory(prefix="pasta-bench-", dir="/tmp") as sock_dir:
        os.chmod(sock_dir, 0o755)
        sock = Path(sock_dir) / "daemon.sock"
        log = open(where / "daemon.log", "w")
        args = ["daemon", "-o", str(where / "dumps"), "--socket", str(sock), "--metrics", "off",
                "--window", str(a.seconds + 30)] + ([] if stacks else ["--no-stacks"])
        daemon = subprocess.Popen([str(ROOT / ".venv" / "bin" / "pasta-trace"), *args], stdout=subprocess.DEVNULL,
                                  stderr=log, start_new_session=True, env={**os.environ, **user.sudo_env})
        try:
            deadline = time.monotonic() + 300
            while "Ctrl-C to end" not in (where / "daemon.log").read_text():
                if daemon.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((where / "daemon.log").read_text())
                time.sleep(0.1)
            (where / "w").mkdir()
            os.chown(where / "w", user.uid, user.gid)
            w = subprocess.Popen([sys.executable, str(WORKLOAD), "--cuda", str(cuda), "--dir", str(where / "w"),
                                  "--rate", str(a.rate), "--seconds", str(a.seconds)],
                                 user=user.uid, group=user.gid, extra_groups=[], cwd=where)
            wait_for(where / "w" / "ready", 60, w)
            time.sleep(a.settle)  # the daemon's first turns after a new process (its maps, its interpreter)
            before, t0 = cpu_ticks(daemon.pid), time.monotonic()
            (where / "w" / "go").touch()
            made = len(json.loads(wait_for(where / "w" / "done", a.seconds + 120, w))["before"])
            spent, took = cpu_ticks(daemon.pid) - before, time.monotonic() - t0
            d = Path(request_dump(sock, w.pid, 120)["dir"])
            w.kill()
            w.wait()
            ev = scan_events(sorted(d.glob("events-*.parquet"))).filter(pl.col("api") == "cuLaunchKernel").collect()
            with_stack = ev["stack_id"].is_not_null().sum()
            if ev.height != made or (stacks and with_stack != made) or (not stacks and with_stack):
                raise SystemExit(f"the dump holds {ev.height} launches ({with_stack} with a stack) of {made}")
            return 100.0 * spent / TICKS / took
        finally:
            daemon.send_signal(2)
            try:
                daemon.wait(timeout=120)
            except subprocess.TimeoutExpired:
                daemon.kill()
            log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=10_000, help="calls a second (default 10000)")
    ap.add_argument("--seconds", type=float, default=10.0, help="of calls per run (default 10)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each with and without stacks (default 3)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds between the workload's start and its calls")
    a = ap.parse_args()
    if (why := users.unavailable()) is not None:
        raise SystemExit(why)
    cuda = build.cuda_stub()
    print(f"load average before: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}", flush=True)
    got: dict[bool, list[float]] = {True: [], False: []}
    with users.temporary_user() as user, users.users_directory(user) as home:
        for r in range(a.rounds):
            for stacks in (True, False):
                got[stacks].append(run(stacks, user, home, cuda, a))
                print(f"round {r + 1}: {'stacks   ' if stacks else 'no-stacks'} {got[stacks][-1]:5.1f} % of a core "
                      f"(load {Path('/proc/loadavg').read_text().split()[0]})", flush=True)
    for stacks in (True, False):
        print(f"{'stacks' if stacks else '--no-stacks'}: median {statistics.median(got[stacks]):.1f} % of a core "
              f"({min(got[stacks]):.1f}-{max(got[stacks]):.1f}) at {a.rate:,} calls/s")
    print(f"load average after: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
