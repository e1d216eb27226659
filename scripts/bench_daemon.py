#!/usr/bin/env python3
"""The daemon's own cost, CPU and memory, idle and under a paced workload (run as root).

Each of --rounds rounds starts `pasta-trace daemon` and measures it:

* idle, for --idle seconds: no GPU process (of the traced user, below);
* paced: scripts/paced_launches.c calls cuLaunchKernel of the stand-in
  libcuda.so.1 (tests/fixtures) --rate times a second (default 100,000) for
  --paced seconds; then a `pasta-trace dump` checks that nothing was lost and
  that the window holds what --window-bytes allows.

CPU is utime + stime from /proc/PID/stat of the tracer and every process under
it (its guardians, the events writer of a capture), over the interval, in
percent of one core; memory is the daemon's VmRSS at the end of each part and
its VmHWM.  The baseline, measured the same way in the same round, is
`pasta-trace -a -o DIR` recording the same workload to disk: the command a
user would run today for the same processes, the same probes and the same
drain, so the ratio says what keeping the window in memory costs against
writing everything.  The figure printed is the median over rounds, with the
rounds' range: a loaded machine moves whole runs.

--soak SEC runs the daemon alone under the paced workload for SEC seconds and
prints its VmRSS every --sample seconds: it must level off once the window
holds --window-bytes of events and stay there.

Other users' work on a shared machine would be traced too (every process of
the machine), and counted as the daemon's cost.  --user NAME, or --temp-user
(one made with useradd for the run), runs the tracers as `sudo` from that
user would (SUDO_UID: they trace that user's processes only, the BPF programs
drop everyone else's) and the workload as that user.

    sudo .venv/bin/python scripts/bench_daemon.py --rounds 3 --idle 20 --paced 20 --temp-user
    sudo .venv/bin/python scripts/bench_daemon.py --rounds 0 --soak 300 --temp-user
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))

import users  # noqa: E402 - tests/fixtures: a temporary user, and what sudo sets for one
from pasta_trace.testing.bench_load import parent_of, process_ticks  # noqa: E402
from users import User  # noqa: E402

READY = "Ctrl-C to end"
TICKS = os.sysconf("SC_CLK_TCK")
#: after the banner: the daemon's first turns (its first rescan, the other tracers' maps) are not idle
SETTLE_S = 3.0
#: bytes an event takes in the window (schema.HOST_EVENT, as drained from the ring)
EVENT_BYTES = 168


def pasta() -> list[str]:
    """PASTA_TRACE_CMD (shell-quoted), as the tests take it: another tree's pasta-trace, for a before-and-after."""
    if os.environ.get("PASTA_TRACE_CMD"):
        return shlex.split(os.environ["PASTA_TRACE_CMD"])
    exe = Path(sys.executable).parent / "pasta-trace"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "pasta_trace.cli"]


def tree(pid: int) -> list[int]:
    """``pid`` and every process under it."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = parent_of(int(name))
            except (OSError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def cpu_ticks(pid: int) -> dict[int, int]:
    """utime + stime of ``pid`` and of each process under it, by PID."""
    out = {}
    for p in tree(pid):
        try:
            out[p] = process_ticks(p)
        except OSError:
            continue
    return out


def used(before: dict[int, int], after: dict[int, int]) -> int:
    return sum(t - before.get(p, 0) for p, t in after.items())


def own(before: dict[int, int], after: dict[int, int]) -> int:
    """The tracer's process alone (the first of cpu_ticks): without its guardians and writer."""
    pid = next(iter(after))
    return after[pid] - before.get(pid, 0)


