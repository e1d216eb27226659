"""The end of a capture: the last flush, the aggregation map, names (run-time
and offline), the small tables, the complete manifest, and handing the
directory over to the invoking user.

On a full disk the capture still ends cleanly: the events files written
stay, what could not be written is counted (``lost_unwritten``) or noted (a
small table keeps its last version), and the room held aside since the
start (CaptureWriter) is given up so that the manifest is completed."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable

import polars as pl

from ... import schema
from ...safe_output import OutputDir
from ..output import manifest as mf
from ..bpf.bpf_maps import read_aggregate, read_lost, read_tallies
from ..naming.attach_names import AttachNamer
from ..procs.launch import HeldCommand
from .options import Options, Result
from ..stacks.native_collector import NativeCollector
from ..bpf.probe_set import ProbeSet
from ..stacks.stack_collector import StackCollector, write_stacks
from ..procs.tracker import ProcessTracker
from ..output.writer import CaptureWriter


class Finisher:
    def __init__(self, opts: Options, out: OutputDir, owner: tuple[int, int] | None, probes: ProbeSet,
                 tracker: ProcessTracker, api_names: list[str], stacks: StackCollector | None = None,
                 native: NativeCollector | None = None, say: Callable[[str], None] = lambda _msg: None,
                 known_full: Callable[[], int] = lambda: 0, namer: AttachNamer | None = None):
        self._stacks = stacks
        self._namer = namer
        self._native = native
        self._say = say
        self._known_full = known_full
        self._opts = opts
        self._out = out
        self._owner = owner
        self._probes = probes
        self._tracker = tracker
        self._api_names = api_names

    def finish(self, writer: CaptureWriter, manifest: mf.Manifest, held: HeldCommand | None,
               exit_code: int | None, device, detach) -> Result:
        """Write everything that is left; ``detach`` removes the probes once
        nothing more is read from the BPF maps."""
        what = "the in-kernel counts" if self._opts.aggregate else f"{writer.events:,} events"
        self._say(f"writing {what}, the names and the process table...")
        writer.flush_async()
        writer.close()
        bpf = self._probes.bpf
        if self._stacks is not None or self._native is not None:
            if self._native is not None:
                self._native.add_sources()
            for c in (self._native, self._stacks):
                if c is not None:
                    c.close()
            write_stacks(writer, self._stacks, self._native)
            manifest.stacks = self._stacks_manifest()
        if self._opts.aggregate:
            self._write_aggregate(writer, bpf)
        processes = self._tracker.processes
        for pid, comm in writer.pids_and_comms():
            processes.add_minimal(pid, comm)
        for pid in list(self._tracker.traced_pids):
            processes.add(pid)
        names = self._paired_names(writer, writer.names_table(self._offline_names(writer)))
        names = self._driver_object_names(names, manifest)
        writer.write_frame(writer.dir / "names.parquet", names)
        self._tracker.write_processes(writer)
        self._probes.write_libraries(writer)
        lost = read_lost(bpf)  # with the stack counters below: one read of each
        manifest.end = mf.ClockSample.now()
        manifest.libraries = self._probes.entries()
        manifest.pids = sorted(self._tracker.traced_pids)
        by_kind = {k: int(n) for k, n in zip(schema.KIND_NAMES, writer.by_kind.tolist())}
        lost |= {"lost_writer_behind": writer.lost_behind, "lost_unwritten": writer.unwritten,
                 "lost_writer_died": writer.died_unwritten, "lost_tracer_died": 0}
        stacks = None
        if self._stacks is not None or self._native is not None:
            stacks = {**(self._stacks.counts() if self._stacks else {}), **(self._native.counts() if self._native else {})}
        manifest.counts = mf.counts(events=writer.written, names=writer.names, lost=lost, by_kind=by_kind,
                                    known_full=self._known_full(), stacks=stacks, tallies=read_tallies(bpf))
        if held is not None:
            manifest.launched = {"argv": self._opts.command, "pid": held.pid, "exit_code": exit_code}
        if device is not None:
            manifest.device_files = [str(p.relative_to(self._opts.out_dir)) for p in device.finish()]
        self._say(f"removing {self._probes.functions} probes...")
        detach()  # its failure is a note (ProbeSet.detach): the capture stays complete
        write_error = writer.write_error or next(iter(writer.failed.values()), None)
        manifest.notes = [*self._probes.notes, *(f"{name} not written: {why} (its last version is kept)"
                                                  for name, why in writer.failed.items()),
                          *mf.FILE_PROBLEMS.take()]
        if writer.died is not None:
            manifest.notes.append(f"{writer.died} during the capture: the {writer.died_unwritten:,} events it had "
                                  "not written, and those drained after, are counted in lost_writer_died")
        if writer.held_peak_bytes * 4 >= writer.ring_bytes:
            manifest.notes.append(f"the events writer fell behind: up to {writer.held_peak_bytes / 2**20:.0f} MiB of "
                                  f"events waited in its {writer.ring_bytes / 2**20:.0f} MiB ring, and were written "
                                  "after; a longer flood would lose events")
        completed = complete_manifest(self._out, manifest)
        self._out.hand_over(self._owner, also=[f.name for f in writer.event_files])
        self._out.close()
        return Result(self._opts.out_dir, manifest, by_kind, writer.written, names, exit_code,
                      write_error=completed or write_error, manifest_written=completed is None)

    def _stacks_manifest(self) -> dict:
        """The manifest's `stacks` object: Python settings and processes, then the native settings."""
        out = self._stacks.manifest() if self._stacks is not None else {"python": False, "processes": {}}
        out["native"] = False
        if self._native is not None:
            out.update(self._native.manifest())
        return out

    def _write_aggregate(self, writer: CaptureWriter, bpf) -> None:
        from ..output.decode import aggregate_frame

        keys, vals = read_aggregate(bpf)
        writer.write_frame(writer.dir / "aggregate.parquet", aggregate_frame(keys, vals, self._api_names))

    def _offline_names(self, writer: CaptureWriter) -> pl.DataFrame | None:
        """Names for launch handles no run-time lookup named: host stubs found
        in the mapped binaries (capture.naming.symbolize).  Processes that have exited
        are read from the maps saved while they ran."""
        from ..naming import symbolize

        with tempfile.TemporaryDirectory(prefix="pasta-maps-") as tmp:
            for pid, text in self._tracker.maps.items():
                d = Path(tmp) / str(pid)
                d.mkdir()
                (d / "maps").write_text(text)
                alive = Path(f"/proc/{pid}/root").exists()
                os.symlink(f"/proc/{pid}/root" if alive else "/", d / "root")
            try:
                return symbolize.name_capture(writer.dir, proc=Path(tmp), aliases=writer.host_stub_aliases(),
                                              build_ids=self._tracker.build_ids.of_pid)
            except Exception as e:  # noqa: BLE001 - naming is best effort; the events are safe
                self._probes.notes.append(f"offline kernel naming failed: {type(e).__name__}: {e}")
                return None

    def _driver_object_names(self, names: pl.DataFrame, manifest: mf.Manifest) -> pl.DataFrame:
        """``names`` plus the names read from the driver objects of handles
        looked up before the attach (capture.naming.attach_names), and a row with the
        reason for each launched handle that still has no name."""
        if self._namer is None:
            return names
        try:
            if n := len(self._namer.unnamed_pids()):
                self._say(f"reading kernel names from the driver's objects in {n} process{'es' if n > 1 else ''}...")
            found = self._namer.finish(names)
            names = pl.concat([names, found], how="vertical") if not found.is_empty() else names
            unnamed = self._namer.unnamed_rows(names, self._api_names)
            manifest.attach_names = self._namer.manifest() or None
        except Exception as e:  # noqa: BLE001 - naming is best effort; the events are safe
            self._probes.notes.append(f"naming handles from the driver's objects failed: {type(e).__name__}: {e}")
            return names
        return pl.concat([names, unnamed], how="vertical") if not unnamed.is_empty() else names

    def _paired_names(self, writer: CaptureWriter, names: pl.DataFrame) -> pl.DataFrame:
        """``names`` plus the names runtime launches give the driver handles launched inside them."""
        from ..naming.pairing import nested_launch_names

        try:
            paired = nested_launch_names(writer.dir, names)
        except Exception as e:  # noqa: BLE001 - naming is best effort; the events are safe
            self._probes.notes.append(f"naming driver handles from runtime launches failed: {type(e).__name__}: {e}")
            return names
        return pl.concat([names, paired], how="vertical") if not paired.is_empty() else names


def complete_manifest(out: OutputDir, manifest: mf.Manifest) -> str | None:
    """Write the complete manifest; on a full disk give up the room held
    aside (OutputDir.keep_free) and try again.  Returns why it could not be
    written, or None once it is."""
    while True:
        try:
            manifest.write(out, complete=True)
            return None
        except OSError as e:
            if not out.release_space():
                return e.strerror or str(e)
