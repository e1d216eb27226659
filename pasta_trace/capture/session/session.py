"""One capture from start to `Wrote DIR`: check, load and attach
(probe_set), follow the processes (tracker), drain (drain), and finish
(finish) cleanly on Ctrl-C, the duration, or the end of the traced processes.

Threads: the main thread drains the rings every POLL_INTERVAL_S and handles
late-loaded libraries; the writer's thread feeds the events writer process,
so a slow flush never keeps the rings from being drained.
"""

from __future__ import annotations

import os
import signal
from typing import Callable

import numpy as np
import polars as pl

from ... import schema
from ...errors import PastaError
from ...safe_output import OutputDir, invoking_user
from . import checks
from ..output import manifest as mf
from ..naming.attach_names import AttachNamer
from ..bpf.bpf_maps import read_aggregate, read_lost
from ..output.drain import DrainLoop
from .finish import Finisher
from ..procs.late_load import LateLoadWatcher
from ..procs.launch import HeldCommand, check_command
from ..stacks.native_collector import NativeCollector
from .options import CAPTURE_FILES, Options, Result
from ..procs.finalize_probe import FinalizeProbes
from ..bpf.probe_set import ProbeSet, load_program
from ..stacks.stack_collector import StackCollector, write_stacks
from ..procs.targets import check_pids, check_readable, launch_candidates
from ..procs.tracker import RESCAN_INTERVAL_S, ProcessTracker
from ..output.writer import CaptureWriter


