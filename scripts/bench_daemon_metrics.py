#!/usr/bin/env python3
"""What --metrics costs the daemon: two daemons trace the same launches at once (run as root).

Daemon A runs with `--metrics off`, daemon B with `--metrics 127.0.0.1:PORT`,
scraped every --scrape seconds as Prometheus would; both attach their probes
to the same stand-in libcuda.so.1 (tests/fixtures), so every launch of the
workload is drained by both, and the difference of their CPU time is what
counting, folding and serving the metrics cost.  Each round runs
`cuda_workload --flood N --threads 1` (N cuLaunchKernel calls as fast as the
traced program can make them) and takes each daemon's utime + stime
(/proc/PID/stat, every thread: the HTTP server's too) from before the
workload to once both have drained it; B's pasta_launches_total of the
workload is checked against N.  An idle part first measures both with no
GPU process.

The tracers run as `sudo` from a temporary user would (SUDO_UID: they trace
that user's processes only) and the workload as that user, so that other
work on a shared machine is not counted.  Each launch goes through two sets
of probes, so the launch rate is about half what one tracer sees.

    sudo .venv/bin/python scripts/bench_daemon_metrics.py --rounds 3 --flood 3000000
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
sys.path.insert(0, str(ROOT))
from pasta_trace.testing.bench_load import process_ticks  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    return process_ticks(pid) / TICKS


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def launches(text: str, series: str) -> float | None:
    """The value of ``series`` (its name and labels, and a space) in a /metrics text."""
    line = next((ln for ln in text.splitlines() if ln.startswith(series)), None)
    return None if line is None else float(line[len(series):])


class Daemon:
    def __init__(self, tmp: Path, name: str, metrics: str, env: dict[str, str]):
        self.log = tmp / f"{name}.log"
        cmd = [str(Path(sys.executable).parent / "pasta-trace"), "daemon", "-o", str(tmp / f"{name}-dumps"),
               "--socket", str(tmp / "sock" / f"{name}.sock"), "--window-bytes", "64M", "--metrics", metrics]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "w"), env=env,
                                     start_new_session=True)

    def wait_ready(self) -> None:
        deadline = time.monotonic() + 600
        while "Ctrl-C to end" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(timeout=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--flood", type=int, default=3_000_000, help="launches a round (default 3,000,000)")
    ap.add_argument("--idle", type=float, default=10.0, metavar="SEC", help="idle measurement (default 10)")
    ap.add_argument("--scrape", type=float, default=1.0, metavar="SEC", help="scrape interval (default 1)")
    a = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("run as root: the tracers load BPF programs")
    import build
    import users

    with users.temporary_user() as user, tempfile.TemporaryDirectory(prefix="pasta-bench-metrics-", dir="/tmp") as d:
        tmp = Path(d)
        tmp.chmod(0o755)
        (tmp / "sock").mkdir(mode=0o755)
        for sub in ("a-dumps", "b-dumps", "out"):  # the user's: the daemons' dumps, the workload's reports
            (tmp / sub).mkdir()
            os.chown(tmp / sub, user.uid, user.gid)
        stub, workload = tmp / "lib" / "libcuda.so.1", tmp / "cuda_workload"
        stub.parent.mkdir()
        shutil.copy2(build.cuda_stub(), stub)
        shutil.copy2(build.cuda_workload(), workload)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, **user.sudo_env}
        plain, metered = Daemon(tmp, "a", "off", env), Daemon(tmp, "b", f"127.0.0.1:{port}", env)
        stop = threading.Event()
        scrapes = []

        def scraper() -> None:
            while not stop.wait(a.scrape):
                began = time.monotonic()
                scrapes.append((len(scrape(f"http://127.0.0.1:{port}/metrics")), time.monotonic() - began))

        try:
            plain.wait_ready()
            metered.wait_ready()
            threading.Thread(target=scraper, daemon=True).start()
            time.sleep(3)  # their first turns (rescans) are not idle
            print(f"load {os.getloadavg()[0]:.2f} (1 min), {os.cpu_count()} CPUs; user {user.name}; "
                  f"scraped every {a.scrape:g} s")
            base = cpu_s(plain.proc.pid), cpu_s(metered.proc.pid)
            time.sleep(a.idle)
            idle = [(cpu_s(p.proc.pid) - b) / a.idle * 100 for p, b in zip((plain, metered), base)]
            print(f"idle {a.idle:g} s: off {idle[0]:.1f} % of a core, on {idle[1]:.1f} %")
            rows = []
            for n in range(a.rounds):
                base = cpu_s(plain.proc.pid), cpu_s(metered.proc.pid)
                began = time.monotonic()
                r = subprocess.run([str(workload), "--lib", str(stub), "--report", str(tmp / "out" / f"r{n}.json"),
                                    "--threads", "1", "--flood", str(a.flood)], user=user.uid, group=user.gid,
                                   extra_groups=[], capture_output=True, text=True, timeout=600)
                if r.returncode != 0:
                    raise SystemExit(f"the workload failed: {r.stderr}")
                took = time.monotonic() - began
                pid = int((tmp / "out" / f"r{n}.json").read_text().split('"pid": ', 1)[1].split(",", 1)[0])
                series = f'pasta_launches_total{{comm="cuda_workload",container="",pid="{pid}",pod=""}} '
                deadline = time.monotonic() + 60
                while launches(scrape(f"http://127.0.0.1:{port}/metrics"), series) != a.flood:
                    if time.monotonic() > deadline:
                        raise SystemExit(f"{series}is not {a.flood} in /metrics (events lost?)")
                    time.sleep(0.2)
                time.sleep(1.5)  # both drained: A polls as B does
                spent = [cpu_s(p.proc.pid) - b for p, b in zip((plain, metered), base)]
                rows.append((took, *spent))
                print(f"round {n}: {a.flood:,} launches in {took:.1f} s ({a.flood / took:,.0f}/s); daemon CPU off "
                      f"{spent[0]:.2f} s, on {spent[1]:.2f} s: +{spent[1] - spent[0]:.2f} s "
                      f"(+{(spent[1] - spent[0]) / a.flood * 1e9:.0f} ns a launch, "
                      f"+{(spent[1] - spent[0]) / took * 100:.1f} % of a core); load {os.getloadavg()[0]:.2f}")
            if rows:
                extra = [(on - off) / a.flood * 1e9 for _, off, on in rows]
                share = [(on - off) / off * 100 for _, off, on in rows]
                print(f"median: +{statistics.median(extra):.0f} ns a launch ({min(extra):.0f}-{max(extra):.0f}), "
                      f"+{statistics.median(share):.0f} % of the daemon's CPU ({min(share):.0f}-{max(share):.0f})")
            sizes = [s for s, _ in scrapes]
            print(f"{len(scrapes)} scrapes: {max(sizes):,} bytes at most, "
                  f"{statistics.median(t for _, t in scrapes) * 1e3:.1f} ms median")
        finally:
            stop.set()
            plain.stop()
            metered.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
