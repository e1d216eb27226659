"""The guardian of a tracer's late-load stops: resumes every process that the
tracer stopped and did not resume, when the tracer ends (however it ends:
SIGKILL, a crash, or a normal close).

bpf/discover.bpf.c records each process it stops in the `pt_stops` map before
it sends SIGSTOP.  The guardian is a small process of its own (its own
session, so a Ctrl-C or a kill of the tracer's process group does not reach
it) that holds descriptors of `pt_stops` and `discover_cfg` and a pidfd of
the tracer.  When the tracer dies, or closes the guardian's stdin, it disarms
the hook (no new stops), then deletes every record and sends SIGCONT, unless
another tracer holds the same thread stopped (that tracer resumes it).

"Dies" is the start of its exit, not its end: a SIGKILLed tracer's last thread
spends seconds in the kernel releasing the uprobe links (13 s measured with a
few hundred probes) before its pidfd becomes readable.  PF_EXITING, set in the
flags of /proc/PID/stat at the very start of do_exit, is polled alongside the
pidfd, EXIT_POLL_S apart.

The tracer and its guardians watch each other: the tracer keeps GUARDIANS of
them and replaces one that died (LateLoadWatcher), so that a SIGKILL of the
tracer and a guardian together still leaves one to resume what was stopped.
While a capture is written, the events writer process watches too
(watch_in_thread): a kill of the tracer and both guardians still leaves it.

    python -m pasta_trace.capture.guardian TRACER_PID PIDFD STOPS_FD CFG_FD VALUE_SIZE TGID_OFFSET

(the STOP_RECORD layout comes as sizes: importing the schema would cost the
tracer most of a second before it can arm the hook)
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

from . import helper_process, own_process
from .map_fds import Map, MapsByName, map_info

STOPS_MAP = "pt_stops"
ARMED_KEY = (1).to_bytes(4, "little")
#: after disarming, stops that raced with it may still land: look again this often, this many times
SETTLE_S = 0.02
SETTLE_ROUNDS = 5
READY = b"ready\n"
#: how often the tracer's exit is looked for in /proc/PID/stat (the pidfd wakes us at once anyway)
EXIT_POLL_S = 0.025
#: the flag of a task that has begun to exit (include/linux/sched.h)
PF_EXITING = 0x4
#: guardians per tracer: any one of them resumes everything; two survive a kill of the tracer with one
GUARDIANS = 2


def exiting(pid: int) -> bool:
    """Whether ``pid`` has begun to exit (or is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return True
    return bool(int(fields[6]) & PF_EXITING)


def wait_for_end(pid: int, pidfd: int, stdin: int | None = 0) -> None:
    """Until ``pid`` begins to exit, or ``stdin`` reaches its end (the tracer's close).
    /proc/PID/stat is read before the pidfd is asked: a PID reused after our
    tracer's end is then never mistaken for it."""
    fds = [pidfd] if stdin is None else [pidfd, stdin]
    while True:
        leaving = exiting(pid)
        if select.select(fds, [], [], 0)[0] or leaving:
            return
        select.select(fds, [], [], EXIT_POLL_S)


def release(stops: Map, others: MapsByName, key: bytes, tgid: int) -> bool:
    """Forget one stop of ours and resume its process, unless another tracer
    still holds that thread stopped (that tracer resumes it when it is done:
    the last tracer to let go sends the SIGCONT).  True if resumed."""
    stops.delete(key)
    if others.any_holds(key):
        return False
    try:
        os.kill(tgid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True


def resume_all(stops: Map, others: MapsByName, tgid_offset: int) -> int:
    """Release every record of ``stops``; returns how many processes were resumed."""
    resumed = 0
    for key in stops.keys():
        val = stops.lookup(key)
        if val is not None:
            resumed += release(stops, others, key, int.from_bytes(val[tgid_offset:tgid_offset + 4], "little"))
    return resumed


def main(argv: list[str]) -> int:
    tracer, pidfd, stops_fd, cfg_fd, value_size, tgid_offset = (int(a) for a in argv)
    own_process.mark()
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    stops = Map(stops_fd, 4, value_size)
    cfg = Map(cfg_fd, 4, 4)
    others = MapsByName(STOPS_MAP, 4, value_size, {map_info(stops_fd)[0]})
    sys.stdout.buffer.write(READY)
    sys.stdout.buffer.flush()
    os.close(1)
    wait_for_end(tracer, pidfd)
    release_all(tracer, stops, cfg, others, tgid_offset)
    return 0


def release_all(tracer: int, stops: Map, cfg: Map, others: MapsByName, tgid_offset: int) -> int:
    """The tracer is gone: disarm its hook, then resume everything it stopped."""
    cfg.update(ARMED_KEY, (0).to_bytes(4, "little"))
    resumed = 0
    for _ in range(SETTLE_ROUNDS):
        resumed += resume_all(stops, others, tgid_offset)
        time.sleep(SETTLE_S)
    if resumed:
        print(f"pasta-trace: resumed {resumed} process(es) that tracer PID {tracer} had stopped at a library "
              "load and could not resume", file=sys.stderr)
    return resumed


def watch_in_thread(spec: dict) -> threading.Thread | None:
    """Be one more guardian from inside another of the tracer's processes
    (the events writer): ``spec`` (LateLoadWatcher.guard_spec) names the maps
    by id, opened here while the tracer holds them.  A thread waits for the
    tracer's exit and then does what a guardian does.  None where the maps
    cannot be opened (the guardians still watch)."""
    from .map_fds import lib

    fds = []
    try:
        for ident in (spec["stops_id"], spec["cfg_id"]):
            fd = lib().bpf_map_get_fd_by_id(ident)
            if fd < 0:
                raise OSError("map gone")
            fds.append(fd)
        pidfd = os.pidfd_open(spec["tracer"])
    except OSError:
        for fd in fds:
            os.close(fd)
        return None
    stops = Map(fds[0], 4, spec["value_size"])
    cfg = Map(fds[1], 4, 4)
    others = MapsByName(STOPS_MAP, 4, spec["value_size"], {spec["stops_id"]})

    def watch() -> None:
        wait_for_end(spec["tracer"], pidfd, None)
        release_all(spec["tracer"], stops, cfg, others, spec["tgid_offset"])

    t = threading.Thread(target=watch, name="pasta-guard", daemon=True)
    t.start()
    return t


def start(n: int, stops_fd: int, cfg_fd: int, value_size: int, tgid_offset: int) -> list["Guardian"]:
    """``n`` guardians, started together, each ready (its descriptors held) on return."""
    started: list[Guardian] = []
    try:
        for _ in range(n):
            started.append(Guardian(stops_fd, cfg_fd, value_size, tgid_offset, wait=False))
        for g in started:
            g.wait_ready()
    except BaseException:
        close_all(started)
        raise
    return started


def close_all(guardians: list["Guardian"]) -> None:
    """Tell every guardian we are done (each resumes anything left), then reap them."""
    for g in guardians:
        g.tell_done()
    for g in guardians:
        g.close()


class Guardian:
    """The tracer's handle on its guardian process."""

    def __init__(self, stops_fd: int, cfg_fd: int, value_size: int, tgid_offset: int, *, wait: bool = True):
        pidfd = os.pidfd_open(os.getpid())
        try:
            self._proc = subprocess.Popen(
                helper_process.argv("pasta_trace.capture.guardian", os.getpid(), pidfd, stops_fd, cfg_fd,
                                    value_size, tgid_offset),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(pidfd, stops_fd, cfg_fd),
                start_new_session=True, env=helper_process.env(), cwd=helper_process.CWD,
            )
        finally:
            os.close(pidfd)
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Until it holds its descriptors (it says so once)."""
        if self._proc.stdout.closed:
            return
        if self._proc.stdout.readline() != READY:
            self._proc.wait()
            raise RuntimeError(f"the late-load guardian did not start (exit {self._proc.returncode})")
        self._proc.stdout.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def ended(self) -> bool:
        """Whether the guardian has ended (reaped here)."""
        return self._proc.poll() is not None

    def tell_done(self) -> None:
        """Close its stdin: it resumes anything left and exits."""
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            try:
                self._proc.stdin.close()
            except OSError:
                pass  # it died already

    def close(self) -> None:
        """Tell the guardian we are done (it resumes anything left) and reap it."""
        self.tell_done()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # it will still end, reparented; never hold up the tracer's exit


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