class Session:
    """``check()`` then ``run()`` records a capture; ``top`` uses ``check()``,
    ``setup()``, ``poll()``, ``libraries()``, ``lost()`` and ``detach()``, and
    drains the events ring itself."""

    def __init__(self, opts: Options, *, say: Callable[[str], None], status: Callable[[str], None] | None = None,
                 banner: bool = True):
        self.opts = opts
        self.say = say
        self.status = status
        self.banner = banner  # False: the caller says what it watches (top)
        self.owner = invoking_user()
        self._stop = False
        self.bpf = None
        self._watcher: LateLoadWatcher | None = None
        self._probes: ProbeSet | None = None
        self._tracker: ProcessTracker | None = None
        self._drain: DrainLoop | None = None
        self._out: OutputDir | None = None
        self._stacks: StackCollector | None = None
        self._native: NativeCollector | None = None
        self._writer: CaptureWriter | None = None
        self._device = None
        self._finalize: FinalizeProbes | None = None
        #: told (pid, wait status) of each traced process's exit, when set before setup() (the daemon)
        self.on_exit_status: Callable[[int, int], None] = lambda pid, exit_code: None

    def check(self) -> None:
        """Everything that can refuse the capture before anything is loaded:
        what to trace first (a wrong PID or command is the likelier mistake),
        then what the machine and our privileges allow."""
        if self.opts.mode == "pid":
            check_pids(self.opts.pids)
        elif self.opts.mode == "launch":
            check_command(self.opts.command, dict(os.environ))
        checks.import_bcc()
        checks.check_kernel()
        checks.check_privileges()
        if self.opts.mode == "pid":
            check_readable(self.opts.pids)
            if self.opts.device == "cupti" and self.opts.aggregate:
                from ...device.attach.collector import check_aggregate

                check_aggregate(self.opts.pids)

    def setup(self, env: dict[str, str] | None = None) -> HeldCommand | None:
        """Load the BPF program and attach to the libraries of the chosen
        processes (call check() first).  In launch mode, returns the command,
        started and held before exec (release() it once ready)."""
        self.say("compiling the BPF program...")
        self.bpf = load_program(self.opts, say=self.say)
        try:
            return self._setup(env)
        except BaseException:
            self.detach()  # probes attached so far go now, not in BCC's exit handler (ProbeSet.detach)
            raise

    def _setup(self, env: dict[str, str] | None) -> HeldCommand | None:
        opts = self.opts
        if opts.stack_depth_loaded is not None:
            self._stacks = StackCollector(self.bpf, opts.stack_depth_loaded, say=self.say, verbose=opts.verbose)
            # tensors a program leaves are freed when its interpreter finalizes: marked at_exit
            self._finalize = FinalizeProbes(self.bpf, say=self.say, verbose=opts.verbose)
            self._stacks.on_python = self._finalize.watch
        if opts.native_stacks_loaded is not None:
            self._native = NativeCollector(self.bpf, opts.native_stacks_loaded, python=self._stacks, say=self.say,
                                           verbose=opts.verbose, saved_maps=self._saved_maps)
        self._watcher = LateLoadWatcher(self.bpf, on_library=self._on_library, on_fork=self._on_fork,
                                        on_exec=self._on_exec, on_exit=self._on_exit, on_warning=self._warn,
                                        on_mapped=self._on_library, on_map=self._on_map,
                                        on_finalizing=self._stacks.drain if self._stacks is not None else lambda: None,
                                        on_exit_status=self.on_exit_status)
        self._probes = ProbeSet(self.bpf, known=self._watcher.add_known, say=self.say, verbose=opts.verbose)
        self._tracker = ProcessTracker(self._probes, mode=opts.mode, pids=opts.pids, say=self.say,
                                       stacks=self._stacks, native=self._native)
        if opts.mode == "launch":
            env = env if env is not None else dict(os.environ)
            held = HeldCommand(opts.command, env)
            self._tracker.launched(held.pid)
            try:
                candidates = launch_candidates(env, opts.command)
                self.say(f"attaching probes to {_libraries(len(candidates))} the command can load...")
                for lib in candidates:
                    self._probes.attach(lib)
            except BaseException:
                held.abandon()
                raise
            # it has loaded none of them yet: count what is ready, not what it uses
            ready = (f"{self._probes.functions} functions ready in {_libraries(len(self._probes.attached))}"
                     if self._probes.attached
                     else "no libcuda/libcudart/libamdhip64/libc10/libnccl found yet: attaching when it loads one")
            self._watcher.arm_mappings()
            self._banner(f"command {' '.join(opts.command)} (PID {held.pid}): {ready}")
            return held
        who = "PID " + ",".join(map(str, opts.pids)) if opts.mode == "pid" else "every process"
        self.say(f"attaching probes to the libraries of {who}...")
        if opts.mode == "pid":
            self._tracker.start_pids()
        else:
            self._tracker.start_system()
        self._watcher.arm_mappings()  # the drain loop comes next: a process stopped now waits little
        self._banner(f"{self._probes.functions} functions in {_libraries(len(self._probes.attached))} of {who}")
        return None

    def _saved_maps(self, pid: int) -> str | None:
        """The maps the tracker saved for ``pid`` (native stacks of a process that has exited)."""
        return self._tracker.maps.get(pid) if self._tracker is not None else None

    # the discover program's callbacks go to the tracker, which exists only after setup()
    def _on_library(self, lib) -> bool:
        return self._tracker.on_library(lib)

    def _on_fork(self, pid: int, ppid: int, ts: int) -> None:
        self._tracker.on_fork(pid, ppid, ts)

    def _on_exec(self, pid: int, cgroup_id: int) -> None:
        self._tracker.on_exec(pid, cgroup_id)

    def _on_exit(self, pid: int, ts: int) -> None:
        self._tracker.on_exit(pid, ts)

    def _on_map(self, rec) -> None:
        self._tracker.on_map(rec)

    def _warn(self, msg: str) -> None:
        self._probes.notes.append(msg)
        self.say(f"warning: {msg}")

    def _banner(self, what: str) -> None:
        if not self.banner:
            return
        verb = "Aggregating" if self.opts.aggregate else "Tracing"
        self.say(f"{verb} {what}... Ctrl-C to end.")

    # ------------------------------------------------------------------ live views (top)

    def poll(self, rescan_s: float = RESCAN_INTERVAL_S) -> None:
        """Handle late-loaded libraries, forks and exits (attach, resume), and
        (-a) look for processes that appeared since the last scan, every ``rescan_s``."""
        self._watcher.poll()
        self._tracker.rescan_if_due(rescan_s)

    @property
    def watch_fd(self) -> int | None:
        """The discover ring's descriptor: readable while it holds a record; a stop or an exec wakes a poll."""
        return self._watcher.wake_fd if self._watcher is not None else None

    def aggregate(self) -> tuple[np.ndarray, np.ndarray]:
        """The in-kernel aggregation so far (--aggregate): AGG_KEY and AGG_VAL rows."""
        return read_aggregate(self.bpf)

    def libraries(self) -> list[str]:
        """The paths of the library files probed so far, in the order they were."""
        return [e.path for e in self._probes.attached.values()] if self._probes is not None else []

    def lost(self) -> dict[str, int]:
        """Every BPF loss counter so far, by name (schema.LOSSES)."""
        return read_lost(self.bpf)

    def seen(self, pids: list[int]) -> None:
        """PIDs of events the caller drained (the daemon): their processes join the process table."""
        self._tracker.seen_in_events(pids)

    def forget_exited(self, keep: set[int]) -> list[int]:
        """Forget the processes that have exited, but ``keep`` (ProcessTracker.forget_exited)."""
        return self._tracker.forget_exited(keep)

    @property
    def stacks(self) -> StackCollector | None:
        """The Python stack collector (None without stacks): a caller that drains the events drains it first."""
        return self._stacks

    def seen_launches(self, recs: np.ndarray) -> None:
        """Launches the caller drained: their processes' maps are read again where needed (offline naming)."""
        self._tracker.seen_launches(recs)

    def saved_maps(self, pids: set[int]) -> tuple[dict[int, str], dict[int, dict]]:
        """The maps saved for ``pids`` (the newest of each, read again now for those seen since the last
        call) and the build-ids of their files: offline naming reads them (capture.naming.symbolize)."""
        self._tracker.save_recent_maps()
        maps = self._tracker.maps
        return ({p: maps[p] for p in pids if p in maps},
                {p: dict(ids) for p in pids if (ids := self._tracker.build_ids.of_pid.get(p)) is not None})

    def tables(self) -> tuple[pl.DataFrame, pl.DataFrame, list[mf.LibraryEntry]]:
        """processes.parquet's and libraries.parquet's rows so far, and the manifest's library entries."""
        probes = self._probes
        return (self._tracker.processes.frame(), pl.DataFrame(probes.library_rows, schema=schema.LIBRARIES_SCHEMA),
                probes.entries())

    # ------------------------------------------------------------------ a whole capture

    def run(self) -> Result:
        opts = self.opts
        self.check()
        out = self._out = OutputDir.claim(opts.out_dir, force=opts.force, clean=CAPTURE_FILES)
        try:
            return self._record(out)
        finally:
            # the one way out of every error (the normal end closed them all in Finisher.finish)
            if out.fd >= 0:
                self._clean_up(out, self._writer, self._device)

    def _record(self, out: OutputDir) -> Result:
        opts = self.opts
        held = None
        try:
            env = dict(os.environ)
            if opts.device:
                self._device = self._device_session()
                env.update(self._device.env())
            held = self.setup(env)
            if opts.device and opts.mode == "pid":  # into the running processes, once their probes are on
                self._device.start(self._warn, self._watcher.poll)
        except BaseException:
            self._release_stops()
            raise
        device = self._device
        # Ctrl-C/SIGTERM only ask the loop to stop, until the manifest is complete:
        # a second Ctrl-C while we finish must not lose what was captured.
        old_handlers = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            from ...probes import catalog

            api_names = list(catalog.API_NAMES)
            writer = self._writer = CaptureWriter(out, api_names)
            self._watcher.own(writer.pid)
            writer.guard(self._watcher.guard_spec())  # a third watcher of our stops, with the guardians
            manifest = mf.Manifest(command_line=opts.command_line, mode=opts.mode, start=mf.ClockSample.now(),
                                   aggregate=opts.aggregate, buffer_pages=opts.buffer_pages, device=opts.device,
                                   aggregate_max=opts.aggregate_max if opts.aggregate else None)
            manifest.libraries = self._probes.entries()
            manifest.pids = sorted(self._tracker.traced_pids)
            manifest.write(out, complete=False)
            if held is not None:
                self._watcher.disown_elsewhere(held.pid)  # a system-wide tracer beside us traces it too
                held.release()
                self._tracker.processes.add(held.pid)
            namer = None if opts.aggregate else AttachNamer(api_names)
            self._drain = DrainLoop(self.bpf, writer, self._tracker, self._watcher,
                                    on_flush=lambda: self._on_flush(writer), say=self.say, status=self.status,
                                    stacks=self._stacks, native=self._native, namer=namer,
                                    on_events=device.seen if device is not None and opts.mode == "pid" else None)
            exit_code = self._drain.run(stop=lambda: self._stop, held=held, mode=opts.mode, duration=opts.duration)
            finisher = Finisher(opts, out, self.owner, self._probes, self._tracker, api_names, self._stacks,
                                self._native, say=self.say, known_full=lambda: self._watcher.known_full,
                                namer=namer)
            result = finisher.finish(writer, manifest, held, exit_code, device, self.detach)
        except BaseException:
            self._release_stops()  # an internal error: nothing may stay stopped
            if held is not None and not held.released:
                held.abandon()
            # our probes go now, not in BCC's exit handler (which detaches through
            # tracefs and raises where it is not mounted)
            self.detach()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            raise
        # Everything is written; what remains is printing the summary and exiting.
        # Python resets its handlers to the default while it shuts down, so a late
        # Ctrl-C would kill us mid-exit: ignore it instead (ignored stays ignored).
        for sig in old_handlers:
            signal.signal(sig, signal.SIG_IGN)
        return result

    def _clean_up(self, out: OutputDir, writer: CaptureWriter | None, device) -> None:
        """After an error: the events writer process ends (what it held is
        lost: the manifest stays complete: false), the device files come in and
        their staging directory goes, and the directory is the invoking
        user's (or, with nothing recorded, removed).  Each step is tried
        whatever the others did: the error itself is what the user must see."""
        steps = []
        if writer is not None:
            steps.append(writer.kill)
        if device is not None:
            steps.append(device.finish)
        if writer is not None:
            steps.append(lambda: out.hand_over(self.owner, also=_written_by_others(out)))
            steps.append(out.close)
        else:
            steps.append(out.abandon)
        for step in steps:
            try:
                step()
            except Exception:  # noqa: BLE001 - cleanup after a failure; see above
                pass
        if out.fd >= 0:
            out.close()

    def _on_flush(self, writer: CaptureWriter) -> None:
        self._tracker.write_processes(writer)
        self._probes.write_libraries(writer)
        self._tracker.save_recent_maps()
        if any(c is not None and c.rows.changed for c in (self._stacks, self._native)):
            write_stacks(writer, self._stacks, self._native)

    def _device_session(self):
        try:
            from ...device.inject import DeviceSession
        except ImportError as e:
            raise PastaError(f"--device {self.opts.device}: the device side is not installed ({e})") from None
        if self.opts.mode == "pid":
            from ...device.attach.collector import AttachedDevice

            return AttachedDevice(self._out, self.opts.pids, say=self.say, late=not self.opts.aggregate)
        return DeviceSession(self.opts.device, self._out, command=self.opts.command)

    def _release_stops(self) -> None:
        if self._watcher is not None:
            self._watcher.close()

    def _request_stop(self, *_: object) -> None:
        self._stop = True

    def detach(self) -> None:
        """Stop stopping processes (resuming any stopped), close the rings and
        remove the probes."""
        if self._watcher is not None:
            self._watcher.close()  # disarms first: nothing stays stopped
        if self._drain is not None:
            self._drain.close()
        if self._probes is not None:
            self._probes.detach()  # every uprobe of the program, the finalization probes too
        if self._finalize is not None:
            self._finalize.close()


def _written_by_others(out: OutputDir) -> list[str]:
    """Files of the directory that the events writer process made (OutputDir
    knows only those made through itself)."""
    return [n for n in os.listdir(out.fd) if not n.startswith(".") and n.endswith(".parquet")]


def _libraries(n: int) -> str:
    return f"{n} {'library' if n == 1 else 'libraries'}"
