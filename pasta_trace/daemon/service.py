"""The daemon's main loop: trace every process as `-a` does (capture.session.session,
set up as for `top`), keep the last window of events in memory (window), and
write a dump (dump) when `pasta-trace dump` asks on the control socket
(control), SIGUSR1 arrives, or an automatic trigger fires (triggers: a CUDA
error, a hang suspect, a process killed or exiting non-zero; all through
Daemon._fire).  Ctrl-C or SIGTERM end it: the probes go, nothing stays
stopped, and no dump is written unless one was asked for or a trigger fired.

Threads: the main thread drains the rings (as often as their size needs: pacing) and takes
each dump's snapshot (the window, the process table, the loss counters); a
dump thread writes the snapshots to disk, so a slow disk never keeps the rings
from being drained.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import schema
from ..capture.output import manifest as mf
from ..capture.output.drain import boost_drain_thread
from ..capture.output.heap import keep_freed_memory
from ..capture.session.options import Options
from ..probes.catalog import API_NAMES
from ..probes.compiled_cache import module_maps
from ..runs import distinct
from ..safe_output import invoking_user
from .control import ControlSocket, Request
from .dump import Tables, Trigger, Written, prune, write_dump
from .metrics import Metrics, Server
from .pacing import RESCAN_S, Pacer, ring_records
from .triggers import KINDS, Debounce, Firing, Triggers
from .stacks import follow, stacks_manifest
from .window import Snapshot, Window

#: how often the loss counters are read (a dump counts the losses since its window began, to this)
CHECKPOINT_S = 1.0
#: how often exited processes are forgotten (a look at /proc for each process seen)
FORGET_S = 10.0
#: the window holds this much more than --window + --after: a trigger's dump is taken a little after it is due
WINDOW_SLACK_S = 1.0


@dataclass
class DaemonOptions:
    out_dir: Path
    window_s: float
    window_bytes: int
    socket: Path
    socket_group: int | None
    keep: int | None
    keep_bytes: int | None
    buffer_pages: int
    command_line: list[str]
    verbose: bool = False
    bpf_cache: bool = True
    stacks: bool = True  # the caller's Python stack on every event, as -a records (--no-stacks: off)
    #: automatic triggers (daemon.triggers): an NCCL call not returned after hang_after_s (None: off), a
    #: process whose calls stop for quiet_after_s (None: off); one dump per cause per process per debounce_s;
    #: a trigger's dump is taken after_s after it fired
    hang_after_s: float | None = 60.0
    quiet_after_s: float | None = None
    debounce_s: float = 300.0
    after_s: float = 5.0
    #: the trigger kinds that make a dump (--triggers); the others are still counted in the metrics
    triggers: frozenset[str] = frozenset(KINDS)
    #: where /metrics is served (host, port); None: no metrics (daemon.metrics)
    metrics: tuple[str, int] | None = None


@dataclass
class _Job:
    snap: Snapshot
    trigger: Trigger
    tables: Tables
    request: Request | None


class Daemon:
    def __init__(self, opts: DaemonOptions, *, say: Callable[[str], None]):
        self.opts = opts
        self.say = say
        self._stop = False
        self._usr1 = False
        self._jobs: queue.Queue[_Job | None] = queue.Queue()
        self._checkpoints: deque[tuple[int, dict[str, int]]] = deque()
        self.dumps: list[Written] = []
        self.metrics: Metrics | None = None
        self._triggers: Triggers | None = None
        self._debounce = Debounce(int(opts.debounce_s * 1e9))
        self._pending: list[tuple[float, Firing, mf.ClockSample]] = []  # (due, monotonic s) of triggers fired

    def run(self) -> int:
        from ..capture.bpf.ringbuf import open_table
        from ..capture.session.session import Session

        o = self.opts
        capture = Options(mode="system", out_dir=o.out_dir, command_line=o.command_line, buffer_pages=o.buffer_pages,
                          stacks=o.stacks, verbose=o.verbose, bpf_cache=o.bpf_cache)
        session = Session(capture, say=self.say, banner=False)
        session.check()
        owner = invoking_user()
        control = ControlSocket(o.socket, o.socket_group, owner[0] if owner is not None else None)
        old = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
        writer = threading.Thread(target=self._write_dumps, name="pasta-dumps")
        events = names = server = None
        # before the probes: it holds all since; a trigger's dump keeps the window before it and after_s after,
        # taken a little after it is due (WINDOW_SLACK_S)
        window = Window(o.window_s + o.after_s + WINDOW_SLACK_S, o.window_bytes, schema.HOST_NAME.dtype)
        session.on_exit_status = lambda pid, status: self._triggers is not None and self._triggers.exited(pid, status)
        try:
            if o.metrics is not None:  # before the probes load: an address in use fails at once
                self.metrics = Metrics(list(API_NAMES))
                server = Server(self.metrics, *o.metrics)
                self.say(f"Metrics on http://{server.address}/metrics")
            session.setup()
            self._triggers = Triggers(module_maps(session.bpf)["inflight"][0], hang_after_s=o.hang_after_s if "nccl_hang" in o.triggers else None,
                                      quiet_after_s=o.quiet_after_s if "quiet" in o.triggers else None)
            events = open_table(session.bpf, "events", schema.HOST_EVENT.dtype)
            names = open_table(session.bpf, "names", schema.HOST_NAME.dtype)
            if session.stacks is not None:
                window.stacks = follow(session.stacks)
            writer.start()
            self.say(f"Recording every process's calls ({len(session.libraries())} libraries so far), keeping the "
                     f"last {o.window_s:g} s or {o.window_bytes / 2**20:g} MiB in memory; `pasta-trace dump` "
                     f"(socket {o.socket}) or SIGUSR1 (PID {os.getpid()}) writes them under {o.out_dir}. "
                     "Ctrl-C to end.")
            self._loop(session, events, names, window, control)
        finally:
            self._jobs.put(None)
            if writer.is_alive():
                writer.join()  # dumps asked for before the end are written
            control.close()
            if server is not None:
                server.close()
            for ring in (events, names):
                if ring is not None:
                    ring.close()
            session.detach()
            for sig, handler in old.items():
                signal.signal(sig, handler)
        suppressed = sum(self._debounce.suppressed.values())
        self.say(f"stopped; {len(self.dumps)} dump{'s' if len(self.dumps) != 1 else ''} written"
                 + (f", {suppressed} trigger{'s' if suppressed != 1 else ''} suppressed (--debounce)" if suppressed
                    else ""))
        return 0

    def _on_signal(self, sig: int, _frame: object) -> None:
        if sig == signal.SIGUSR1:
            self._usr1 = True
        else:
            self._stop = True

    def _loop(self, session, events, names, window: Window, control: ControlSocket) -> None:
        boost_drain_thread()
        # each drain's records, and each segment the window closes, land in memory freed by the ones before
        # (what it keeps stays bounded by the window's peak): new pages cost more than the rest at 100k/s
        keep_freed_memory()
        wake = Pacer(session.watch_fd, control.fileno(), held=ring_records(events))
        if session.stacks is not None:  # a new stack is read at once, while its code objects exist
            wake.register(session.stacks.fd)
        next_checkpoint = next_forget = 0.0
        while not self._stop:
            self._drain(session, events, names, window)
            self._triggered(session, events, names, window)
            if wake.watch_due():  # a stop, an exec, a fork or an exit waiting, or WATCH_S passed (pacing)
                session.poll(RESCAN_S)
            now = time.monotonic()
            if now >= next_checkpoint:
                next_checkpoint = now + CHECKPOINT_S
                lost = session.lost()
                self._checkpoint(lost)
                if self.metrics is not None:
                    self.metrics.update(lost, window)
            if now >= next_forget:
                # the daemon runs for weeks: what it keeps of processes is bounded by those alive or in the window
                next_forget = now + FORGET_S
                window.forget_names(lambda pid: os.path.exists(f"/proc/{pid}"))
                for pid in session.forget_exited(window.held_pids()):
                    if session.stacks is not None:
                        session.stacks.status.pop(pid, None)
            for req in control.accept():
                self._dump(session, events, names, window, "demand",
                           f"pasta-trace dump from uid {req.uid} (PID {req.pid})", req.pid_filter, req)
            if self._usr1:
                self._usr1 = False
                self._dump(session, events, names, window, "signal", "SIGUSR1", None, None)
            wake.wait(wake.tick(window.drained))
        # the calls made before the end may fire yet; the triggers fired are written with what came until now
        self._drain(session, events, names, window)
        for firing in self._triggers.poll(time.clock_gettime_ns(time.CLOCK_MONOTONIC)):
            self._fire(firing)
        for _, firing, fired in self._pending:
            self._dump(session, events, names, window, firing.kind, firing.cause, firing.pid, None, (firing, fired))
        self._pending.clear()

    def _triggered(self, session, events, names, window: Window) -> None:
        """Fire what the triggers found since the last drain, and take the dumps due."""
        for firing in self._triggers.poll(time.clock_gettime_ns(time.CLOCK_MONOTONIC)):
            self._fire(firing)
        now = time.monotonic()
        while self._pending and self._pending[0][0] <= now:
            _, firing, fired = self._pending.pop(0)
            self._dump(session, events, names, window, firing.kind, firing.cause, firing.pid, None, (firing, fired))

    def _fire(self, firing: Firing) -> None:
        """Every automatic trigger goes through here: debounced per cause and process, then its dump is
        taken after_s later."""
        fired = mf.ClockSample.now()
        if self.metrics is not None:  # pasta_triggers_total: every trigger fired, its dump debounced or not
            self.metrics.triggered(firing.kind, firing.pid)
        if firing.kind not in self.opts.triggers:  # --triggers left it out: counted, never dumped
            if self.opts.verbose:
                self.say(f"trigger {firing.kind} (not in --triggers: no dump): {firing.cause}")
            return
        admitted = self._debounce.admit(firing.kind, firing.pid, fired.mono_before_ns, firing.repeats)
        if self.opts.verbose and (firing.repeats or not admitted):
            again = firing.repeats + (not admitted)
            self.say(f"trigger {firing.kind} suppressed {again} time{'s' if again != 1 else ''} (one dump per "
                     f"{self.opts.debounce_s:g} s per process; {self._debounce.suppressed[firing.kind]} so far): "
                     f"{firing.cause}")
        if not admitted:
            return
        self.say(f"trigger {firing.kind}: {firing.cause}; dumping in {self.opts.after_s:g} s")
        self._pending.append((time.monotonic() + self.opts.after_s, firing, fired))

    def _drain(self, session, events, names, window: Window) -> None:
        if session.stacks is not None:  # first: a stack is symbolized while its process is alive
            session.stacks.drain()
        recs = events.drain()
        window.add(recs)
        if self._triggers is not None:
            self._triggers.note(recs)
        if recs.size:
            session.seen(distinct(recs["pid"]).tolist())
            session.seen_launches(recs)
        named = names.drain()
        window.add_names(named)
        if self.metrics is not None:
            self.metrics.add_names(named)  # first: a fold that add() starts names these launches
            self.metrics.add(recs)

    def _checkpoint(self, lost: dict[str, int]) -> None:
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        self._checkpoints.append((now, lost))
        # one before the window's start is kept: the base of a dump's counts
        horizon = now - int((self.opts.window_s + self.opts.after_s + WINDOW_SLACK_S) * 1e9)
        while len(self._checkpoints) > 1 and self._checkpoints[1][0] <= horizon:
            self._checkpoints.popleft()

    def _lost_since(self, start_ns: int, now: dict[str, int]) -> dict[str, int]:
        base = self._checkpoints[0][1] if self._checkpoints else {}
        for ts, lost in self._checkpoints:
            if ts <= start_ns:
                base = lost
        return {k: n - base.get(k, 0) for k, n in now.items()}

    def _dump(self, session, events, names, window: Window, kind: str, cause: str, pid: int | None,
              req: Request | None, fired: tuple[Firing, mf.ClockSample] | None = None) -> None:
        """Take the snapshot now (what the probes wrote until this moment included); the dump thread writes it.
        ``fired``: an automatic trigger and when it fired (every process is dumped; ``pid`` is the trigger's)."""
        self._drain(session, events, names, window)
        at = mf.ClockSample.now()
        if fired is None and self.metrics is not None:  # an automatic trigger was counted when it fired
            self.metrics.triggered(kind, pid)
        processes, libraries, entries = session.tables()
        o = self.opts
        snap = window.snapshot(pid if fired is None else None)
        since = (fired[1] if fired is not None else at).mono_before_ns - int(o.window_s * 1e9)
        tables = Tables(o.command_line, list(API_NAMES), processes, libraries, entries, o.buffer_pages,
                        o.window_s, o.window_bytes, self._lost_since(since, session.lost()),
                        stacks=stacks_manifest(session.stacks, snap.pids))
        tables.maps, tables.build_ids = session.saved_maps(snap.pids)
        trigger = Trigger(kind, cause, at, pid) if fired is None else \
            Trigger(kind, cause, at, pid, fired=fired[1], details=fired[0].details)
        self._jobs.put(_Job(snap, trigger, tables, req))

    def _write_dumps(self) -> None:
        owner = invoking_user()
        while (job := self._jobs.get()) is not None:
            try:
                done = write_dump(self.opts.out_dir, job.snap, job.trigger, job.tables, owner)
            except Exception as e:  # noqa: BLE001 - a failed dump is reported; the daemon goes on recording
                why = e.one_line() if hasattr(e, "one_line") else f"{type(e).__name__}: {e}"
                self.say(f"error: the {job.trigger.kind} dump failed: {why}")
                if job.request is not None:
                    job.request.reply({"error": f"failed to write the dump: {why}"})
                continue
            self.dumps.append(done)
            self.say(f"Wrote {done.path}: {done.events:,} events ({done.dropped:,} older dropped), "
                     f"{job.trigger.cause}")
            if job.request is not None:
                job.request.reply({"dir": str(done.path), "events": done.events, "dropped": done.dropped})
            try:
                for name in prune(self.opts.out_dir, self.opts.keep, self.opts.keep_bytes):
                    self.say(f"removed {self.opts.out_dir / name} (retention)")
            except OSError as e:
                self.say(f"error: retention under {self.opts.out_dir}: {e.strerror or e}")
