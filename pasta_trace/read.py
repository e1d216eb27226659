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
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from . import schema
from .errors import FormatError


@dataclass
class Capture:
    path: Path
    manifest: dict
    events: pl.LazyFrame
    names: pl.LazyFrame
    processes: pl.LazyFrame
    libraries: pl.LazyFrame
    aggregate: pl.LazyFrame | None
    #: schema.DEVICE_FRAMES name -> frame; empty frames where there is no device data
    device: dict[str, pl.LazyFrame] = field(default_factory=dict)
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

    @property
    def complete(self) -> bool:
        return bool(self.manifest.get("complete"))

    @property
    def lost_events(self) -> int:
        c = self.manifest.get("counts", {})
        return int(c.get("lost_events", 0)) + int(c.get("lost_names", 0))

    @property
    def has_device_data(self) -> bool:
        return any(
            f.select(pl.len()).collect().item() > 0
            for name, f in self.device.items()
            if name in ("kernel_summaries", "cupti_kernels", "launches")
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


def scan_frames(paths: list[Path], sch: dict[str, pl.DataType]) -> pl.LazyFrame:
    if not paths:
        return pl.DataFrame(schema=sch).lazy()
    lf = pl.scan_parquet([str(p) for p in paths])
    # a column added in a later minor version reads as null from older files
    try:
        present = lf.collect_schema().names()
    except (pl.exceptions.ComputeError, OSError):
        present = list(sch)  # damaged: the error comes with the first read, as for any column
    missing = [pl.lit(None, v).alias(k) for k, v in sch.items() if k not in present]
    return (lf.with_columns(missing) if missing else lf).cast(dict(sch), strict=False)


def device_parquet(d: Path) -> dict[str, pl.LazyFrame]:
    """Decoded device frames stored as d/<frame>.parquet, scanned lazily."""
    return {
        name: scan_frames([d / f"{name}.parquet"], sch)
        for name, sch in schema.DEVICE_FRAMES.items()
        if (d / f"{name}.parquet").exists()
    }


def read_device(paths: list[Path]) -> tuple[dict[str, pl.LazyFrame], list[str]]:
    """Device record files (TLV) -> frames, through pasta_trace.device."""
    from .device import read_device_files  # the device side's reader

    data = read_device_files(paths)
    frames = {
        k: v.lazy().cast(dict(schema.DEVICE_FRAMES[k]), strict=False)
        for k, v in data.frames.items() if k in schema.DEVICE_FRAMES
    }
    return frames, list(data.problems)


def open_capture(path: str | Path) -> Capture:
    """Open a capture directory.  Raises FormatError with a one-line reason."""
    p = Path(path)
    if not p.exists():
        raise FormatError(f"{p}: no such file or directory")
    if not p.is_dir():
        raise FormatError(f"{p}: not a capture directory")
    mpath = p / "manifest.json"
    problems: list[str] = []
    if not mpath.exists():
        # a tracer killed with SIGKILL leaves Parquet files but no manifest: still readable
        if not list(p.glob("events*.parquet")):
            raise FormatError(f"{p}: not a pasta-trace capture (no manifest.json, no events*.parquet)")
        manifest: dict = {"complete": False, "format_version": "1.0"}
        problems.append("no manifest.json: the tracer did not finish; the last interval may be missing")
    else:
        try:
            manifest = json.loads(mpath.read_text())
        except json.JSONDecodeError as e:
            raise FormatError(f"{mpath}: damaged manifest ({e.msg} at line {e.lineno})") from None
        check_version(manifest.get("format_version"), schema.CAPTURE_FORMAT_VERSION, str(mpath))
        if not manifest.get("complete"):
            problems.append("manifest says the capture is incomplete")
    events = sorted(p.glob("events*.parquet"))
    one = lambda n: [p / n] if (p / n).exists() else []  # noqa: E731
    device: dict[str, pl.LazyFrame] = {
        k: pl.DataFrame(schema=v).lazy() for k, v in schema.DEVICE_FRAMES.items()
    }
    device.update(device_parquet(p / "device"))
    dev_files = sorted((p / "device").glob("*.bin")) if (p / "device").is_dir() else []
    if dev_files:
        frames, dev_problems = read_device(dev_files)
        device.update(frames)
        problems.extend(dev_problems)
    return Capture(
        path=p,
        manifest=manifest,
        events=scan_frames(events, schema.EVENTS_SCHEMA),
        names=scan_frames(one("names.parquet"), schema.NAMES_SCHEMA),
        processes=scan_frames(one("processes.parquet"), schema.PROCESSES_SCHEMA),
        libraries=scan_frames(one("libraries.parquet"), schema.LIBRARIES_SCHEMA),
        aggregate=scan_frames(one("aggregate.parquet"), schema.AGGREGATE_SCHEMA) if one("aggregate.parquet") else None,
        stacks=scan_frames(one("stacks.parquet"), schema.STACKS_SCHEMA),
        communicators=scan_frames(one("communicators.parquet"), schema.COMMUNICATORS_SCHEMA),
        device=device,
        problems=problems,
    )