def memory(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of ``pid``, in bytes."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, val = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(val.split()[0]) * 1024
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def load() -> float:
    return os.getloadavg()[0]


class Tracer:
    """pasta-trace in the background, its stderr in a file, until its banner."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str]):
        self.log = log
        with open(log, "w") as err:
            self.proc = subprocess.Popen([*pasta(), *args], stdout=subprocess.DEVNULL, stderr=err,
                                         start_new_session=True, env={**os.environ, **env})
        deadline = time.monotonic() + 300  # the first start of a configuration compiles the BPF program
        while READY not in log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"pasta-trace {' '.join(args)} did not start:\n{log.read_text(errors='replace')}")
            time.sleep(0.1)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def paced(workload: Path, stub: Path, rate: int, seconds: float, user: User | None, tracer: Tracer) -> dict:
    """Run the paced workload under ``tracer``; its CPU and memory over the launches."""
    ids = {"user": user.uid, "group": user.gid, "extra_groups": []} if user is not None else {}
    w = subprocess.Popen([str(workload), str(stub), str(rate), str(seconds)], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True, **ids)
    if w.stdout.readline().strip() != "ready":  # its library is loaded, and so attached
        w.kill()
        raise SystemExit("the paced workload did not start")
    time.sleep(1.0)  # the attach's own work done
    la = load()
    before, t0 = cpu_ticks(tracer.pid), time.monotonic()
    w.stdin.write("go\n")
    w.stdin.flush()
    out = json.loads(w.stdout.readline())
    w.wait()
    time.sleep(0.05)  # the last drain: a few turns of the loop
    after, t1 = cpu_ticks(tracer.pid), time.monotonic()
    return {"cpu": used(before, after) / TICKS / (t1 - t0), "own": own(before, after) / TICKS / (t1 - t0),
            "launches": out["launches"],
            "rate": out["launches"] / out["seconds"], "latest_tick_ms": out["latest_tick_ms"],
            "load": (la + load()) / 2, **memory(tracer.pid)}


def idle(tracer: Tracer, seconds: float) -> dict:
    time.sleep(SETTLE_S)
    la = load()
    before, t0 = cpu_ticks(tracer.pid), time.monotonic()
    time.sleep(seconds)
    after, t1 = cpu_ticks(tracer.pid), time.monotonic()
    return {"cpu": used(before, after) / TICKS / (t1 - t0), "own": own(before, after) / TICKS / (t1 - t0),
            "load": (la + load()) / 2, **memory(tracer.pid)}


def dump(sock: Path) -> dict:
    """Ask the daemon for a dump (as root: allowed whoever it traces); its manifest."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUDO_")}
    r = subprocess.run([*pasta(), "dump", "--socket", str(sock)], capture_output=True, text=True, env=env,
                       timeout=300)
    if r.returncode != 0:
        raise SystemExit(f"pasta-trace dump failed: {r.stderr.strip()}")
    d = Path(r.stdout.strip())
    manifest = json.loads((d / "manifest.json").read_text())
    shutil.rmtree(d, ignore_errors=True)
    return manifest


def lost_of(manifest: dict) -> int:
    from pasta_trace import schema

    counts = manifest["counts"]
    return sum((counts.get(loss.section, {}) if loss.section else counts).get(loss.name, 0) for loss in schema.LOSSES)


