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
pidfd, GUARDIAN_POLL_S apart.

The tracer and its guardians watch each other: the tracer keeps GUARDIANS of
them and replaces one that died (LateLoadWatcher), so that a SIGKILL of the
tracer and a guardian together still leaves one to resume what was stopped.
While a capture is written, the events writer process watches too
(watch_in_thread): a kill of the tracer and both guardians still leaves it.

The guardian's stdin is a socket: the tracer sends it, once the capture is
written, what it needs should the tracer and the events writer both die (a
Notice: the capture directory, the ledger, the writer's pidfd, and the
events ring and loss counters by id, opened here at once), and b"done" at
its close.  After resuming what was stopped, a guardian whose tracer died
without b"done" waits for the writer's end; if the manifest is still not
complete then, it completes the capture (takeover.guardian_completes), one
guardian at a time (a lock on the ledger).  Only then are numpy and the
readers imported: the resume never waits for them, and a failure there is a
line on stderr.

    python -m pasta_trace.capture.procs.guardian TRACER_PID PIDFD STOPS_FD CFG_FD VALUE_SIZE TGID_OFFSET

(the STOP_RECORD layout comes as sizes: importing the schema would cost the
tracer most of a second before it can arm the hook)
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time

from . import helper_process, own_process
from ..bpf.map_fds import Map, MapsByName, map_info
from .tracer_end import GUARDIAN_POLL_S, SETTLE_S, exiting, open_maps

STOPS_MAP = "pt_stops"
ARMED_KEY = (1).to_bytes(4, "little")
#: after disarming, stops that raced with it may still land: look again SETTLE_S apart, this many times
SETTLE_ROUNDS = 5
READY = b"ready\n"
#: the tracer's close, on the guardian's stdin (its death says nothing)
DONE = b"done"
#: a Notice's JSON, at most
NOTICE_MAX = 1 << 16
#: guardians per tracer: any one of them resumes everything; two survive a kill of the tracer with one
GUARDIANS = 2


def wait_for_end(pid: int, pidfd: int, stdin: int | None = 0) -> None:
    """Until ``pid`` begins to exit, or ``stdin`` has something to read (a message, its end).
    /proc/PID/stat is read before the pidfd is asked: a PID reused after our
    tracer's end is then never mistaken for it."""
    fds = [pidfd] if stdin is None else [pidfd, stdin]
    while True:
        leaving = exiting(pid)
        if select.select(fds, [], [], 0)[0] or leaving:
            return
        select.select(fds, [], [], GUARDIAN_POLL_S)


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
    conn = socket.socket(fileno=0)
    capture: _Capture | None = None
    while True:
        wait_for_end(tracer, pidfd)
        end_ns = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        told, over, notice = _messages(conn)
        capture = notice or capture
        if told or over or exiting(tracer):
            break
    release_all(tracer, stops, cfg, others, tgid_offset)
    if capture is not None and not told:
        capture.complete(end_ns)
    return 0


def _messages(conn: socket.socket) -> tuple[bool, bool, "_Capture | None"]:
    """What the tracer sent that was not read yet: (b"done" came, the input
    ended, the last notice)."""
    told, notice = False, None
    while select.select([conn], [], [], 0)[0]:
        try:
            msg, fds, _, _ = socket.recv_fds(conn, NOTICE_MAX, 8)
        except OSError:
            msg, fds = b"", []
        if not msg:
            return told, True, notice
        if msg == DONE:
            told = True
        else:
            notice = _Capture.receive(msg, fds) or notice
    return told, False, notice


class _Capture:
    """A guardian's hold on the capture (a Notice received): enough to complete it."""

    def __init__(self, spec: dict, fds: list[int], maps: tuple[int, dict[str, int]]):
        self.spec = spec
        self.dir_fd, self.ledger_fd, self.writer_pidfd, self.tracer_pidfd = fds
        self.maps = maps

    @classmethod
    def receive(cls, msg: bytes, fds: list[int]) -> "_Capture | None":
        """Open the maps named while the tracer holds them; None (and nothing held) if that fails."""
        try:
            spec = json.loads(msg)
            if len(fds) != 3:
                raise ValueError("a notice holds three descriptors")
            maps = open_maps(spec)
            return cls(spec, [*fds, os.pidfd_open(int(spec["tracer"]))], maps)
        except (OSError, ValueError, KeyError, TypeError) as e:
            for fd in fds:
                os.close(fd)
            print(f"pasta-trace: a guardian cannot complete the capture should the tracer die: {e}", file=sys.stderr)
            return None

    def complete(self, end_ns: int) -> None:
        """The tracer died: once the events writer is gone too, complete what it left."""
        select.select([self.writer_pidfd], [], [])  # its own takeover ends first, however long it takes
        # one guardian at a time, and never twice: a lock of our own open of the ledger
        lock = os.open(f"/proc/self/fd/{self.ledger_fd}", os.O_RDONLY | os.O_CLOEXEC)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            from pathlib import Path

            from ...safe_output import OutputDir
            from ..output.ledger import Ledger
            from ..output.takeover import Takeover, guardian_completes

            ledger = Ledger(self.ledger_fd)
            out = OutputDir(self.dir_fd, Path(f"/proc/self/fd/{self.dir_fd}"))
            take = Takeover(self.spec, ledger, self.maps, self.tracer_pidfd)
            if guardian_completes(out, take, ledger, end_ns):
                print(f"pasta-trace: tracer PID {take.tracer} and its events writer died: a guardian completed the "
                      "capture's manifest, every event on disk or counted", file=sys.stderr)
        except Exception as e:  # noqa: BLE001 - what was stopped is resumed already: this is a note
            print(f"pasta-trace: a guardian could not complete the capture of the dead tracer: {e}", file=sys.stderr)
        finally:
            os.close(lock)


class Notice:
    """What the guardians need should the tracer and the events writer both
    die (held by the tracer, for the guardians started later too): the spec
    of takeover.spec_of, and descriptors of the capture directory, the ledger
    and the writer (a pidfd), duplicated here, closed with close()."""

    def __init__(self, spec: dict, dir_fd: int, ledger_fd: int, writer_pidfd: int):
        self.payload = json.dumps(spec).encode()
        self.fds = [os.dup(dir_fd), os.dup(ledger_fd), writer_pidfd]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


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
    from ..bpf.map_fds import lib

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
        # its stdin: a socket, for the notice's descriptors (notify)
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                helper_process.argv("pasta_trace.capture.procs.guardian", os.getpid(), pidfd, stops_fd, cfg_fd,
                                    value_size, tgid_offset),
                stdin=theirs.fileno(), stdout=subprocess.PIPE, pass_fds=(pidfd, stops_fd, cfg_fd),
                start_new_session=True, env=helper_process.env(), cwd=helper_process.CWD,
            )
        except BaseException:
            self._sock.close()
            raise
        finally:
            os.close(pidfd)
            theirs.close()
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

    def notify(self, notice: Notice) -> None:
        """Give it what it needs to complete the capture should we and the events writer die."""
        try:
            socket.send_fds(self._sock, [notice.payload], notice.fds)
        except OSError:
            pass  # it died: its replacement is notified (LateLoadWatcher)

    def tell_done(self) -> None:
        """Say we are done and close its stdin: it resumes anything left and exits."""
        if self._sock.fileno() >= 0:
            try:
                self._sock.send(DONE)
            except OSError:
                pass  # it died already
            self._sock.close()

    def close(self) -> None:
        """Tell the guardian we are done (it resumes anything left) and reap it."""
        self.tell_done()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # it will still end, reparented; never hold up the tracer's exit


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
