"""Read stage: open a capture directory (or a merged timeline) as lazy Polars frames.

This is the seam between capture (which writes the directory) and everything
offline (merge, tools, report, export): those never parse files themselves.

Capture directory (docs/formats.md):
    manifest.json           written last, atomically; "complete": true
    events*.parquet         schema.EVENTS_SCHEMA (one or more files, row groups every <= 1 s)
    names.parquet           schema.NAMES_SCHEMA
    processes.parquet       schema.PROCESSES_SCHEMA
    libraries.parquet       schema.LIBRARIES_SCHEMA
    aggregate.parquet       schema.AGGREGATE_SCHEMA (only with --aggregate)
    stacks.parquet          schema.STACKS_SCHEMA (format 1.1+; events' stack_id -> frames)
    communicators.parquet   schema.COMMUNICATORS_SCHEMA (format 1.3+; NCCL communicators made)
    device/*.bin            device record files (TLV), read by pasta_trace.device
    device/<frame>.parquet  device frames already decoded (schema.DEVICE_FRAMES names);
                            scanned lazily, so device data larger than memory streams

A merged timeline (pasta_trace.merge.load) is also a Capture, with its merged
frames in `merged`.

Every file is read as untrusted input (docs/formats.md, "Damaged input"): the
manifest with a size bound and checked against schema.MANIFEST_SHAPE; each
Parquet file checked against its schema before it is scanned (parquet_scan),
and left out, said in `damaged`, when it fails.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from . import schema
from .device_frames import DeviceFrames
from .errors import FormatError
from .json_shape import check_shape, load_json
from .parquet_scan import KEYS, Scanner, keyed


@dataclass
class Capture:
    path: Path
    manifest: dict
    events: pl.LazyFrame
    names: pl.LazyFrame
    processes: pl.LazyFrame
    libraries: pl.LazyFrame
    aggregate: pl.LazyFrame | None
    #: schema.DEVICE_FRAMES name -> frame; empty frames where there is no device data.
    #: Always a DeviceFrames (a plain dict given is made one): a large access
    #: samples file is checked when first read (device_frames.py)
    device: DeviceFrames = field(default_factory=lambda: DeviceFrames({}))
    #: problems met while reading (damaged device files, an incomplete capture, ...)
    problems: list[str] = field(default_factory=list)
    #: schema.TIMELINE_FRAMES name -> frame, when read from a merged timeline
    merged: dict[str, pl.LazyFrame] = field(default_factory=dict)
    #: one row per frame of each stack events refer to (stack_id); empty without stacks
    stacks: pl.LazyFrame = field(default_factory=lambda: schema.empty_frame(schema.STACKS_SCHEMA).lazy())
    #: one row per NCCL communicator a traced process made; empty without NCCL
    communicators: pl.LazyFrame = field(
        default_factory=lambda: schema.empty_frame(schema.COMMUNICATORS_SCHEMA).lazy())
    #: a cluster timeline's own tables (schema.CLOCK_OFFSETS_SCHEMA as "clocks",
    #: schema.CLUSTER_RANKS_SCHEMA as "ranks"); empty for one capture
    cluster: dict[str, pl.LazyFrame] = field(default_factory=dict)
    #: small derived tables the merge computes once per capture (device
    #: executions, allocation segments, launch times), keyed by name and options
    cache: dict[tuple, object] = field(default_factory=dict, repr=False)
    #: "FILE: what is wrong" for each file left out because it cannot be read
    #: (also in `problems`); the verbs exit 1 when there is any
    damaged: list[str] = field(default_factory=list)
    #: the Parquet files the frames scan (to name the one a decoding error came from)
    files: list[Path] = field(default_factory=list)
    #: device frame name -> the Parquet files it scans (none for frames decoded from record files)
    device_files: dict[str, list[Path]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.device, DeviceFrames):
            self.device = DeviceFrames(dict(self.device))
        self.device.attach(self.problems, self.damaged, self.files)

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def losses(self) -> dict[str, int]:
        """Each loss counter of the manifest that counted (schema.LOSSES), by name."""
        c = self.manifest.get("counts")
        c = c if isinstance(c, dict) else {}
        return {loss.name: n for loss in schema.LOSSES if (n := loss.count_in(c))}

    @property
    def lost_events(self) -> int:
        """Everything the capture lost, every kind of loss together."""
        return sum(self.losses.values())

    @property
    def has_device_data(self) -> bool:
        return any(
            self.device[name].select(pl.len()).collect().item() > 0
            for name in ("kernel_summaries", "cupti_kernels", "launches") if name in self.device
        )


def check_version(found: str | None, supported: tuple[int, int], what: str) -> None:
    if not found:
        raise FormatError(f"{what}: no format_version; not a pasta-trace file")
    try:
        major = int(str(found).split(".")[0])
    except ValueError:
        raise FormatError(f"{what}: unreadable format_version {found!r}") from None
    if major > supported[0]:
        raise FormatError(
            f"{what}: format {found} is newer than this pasta-trace supports ({supported[0]}.x)",
            hint="upgrade pasta-trace",
        )


def read_json(path: Path, shape: dict, supported: tuple[int, int], what: str) -> dict:
    """A manifest or timeline header: bounded, of a known major version, of the declared shape."""
    doc = load_json(path, what)
    check_version(doc.get("format_version"), supported, str(path))
    check_shape(doc, shape, path, what)
    return doc


def read_device(paths: list[Path]) -> tuple[dict[str, pl.LazyFrame], list[str]]:
    """Device record files (TLV) -> frames, through pasta_trace.device."""
    from .device import read_device_files  # the device side's reader

    data = read_device_files(paths)
    frames = {
        k: v.lazy().cast(dict(schema.DEVICE_FRAMES[k]), strict=False)
        for k, v in data.frames.items() if k in schema.DEVICE_FRAMES
    }
    return frames, list(data.problems)


def _listing(p: Path) -> dict[str, os.DirEntry]:
    try:
        if not p.is_dir():
            if not os.path.lexists(p):
                raise FormatError(f"{p}: no such file or directory")
            raise FormatError(f"{p}: not a capture directory")
        with os.scandir(p) as it:
            return {e.name: e for e in it}
    except OSError as e:
        raise FormatError(f"{p}: cannot read ({e.strerror})") from None


def _device_dir(p: Path, entries: dict[str, os.DirEntry], scan: Scanner) -> tuple[Path | None, list[Path]]:
    """The device directory (None when absent or not a directory: said in
    `scan.damaged`) and its record files."""
    e = entries.get("device")
    if e is None:
        return None, []
    if not e.is_dir(follow_symlinks=False):
        scan.damaged.append(f"{p / 'device'}: not a directory")
        return None, []
    try:
        names = sorted(os.listdir(p / "device"))
    except OSError as err:
        scan.damaged.append(f"{p / 'device'}: cannot read ({err.strerror})")
        return None, []
    return p / "device", [p / "device" / n for n in names if n.endswith(".bin")]


def device_frames(scan: Scanner, d: Path | None) -> DeviceFrames:
    """Every device frame: those stored in `d` (a device directory, when
    there is one) as `scan` scans them, the others empty."""
    frames = {k: pl.DataFrame(schema=v).lazy() for k, v in schema.DEVICE_FRAMES.items()}
    if d is not None:
        frames.update(scan.device(d))
    return DeviceFrames(frames, scan.deferred)


def open_capture(path: str | Path) -> Capture:
    """Open a capture directory.  Raises FormatError with a one-line reason
    when it is no capture; a damaged file in it is left out and said in
    `damaged` and `problems`."""
    p = Path(path)
    entries = _listing(p)
    problems: list[str] = []
    events = sorted(p / n for n in entries if fnmatch.fnmatchcase(n, "events*.parquet"))
    if "manifest.json" not in entries:
        # a tracer killed with SIGKILL leaves Parquet files but no manifest: still readable
        if not events:
            raise FormatError(f"{p}: not a pasta-trace capture (no manifest.json, no events*.parquet)")
        manifest: dict = {"complete": False, "format_version": "1.0"}
        problems.append("no manifest.json: the tracer did not finish; the last interval may be missing")
    else:
        manifest = read_json(p / "manifest.json", schema.MANIFEST_SHAPE, schema.CAPTURE_FORMAT_VERSION,
                             "manifest")
        if not manifest.get("complete"):
            problems.append("manifest says the capture is incomplete")
    scan = Scanner()
    ddir, dev_files = _device_dir(p, entries, scan)
    device = device_frames(scan, ddir)
    if dev_files:
        frames, dev_problems = read_device(dev_files)
        device.update(frames)
        for name in frames:
            scan.device_files.pop(name, None)
        problems.extend(dev_problems)
    cap = Capture(
        path=p,
        manifest=manifest,
        events=scan.frames(events, schema.EVENTS_SCHEMA),
        names=scan.one(p / "names.parquet", schema.NAMES_SCHEMA),
        processes=scan.one(p / "processes.parquet", schema.PROCESSES_SCHEMA),
        libraries=scan.one(p / "libraries.parquet", schema.LIBRARIES_SCHEMA),
        aggregate=scan.optional(p / "aggregate.parquet", schema.AGGREGATE_SCHEMA),
        stacks=scan.one(p / "stacks.parquet", schema.STACKS_SCHEMA),
        communicators=scan.one(p / "communicators.parquet", schema.COMMUNICATORS_SCHEMA),
        device=device,
        problems=problems,
    )
    return with_scan(drop_unkeyed(cap, scan), scan)


def drop_unkeyed(cap: Capture, scan: Scanner) -> Capture:
    """keyed() of the capture's events, processes and device frames, as `scan` read them."""
    def of(name: str) -> list[dict[str, int]]:
        return [n for f, n in scan.nulls.items()
                if fnmatch.fnmatchcase(f.name, f"{name}*.parquet") and f.parent == cap.path and f in scan.files]

    cap.events = keyed(cap.events, of("events"), KEYS["events"], "events", cap.problems)
    cap.processes = keyed(cap.processes, of("processes"), KEYS["processes"], "processes", cap.problems)
    for name, paths in scan.device_files.items():
        if name in scan.deferred:  # counted by the check, when it runs (device_frames.py)
            continue
        cap.device[name] = keyed(cap.device[name], [scan.nulls.get(p, {}) for p in paths], KEYS["device"],
                                 f"device {name}", cap.problems)
    return cap


def with_scan(cap: Capture, scan: Scanner) -> Capture:
    """`cap` with what `scan` left out and read."""
    cap.damaged.extend(scan.damaged)
    cap.problems.extend(scan.damaged)
    cap.files.extend(scan.files)
    cap.device_files.update(scan.device_files)
    return cap
