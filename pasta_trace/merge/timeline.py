"""The merged timeline on disk: a directory of Parquet files (docs/merge.md).

    timeline.json           format_version (schema.TIMELINE_FORMAT_VERSION), the
                            capture's manifest, merge statistics, problems; written last
    events.parquet, names.parquet, processes.parquet, libraries.parquet
                            the capture's host frames, unchanged
    kernels.parquet, allocations.parquet, pages.parquet, alloc_touches.parquet,
    working_set.parquet, hotness.parquet
                            schema.TIMELINE_FRAMES
    device/<frame>.parquet  the device frames the merge read (schema.DEVICE_FRAMES)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

import polars as pl

from .. import __version__, schema
from ..errors import FormatError
from ..parquet_scan import Scanner
from ..read import Capture, device_frames, drop_unkeyed, open_capture, read_json, with_scan
from ..safe_output import StagedDir
from .allocations import allocations
from .cluster import load_cluster
from .kernels import TOLERANCE_NS, device_executions, kernel_executions
from .layout import CLUSTER_KIND, MARKER
from .pages import alloc_touches, attributed_pages, hotness, working_set
from .stats import MergeStats, from_frames, saved_stats

_HOST = {"events": schema.EVENTS_SCHEMA, "names": schema.NAMES_SCHEMA,
         "processes": schema.PROCESSES_SCHEMA, "libraries": schema.LIBRARIES_SCHEMA,
         "stacks": schema.STACKS_SCHEMA, "communicators": schema.COMMUNICATORS_SCHEMA}


def is_timeline(path: str | Path) -> bool:
    # lexists: a marker that is no regular file is a damaged timeline, said as such by load
    return os.path.lexists(Path(path) / MARKER)


def load(path: str | Path) -> Capture:
    """A capture directory or a merged timeline, as a Capture.  FormatError
    (one line) when it is neither; a damaged Parquet file in it is left out
    and said in `damaged` and `problems`."""
    p = Path(path)
    if not is_timeline(p):
        return open_capture(p)
    meta = read_json(p / MARKER, schema.TIMELINE_SHAPE, schema.TIMELINE_FORMAT_VERSION, "timeline header")
    if meta.get("kind") == CLUSTER_KIND:
        return load_cluster(p, meta)
    saved = meta.get("merge_stats")
    # a newer minor version may save more counts, an older one fewer (saved_stats): every one is a count
    if saved is not None and not all(type(v) is int and v >= 0 for v in saved.values()):
        raise FormatError(f"{p / MARKER}: not a pasta-trace timeline header (merge_stats: not the merge's counts)")
    scan = Scanner()
    one = lambda n, sch: scan.one(p / f"{n}.parquet", sch)  # noqa: E731
    device = device_frames(scan, p / "device" if os.path.isdir(p / "device") else None)
    manifest = dict(meta.get("capture_manifest") or {})
    manifest["merge_stats"], notes = saved_stats(saved)
    if notes:
        manifest["notes"] = [*(manifest.get("notes") or []), *notes]
    cap = Capture(
        path=p,
        manifest=manifest,
        **{k: one(k, v) for k, v in _HOST.items()},
        aggregate=scan.optional(p / "aggregate.parquet", schema.AGGREGATE_SCHEMA),
        device=device,
        problems=list(meta.get("problems") or []),
        merged={k: one(k, v) for k, v in schema.TIMELINE_FRAMES.items()},
    )
    return with_scan(drop_unkeyed(cap, scan), scan)


def timeline_output(out: str | Path, *, force: bool = False) -> StagedDir:
    """Where write_timeline writes: checked (exists without --force, a
    directory that is not a timeline, read-only) before any work."""
    return StagedDir(Path(out), force=force, replaceable=is_timeline, kind="a pasta-trace timeline")


def write_timeline(cap: Capture, out: str | Path | StagedDir, *, force: bool = False,
                   step: Callable[[str], None] = lambda _name: None,
                   tolerance_ns: int = TOLERANCE_NS) -> MergeStats:
    """Merge `cap` into a timeline directory at `out` (a path, or
    timeline_output(path) checked earlier).  Lazy end to end: each frame is
    sunk to Parquet by the streaming engine.  Written into a hidden sibling
    and renamed at the end, so a failed merge leaves no half timeline (and
    never touches the capture)."""
    staged = out if isinstance(out, StagedDir) else timeline_output(out, force=force)
    try:
        staged.dir.subdir("device")
        stats = _write(cap, staged.dir.pinned, step, tolerance_ns)
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return stats


def _sink(lf: pl.LazyFrame, path: Path) -> None:
    lf.sink_parquet(path, engine="streaming")


def _write(cap: Capture, tmp: Path, step: Callable[[str], None], tolerance_ns: int) -> MergeStats:
    step("host frames")
    host = {"events": cap.events, "names": cap.names, "processes": cap.processes, "libraries": cap.libraries,
            "stacks": cap.stacks, "communicators": cap.communicators}
    if cap.aggregate is not None:
        host["aggregate"] = cap.aggregate
    for name, lf in host.items():
        _sink(lf, tmp / f"{name}.parquet")
    step("device frames")
    for name, lf in cap.device.items():
        if lf.select(pl.len()).collect().item():
            _sink(lf, tmp / "device" / f"{name}.parquet")
    # from here on, read back what was just written: the capture may be .bin
    # files decoded in memory, the copies are scanned lazily
    written = load_partial(cap, tmp)
    frames = {
        "kernels": lambda: kernel_executions(written, tolerance_ns),
        "allocations": lambda: allocations(written),
        "pages": lambda: attributed_pages(written, tolerance_ns=tolerance_ns),
        "alloc_touches": lambda: alloc_touches(written, tolerance_ns),
        "working_set": lambda: working_set(written),
        "hotness": lambda: hotness(written, tolerance_ns),
    }
    for name, frame in frames.items():
        step(name)
        _sink(frame(), tmp / f"{name}.parquet")
    step("statistics")
    samples = written.device["access_samples"].select(pl.len()).collect().item()
    attributed = pl.scan_parquet(tmp / "hotness.parquet").select(pl.col("samples").sum()).collect().item() or 0
    stats = from_frames(
        pl.scan_parquet(tmp / "kernels.parquet"), device_executions(written, tolerance_ns),
        pl.scan_parquet(tmp / "pages.parquet"), pl.scan_parquet(tmp / "alloc_touches.parquet"),
        int(samples), int(samples - attributed),
    )
    meta = {
        "format_version": ".".join(map(str, schema.TIMELINE_FORMAT_VERSION)),
        "kind": "pasta-trace timeline",
        "pasta_trace_version": __version__,
        "source": str(cap.path),
        "capture_manifest": cap.manifest,
        "merge_stats": stats.as_dict(),
        "problems": cap.problems,
    }
    (tmp / MARKER).write_text(json.dumps(meta, indent=1, default=str))
    return stats


def load_partial(cap: Capture, d: Path) -> Capture:
    """The capture as re-read from the host and device copies in `d`."""
    scan = Scanner()
    device = device_frames(scan, d / "device")
    partial = Capture(
        path=cap.path, manifest=cap.manifest,
        **{k: scan.one(d / f"{k}.parquet", v) for k, v in _HOST.items()},
        aggregate=cap.aggregate, device=device, problems=cap.problems,
    )
    if scan.damaged:  # written a moment ago by this merge: not the input's fault
        raise FormatError(f"cannot read back what the merge wrote: {scan.damaged[0]}")
    partial.device_files.update(scan.device_files)
    return partial
