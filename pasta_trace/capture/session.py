"""One capture from start to `Wrote DIR`: load the BPF program, attach, drain,
write, and finish cleanly on Ctrl-C, the duration, or the end of the traced
processes.

Threads: the main thread drains the rings every POLL_INTERVAL_S and handles
late-loaded libraries; the writer's thread decodes and writes Parquet, so a
slow flush never keeps the rings from being drained.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import polars as pl

from .. import schema
from ..errors import PastaError
from . import checks, discovery, manifest as mf
from .late_load import LateLoadWatcher, OpenedLibrary, discover_text
from ..safe_output import OutputDir, invoking_user
from .launch import HeldCommand
from .processes import ProcessTable
from .ringbuf import open_table
from .writer import CaptureWriter

POLL_INTERVAL_S = 0.01
RESCAN_INTERVAL_S = 1.0
DEFAULT_BUFFER_PAGES = 4096  # 16 MiB: ~115k events, ~0.1 s of a 1 M calls/s flood
NAMES_PAGES = 64

#: files a capture writes; --force removes these (and only these) first
CAPTURE_FILES = ("manifest.json", "events-*.parquet", "names.parquet", "processes.parquet",
                 "libraries.parquet", "aggregate.parquet", "device")


@dataclass
class Options:
    mode: str  # pid | system | launch
    out_dir: Path
    command_line: list[str]
    pids: list[int] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    duration: float | None = None
    force: bool = False
    buffer_pages: int = DEFAULT_BUFFER_PAGES
    aggregate: bool = False
    verbose: bool = False
    device: str | None = None


@dataclass
class Result:
    out_dir: Path
    manifest: mf.Manifest
    lost: tuple[int, int, int]
    by_kind: dict[str, int]
    events: int
    names: pl.DataFrame
    exit_code: int | None = None
    messages: list[str] = field(default_factory=list)


def default_out_dir() -> Path:
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", socket.gethostname())
    return Path(f"pasta-{host}-{time.strftime('%Y%m%dT%H%M%S')}")


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent has exited already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def check_pids(pids: list[int]) -> None:
    for pid in pids:
        if pid <= 0 or not Path(f"/proc/{pid}").is_dir():
            raise PastaError(f"no such process: {pid}")


def launch_candidates(env: dict[str, str]) -> list[discovery.Library]:
    """Traced library files a launched command can load by name: those in
    LD_LIBRARY_PATH and in the ld.so cache (others are caught when opened)."""
    paths: list[str] = []
    for d in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        p = Path(d)
        if p.is_dir():
            paths += [str(f) for f in sorted(p.iterdir()) if discovery.family_of(f.name)]
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if target and discovery.family_of(name.split(" ")[0]):
            paths.append(target)
    libs: dict[tuple[int, int], discovery.Library] = {}
    for p in paths:
        try:
            lib = discovery.resolve_library_file(p)
        except OSError:
            continue
        if lib is not None:
            libs.setdefault(lib.key, lib)
    return list(libs.values())


class Session:
    def __init__(self, opts: Options, *, say: Callable[[str], None], status: Callable[[str], None] | None = None):
        self.opts = opts
        self.say = say
        self.status = status
        self.owner = invoking_user()
        self.processes = ProcessTable()
        self.attached: dict[tuple[int, int], mf.LibraryEntry] = {}
        self.library_rows: list[dict] = []
        self.notes: list[str] = []
        self._stop = False
        self._traced_pids: set[int] = set(opts.pids)
        self._seen_pids: set[int] = set()
        self._last_rescan = 0.0
        self.watcher: LateLoadWatcher | None = None
        self._maps: dict[int, str] = {}
        self._recent_pids: set[int] = set()

    # ------------------------------------------------------------------ setup

    def _load_bpf(self):
        from ..probes import catalog, program

        bcc = checks.import_bcc()
        self.apis = catalog.APIS
        text = program.build_bpf_text(
            ring_pages=self.opts.buffer_pages, names_pages=NAMES_PAGES,
            aggregate=self.opts.aggregate, filter_pids=self.opts.mode != "system",
        ) + discover_text(filter_pids=self.opts.mode != "system")
        try:
            return bcc.BPF(text=text)
        except Exception as e:  # noqa: BLE001 - BCC raises bare Exception
            raise PastaError(f"the BPF program did not load: {str(e).splitlines()[0]}",
                             hint="run `pasta-trace doctor`") from None

    def attach(self, lib: discovery.Library | OpenedLibrary, family: str | None = None) -> mf.LibraryEntry | None:
        """Attach the probes to a library file unless its inode already has them."""
        from ..probes import attach as probe_attach, elf

        key = (lib.dev, lib.inode)
        if key in self.attached:
            return None
        fam = family or discovery.family_of(lib.attach_path) or discovery.family_of(getattr(lib, "path", ""))
        if fam is None:
            return None
        res = probe_attach.attach_library(self.bpf, lib.attach_path, fam)
        if not res.attached and not os.path.exists(lib.attach_path):
            return None  # the process exited between the scan and the attach: nothing to trace
        try:
            bid = elf.build_id(lib.attach_path)
        except Exception:  # noqa: BLE001 - a damaged ELF: no build-id, still traced
            bid = None
        path = getattr(lib, "ns_path", None) or lib.path
        entry = mf.LibraryEntry(
            path=path, attach_path=lib.attach_path, dev=lib.dev, inode=lib.inode, build_id=bid, family=fam,
            symbols_attached=res.attached, symbols_missing=res.missing, placements=res.placements,
            errors=res.errors,
        )
        self.attached[key] = entry
        self.library_rows.append({
            "path": path, "attach_path": lib.attach_path, "dev": lib.dev, "inode": lib.inode, "build_id": bid,
            "family": fam, "symbols_attached": len(res.attached), "symbols_missing": len(res.missing),
        })
        if self.watcher is not None:
            self.watcher.add_known(path)
        if self.opts.verbose:
            self.say(probe_attach.describe_missing(res, None))
            if res.placements:
                moved = {s: o for s, o in res.placements.items() if o}
                self.say(f"  probes past the symbol (offset): {moved}" if moved else "  all probes at the symbols")
        if not res.attached:
            self.notes.append(f"{path}: no probe attached ({'; '.join(res.errors[:3]) or 'no probed symbol'})")
            self.say(f"warning: {self.notes[-1]}")
        return entry

    # ------------------------------------------------------------------ callbacks from the discover program

    def _on_library(self, lib: OpenedLibrary) -> None:
        entry = self.attach(lib)
        self.processes.add(lib.pid)
        self._save_maps([lib.pid])
        if entry is not None:
            self.say(f"PID {lib.pid} loaded {lib.ns_path}: attached {len(entry.symbols_attached)} probes "
                     "before its first call")

    def _on_fork(self, pid: int, ppid: int, ts: int) -> None:
        if pid != ppid:
            self._traced_pids.add(pid)
            self.processes.add(pid)

    def _on_exec(self, pid: int, cgroup_id: int) -> None:
        if pid in self.processes:
            self.processes.refresh(pid, cgroup_id=cgroup_id)
        if pid in self._traced_pids:
            self._save_maps([pid])

    def _on_exit(self, pid: int, ts: int) -> None:
        if pid in self.processes:
            self.processes.exited(pid, ts)
        if pid in self._traced_pids and self.opts.mode == "pid":
            self.say(f"PID {pid} exited; still tracing the others" if self._alive_pids() else f"PID {pid} exited")

    def _alive_pids(self) -> list[int]:
        return [p for p in self.opts.pids if alive(p)]

    # ------------------------------------------------------------------ run

    def check(self) -> None:
        """Everything that can refuse the capture before anything is loaded."""
        checks.import_bcc()
        checks.check_kernel()
        checks.check_privileges()
        if self.opts.mode == "pid":
            check_pids(self.opts.pids)

    def setup(self, env: dict[str, str] | None = None) -> HeldCommand | None:
        """Load the BPF program and attach to the libraries of the chosen
        processes (call check() first).  In launch mode, returns the command,
        started and held before exec (release() it once ready)."""
        opts = self.opts
        self.bpf = self._load_bpf()
        self.watcher = LateLoadWatcher(
            self.bpf, on_library=self._on_library, on_fork=self._on_fork, on_exec=self._on_exec, on_exit=self._on_exit
        )
        if opts.mode == "launch":
            env = env if env is not None else dict(os.environ)
            held = HeldCommand(opts.command, env)
            self._traced_pids.add(held.pid)
            self._filter(held.pid)
            try:
                for lib in launch_candidates(env):
                    self.attach(lib)
            except BaseException:
                held.abandon()
                raise
            waiting = "" if self.attached else " (no libcuda/libamdhip64 found yet: attaching when it loads one)"
            self._banner(f"command {' '.join(opts.command)} (PID {held.pid}){waiting}")
            return held
        if opts.mode == "pid":
            for pid in opts.pids:
                self._filter(pid)
                self._attach_pid(pid, announce=True)
            self._banner("PID " + ",".join(map(str, opts.pids)))
            for pid in opts.pids:
                if not alive(pid):  # exited while the program compiled: no exit event will come
                    self._on_exit(pid, time.clock_gettime_ns(time.CLOCK_MONOTONIC))
        else:
            for found in discovery.scan_all(skip={os.getpid()}):
                for lib in found.traced:
                    self.attach(lib)
                self.processes.add(found.pid)
                self._seen_pids.add(found.pid)
            self._last_rescan = time.monotonic()
            self._banner("every process")
        return None

    def run(self) -> Result:
        opts = self.opts
        self.check()
        out = self.out = OutputDir.claim(opts.out_dir, force=opts.force, clean=CAPTURE_FILES)
        held = None
        try:
            env = dict(os.environ)
            device = None
            if opts.device:
                device = self._device_session()
                env.update(device.env())
            held = self.setup(env)
        except BaseException:
            out.abandon()
            raise
        # Ctrl-C/SIGTERM only ask the loop to stop, until the manifest is complete:
        # a second Ctrl-C while we finish must not lose what was captured.
        old_handlers = {sig: signal.signal(sig, self._request_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            writer = CaptureWriter(out, [a.symbol for a in self.apis])
            manifest = mf.Manifest(command_line=opts.command_line, mode=opts.mode, start=mf.ClockSample.now(),
                                   aggregate=opts.aggregate, buffer_pages=opts.buffer_pages)
            manifest.libraries = list(self.attached.values())
            manifest.pids = sorted(self._traced_pids)
            manifest.write(out, complete=False)
            if held is not None:
                held.release()
                self.processes.add(held.pid)
            exit_code = self._loop(writer, held)
            result = self._finish(writer, manifest, held, exit_code, device)
        except BaseException:
            if held is not None and not held.released:
                held.abandon()
            for sig, handler in old_handlers.items():
                signal.signal(sig, handler)
            raise
        # Everything is written; what remains is printing the summary and exiting.
        # Python resets its handlers to the default while it shuts down, so a late
        # Ctrl-C would kill us mid-exit: ignore it instead (ignored stays ignored).
        for sig in old_handlers:
            signal.signal(sig, signal.SIG_IGN)
        return result

    def _device_session(self):
        try:
            from ..device.inject import DeviceSession
        except ImportError as e:
            raise PastaError(f"--device {self.opts.device}: the device side is not installed ({e})") from None
        return DeviceSession(self.opts.device, self.out, command=self.opts.command)

    def _filter(self, pid: int) -> None:
        t = self.bpf["pid_filter"]
        t[t.Key(pid)] = t.Leaf(1)

    def _attach_pid(self, pid: int, announce: bool) -> None:
        try:
            found = discovery.scan_pid(pid)
        except OSError:
            raise PastaError(f"no such process: {pid}") from None
        self.processes.add(pid)
        for lib in found.traced:
            self.attach(lib)
        if announce and not found.traced:
            others = f" (it maps {', '.join(os.path.basename(p) for p in found.other_gpu)})" if found.other_gpu else ""
            self.say(f"PID {pid} has not loaded libcuda.so or libamdhip64.so yet{others}: waiting for it to load "
                     "one; its first call will be traced")

    def _banner(self, who: str) -> None:
        nfun = sum(len(e.symbols_attached) for e in self.attached.values())
        what = "aggregating" if self.opts.aggregate else "Tracing"
        self.say(f"{what} {nfun} functions in {len(self.attached)} libraries of {who}... Ctrl-C to end.")

    def _request_stop(self, *_: object) -> None:
        self._stop = True

    def _loop(self, writer: CaptureWriter, held: HeldCommand | None) -> int | None:
        events = open_table(self.bpf, "events", schema.HOST_EVENT.dtype)
        names = open_table(self.bpf, "names", schema.HOST_NAME.dtype)
        boost_drain_thread()
        deadline = time.monotonic() + self.opts.duration if self.opts.duration else None
        exit_code = None
        last_status = 0.0
        while not self._stop:
            self._drain(writer, events, names)
            self.watcher.poll()
            now = time.monotonic()
            if writer.due():
                writer.flush_async()
                self._write_tables(writer)
                self._save_maps(self._recent_pids)
                self._recent_pids.clear()
            if self.opts.mode == "system" and now - self._last_rescan >= RESCAN_INTERVAL_S:
                self._rescan()
            if self.status and now - last_status >= 0.25:
                last_status = now
                self.status(f"{writer.events:,} events, {self.lost()[0] + self.lost()[1]:,} lost")
            if deadline is not None and now >= deadline:
                break
            if held is not None and (code := held.poll()) is not None:
                exit_code = code
                break
            if self.opts.mode == "pid" and not self._alive_pids():
                self.say("all traced processes exited")
                break
            time.sleep(POLL_INTERVAL_S)
        # what the probes wrote before we stopped
        self._drain(writer, events, names)
        self.watcher.disarm()
        self._rings = (events, names)
        return exit_code

    def _drain(self, writer: CaptureWriter, events, names) -> None:
        recs = events.drain()
        if recs.size:
            writer.add_events(recs)
            pids = np.unique(recs["pid"]).tolist()  # a handful per drain
            self._recent_pids.update(pids)
            new = [p for p in pids if p not in self._seen_pids]
            self._save_maps(new)
            for pid in new:
                self._seen_pids.add(pid)
                self.processes.add(pid)
        writer.add_names(names.drain())

    def _rescan(self) -> None:
        self._last_rescan = time.monotonic()
        for pid in discovery.all_pids():
            if pid in self._seen_pids or pid == os.getpid():
                continue
            self._seen_pids.add(pid)
            try:
                found = discovery.scan_pid(pid)
            except OSError:
                continue
            for lib in found.traced:
                if self.attach(lib) is not None:
                    self.say(f"new library {lib.path} (PID {pid}): attached")
            if found.traced:
                self.processes.add(pid)

    def _write_tables(self, writer: CaptureWriter) -> None:
        if self.processes.changed:
            self.processes.changed = False
            writer.write_frame(writer.dir / "processes.parquet", self.processes.frame())
        if self.library_rows and len(self.library_rows) != getattr(self, "_written_libs", 0):
            self._written_libs = len(self.library_rows)
            writer.write_frame(writer.dir / "libraries.parquet",
                               pl.DataFrame(self.library_rows, schema=schema.LIBRARIES_SCHEMA))

    def lost(self) -> tuple[int, int, int]:
        t = self.bpf["lost"]
        return tuple(int(sum(t[t.Key(i)])) for i in range(3))  # type: ignore[return-value]

    def _aggregate(self, writer: CaptureWriter) -> None:
        from .decode import aggregate_frame

        items = list(self.bpf["agg"].items())  # once, at the end: at most PT_AGG_MAX rows
        keys = np.frombuffer(b"".join(bytes(k) for k, _ in items), schema.AGG_KEY.dtype)
        vals = np.frombuffer(b"".join(bytes(v) for _, v in items), schema.AGG_VAL.dtype)
        writer.write_frame(writer.dir / "aggregate.parquet",
                           aggregate_frame(keys, vals, [a.symbol for a in self.apis]))

    def _finish(self, writer, manifest: mf.Manifest, held, exit_code, device) -> Result:
        writer.flush_async()
        writer.close()
        if self.opts.aggregate:
            self._aggregate(writer)
        for pid, comm in writer.pids_and_comms():
            self.processes.add_minimal(pid, comm)
        for pid in list(self._traced_pids):
            self.processes.add(pid)
        names = writer.names_table(self._offline_names(writer))
        writer.write_frame(writer.dir / "names.parquet", names)
        self._write_tables(writer)
        lost = self.lost()
        end = mf.ClockSample.now()
        manifest.end = end
        manifest.libraries = list(self.attached.values())
        manifest.pids = sorted(self._traced_pids)
        manifest.notes = self.notes
        by_kind = {k: int(n) for k, n in zip(schema.KIND_NAMES, writer.by_kind.tolist())}
        manifest.counts = mf.counts(events=writer.events, names=writer.names, lost=lost, by_kind=by_kind)
        if held is not None:
            manifest.launched = {"argv": self.opts.command, "pid": held.pid, "exit_code": exit_code}
        if device is not None:
            manifest.device_files = [str(p.relative_to(self.opts.out_dir)) for p in device.finish()]
        for ring in self._rings:
            ring.close()
        self.detach()
        manifest.write(self.out, complete=True)
        self.out.hand_over(self.owner, also=[f.name for f in writer.event_files])
        self.out.close()
        return Result(self.opts.out_dir, manifest, lost, by_kind, writer.events, names, exit_code)

    def _offline_names(self, writer: CaptureWriter) -> pl.DataFrame | None:
        """Names for launch handles no run-time lookup named: host stubs found
        in the mapped binaries (capture.symbolize).  Processes that have exited
        are read from the maps saved while they ran."""
        from . import symbolize

        with tempfile.TemporaryDirectory(prefix="pasta-maps-") as tmp:
            for pid, text in self._maps.items():
                d = Path(tmp) / str(pid)
                d.mkdir()
                (d / "maps").write_text(text)
                alive = Path(f"/proc/{pid}/root").exists()
                os.symlink(f"/proc/{pid}/root" if alive else "/", d / "root")
            try:
                return symbolize.name_capture(writer.dir, proc=Path(tmp))
            except Exception as e:  # noqa: BLE001 - naming is best effort; the events are safe
                self.notes.append(f"offline kernel naming failed: {type(e).__name__}: {e}")
                return None

    def _save_maps(self, pids) -> None:
        """Keep each traced process's latest maps: offline naming needs them
        after the process has gone."""
        for pid in pids:
            try:
                self._maps[pid] = Path(f"/proc/{pid}/maps").read_text()
            except OSError:
                pass

    def detach(self) -> None:
        """Remove the probes without making the user wait for the kernel.

        Closing a uprobe's perf event waits for RCU grace periods: 0.1-0.25 s
        per probe on our kernels, a minute for a few hundred probes.  A
        detached grandchild inherits the descriptors and closes them; our own
        copies then close at once.  (BCC's own cleanup would also try to
        detach through tracefs's uprobe_events, which fails where tracefs is
        not mounted.)"""
        if self.watcher is not None:
            self.watcher.close()  # disarms first: nothing stays stopped
        fds = list(self.bpf.uprobe_fds.values())
        self.bpf.uprobe_fds.clear()
        if fds:
            close_in_background(fds)
        self.bpf.cleanup()


#: Nice value of the draining thread: it sleeps almost all the time, and when it
#: wakes it must win the CPU from the traced threads or the ring overflows.
DRAIN_NICE = -10


def boost_drain_thread() -> None:
    """Raise the calling thread's priority (Linux nice values are per thread)."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, DRAIN_NICE)
    except OSError:
        pass  # without CAP_SYS_NICE: normal priority, a larger --buffer-pages helps instead


def close_in_background(fds: list[int]) -> None:
    """Close ``fds`` in a detached process (double fork: no zombie, no
    terminal), then drop this process's copies."""
    child = os.fork()
    if child == 0:
        try:
            if os.fork() == 0:
                os.setsid()
                # keep only the uprobes: an inherited copy of anything else (the
                # discover tracepoints, the rings, the maps) would stay attached
                # for as long as the removal takes
                keep = set(fds)
                for name in os.listdir("/proc/self/fd"):
                    if int(name) not in keep and int(name) > 2:
                        try:
                            os.close(int(name))
                        except OSError:
                            pass
                devnull = os.open(os.devnull, os.O_RDWR)
                for std in (0, 1, 2):
                    os.dup2(devnull, std)
                with ThreadPoolExecutor(max_workers=16) as pool:
                    list(pool.map(os.close, fds))
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    for fd in fds:
        os.close(fd)