class Bench:
    def __init__(self, a: argparse.Namespace, user: User | None, tmp: Path, stub: Path, workload: Path):
        self.a, self.user, self.tmp, self.stub, self.workload = a, user, tmp, stub, workload
        self.env = user.sudo_env if user is not None else {}

    def daemon(self, tag: str) -> tuple[Tracer, Path]:
        """The daemon as installed (its Prometheus metrics on, on a free port), --window-bytes as asked."""
        sock = self.tmp / "sock" / "daemon.sock"
        return Tracer(["daemon", "-o", str(self.tmp / "dumps"), "--socket", str(sock), "--window-bytes",
                       self.a.window_bytes, "--metrics", f"127.0.0.1:{free_port()}"],
                      self.tmp / f"daemon-{tag}.log", self.env), sock

    def record(self, tag: str) -> tuple[Tracer, Path]:
        out = self.tmp / f"capture-{tag}"
        return Tracer(["-a", "-o", str(out)], self.tmp / f"record-{tag}.log", self.env), out

    def round(self, n: int) -> dict:
        a = self.a
        row = {}
        daemon, sock = self.daemon(str(n))
        try:
            row["daemon_idle"] = idle(daemon, a.idle)
            row["daemon_paced"] = paced(self.workload, self.stub, a.rate, a.paced, self.user, daemon)
            m = dump(sock)
            row["daemon_paced"].update(lost=lost_of(m), window_events=m["counts"]["events"])
        finally:
            daemon.stop()
        record, out = self.record(str(n))
        try:
            row["record_idle"] = idle(record, a.idle)
            row["record_paced"] = paced(self.workload, self.stub, a.rate, a.paced, self.user, record)
        finally:
            record.stop()
        m = json.loads((out / "manifest.json").read_text())
        row["record_paced"].update(lost=lost_of(m), events=m["counts"]["events"])
        shutil.rmtree(out, ignore_errors=True)
        return row

    def soak(self) -> list[tuple[float, int]]:
        a = self.a
        daemon, sock = self.daemon("soak")
        samples = []
        try:
            time.sleep(SETTLE_S)
            samples.append((0.0, memory(daemon.pid)["VmRSS"]))
            ids = {"user": self.user.uid, "group": self.user.gid, "extra_groups": []} if self.user else {}
            w = subprocess.Popen([str(self.workload), str(self.stub), str(a.rate), str(a.soak)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, **ids)
            w.stdout.readline()
            before, t0 = cpu_ticks(daemon.pid), time.monotonic()
            w.stdin.write("go\n")
            w.stdin.flush()
            while w.poll() is None and time.monotonic() < t0 + a.soak:
                time.sleep(min(a.sample, max(0.01, t0 + a.soak - time.monotonic())))
                samples.append((time.monotonic() - t0, memory(daemon.pid)["VmRSS"]))
            out = json.loads(w.stdout.readline())
            cpu = used(before, cpu_ticks(daemon.pid)) / TICKS / (time.monotonic() - t0)
            hwm = memory(daemon.pid)["VmHWM"]
            m = dump(sock)
            hwm_dump = memory(daemon.pid)["VmHWM"]
        finally:
            daemon.stop()
        print(f"soak: {out['launches']:,} launches in {out['seconds']:.0f} s "
              f"({out['launches'] / out['seconds']:,.0f}/s), daemon CPU {100 * cpu:.1f} % of a core, "
              f"lost {lost_of(m)}, window at the end {m['counts']['events']:,} events "
              f"({m['counts']['events'] * EVENT_BYTES / 2**20:.1f} MiB), VmHWM {hwm / 2**20:.0f} MiB "
              f"({hwm_dump / 2**20:.0f} MiB once that dump was written), load {load():.1f}")
        print("  t (s)  VmRSS (MiB)  events made  (their bytes, MiB)")
        for t, rss in samples:
            made = min(t, out["seconds"]) * a.rate
            print(f"  {t:5.0f}  {rss / 2**20:11.0f}  {made:11,.0f}  {made * EVENT_BYTES / 2**20:8.0f}")
        return samples


def pct(xs: list[float]) -> str:
    return f"{100 * statistics.median(xs):5.2f} % ({100 * min(xs):.2f}-{100 * max(xs):.2f})"


def report(rows: list[dict]) -> None:
    def col(part: str, key: str) -> list[float]:
        return [r[part][key] for r in rows]

    print(f"\n{len(rows)} rounds; median (range) of each, CPU in % of one core")
    for what in ("idle", "paced"):
        d, r = col(f"daemon_{what}", "cpu"), col(f"record_{what}", "cpu")
        ratio = [x / y for x, y in zip(d, r) if y > 0]
        print(f"{what:6} daemon {pct(d)}   pasta-trace -a -o {pct(r)}   "
              f"ratio {statistics.median(ratio) if ratio else float('nan'):.2f}   "
              f"load {min(col(f'daemon_{what}', 'load')):.1f}-{max(col(f'daemon_{what}', 'load')):.1f}")
        print(f"       their main processes alone (no guardians, no events writer): daemon "
              f"{pct(col(f'daemon_{what}', 'own'))}, -a {pct(col(f'record_{what}', 'own'))}")
        for part in ("daemon", "record"):
            rss = col(f"{part}_{what}", "VmRSS")
            print(f"       {part:6} VmRSS {statistics.median(rss) / 2**20:.0f} MiB "
                  f"({min(rss) / 2**20:.0f}-{max(rss) / 2**20:.0f}), "
                  f"VmHWM {max(col(f'{part}_{what}', 'VmHWM')) / 2**20:.0f} MiB")
    rates = col("daemon_paced", "rate") + col("record_paced", "rate")
    print(f"paced: {min(rates):,.0f}-{max(rates):,.0f} launches/s achieved; latest tick "
          f"{max(col('daemon_paced', 'latest_tick_ms') + col('record_paced', 'latest_tick_ms')):.1f} ms; "
          f"lost: daemon {col('daemon_paced', 'lost')}, -a {col('record_paced', 'lost')}; daemon window "
          f"{col('daemon_paced', 'window_events')} events; -a wrote {col('record_paced', 'events')}")


def build(tmp: Path, user: User | None) -> tuple[Path, Path]:
    """The stand-in libcuda.so.1 and the paced workload, in ``tmp`` (which the workload's user can read)."""
    import build as fixtures

    stub = tmp / "lib" / "libcuda.so.1"
    stub.parent.mkdir()
    shutil.copy2(fixtures.cuda_stub(), stub)
    workload = tmp / "paced_launches"
    subprocess.run(["gcc", "-O2", "-Wall", "-Werror", str(ROOT / "scripts" / "paced_launches.c"), "-o",
                    str(workload), "-ldl"], check=True)
    return stub, workload


@contextlib.contextmanager
def the_user(a: argparse.Namespace):
    if a.temp_user:
        with users.temporary_user() as u:
            yield u
    elif a.user:
        pw = pwd.getpwnam(a.user)
        yield User(a.user, pw.pw_uid, pw.pw_gid)
    else:
        yield None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle", type=float, default=20.0, metavar="SEC", help="idle measurement (default 20)")
    ap.add_argument("--paced", type=float, default=20.0, metavar="SEC", help="paced measurement (default 20)")
    ap.add_argument("--rate", type=int, default=100_000, help="launches/s of the paced workload (default 100,000)")
    ap.add_argument("--window-bytes", default="64M", help="the daemon's --window-bytes (default 64M)")
    ap.add_argument("--soak", type=float, metavar="SEC", help="also a long paced run of SEC seconds, RSS sampled")
    ap.add_argument("--sample", type=float, default=10.0, metavar="SEC", help="--soak: sample every SEC (default 10)")
    who = ap.add_mutually_exclusive_group()
    who.add_argument("--user", help="trace this user's processes only, as sudo from that user would")
    who.add_argument("--temp-user", action="store_true", help="the same, with a user made for the run")
    a = ap.parse_args()
    if os.geteuid() != 0:
        ap.error("run as root: the tracers load BPF programs")
    with the_user(a) as user, tempfile.TemporaryDirectory(prefix="pasta-bench-daemon-", dir="/tmp") as d:
        tmp = Path(d)
        tmp.chmod(0o755)
        (tmp / "sock").mkdir(mode=0o755)
        (tmp / "dumps").mkdir()
        if user is not None:
            os.chown(tmp, user.uid, user.gid)
            os.chown(tmp / "dumps", user.uid, user.gid)
        stub, workload = build(tmp, user)
        print(f"load: {load():.2f} (1 min), {os.cpu_count()} CPUs; rate {a.rate:,}/s; window-bytes "
              f"{a.window_bytes}; {'user ' + user.name if user else 'root: every process of the machine'}")
        rows = []
        for n in range(a.rounds):
            rows.append(Bench(a, user, tmp, stub, workload).round(n))
            r = rows[-1]
            print(f"round {n + 1}: idle daemon {100 * r['daemon_idle']['cpu']:.2f} %, -a "
                  f"{100 * r['record_idle']['cpu']:.2f} %; {r['daemon_paced']['rate']:,.0f}/s daemon "
                  f"{100 * r['daemon_paced']['cpu']:.2f} %, -a {100 * r['record_paced']['cpu']:.2f} %; "
                  f"load {r['daemon_idle']['load']:.1f}", flush=True)
        if rows:
            report(rows)
        if a.soak:
            Bench(a, user, tmp, stub, workload).soak()
    return 0


if __name__ == "__main__":
    sys.exit(main())
