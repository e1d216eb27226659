"""A cluster timeline: many captures (one per node or rank) on one clock (docs/cluster.md).

    timeline.json            kind "pasta-trace cluster timeline", format_version
                             (schema.TIMELINE_FORMAT_VERSION), the captures' manifests, problems; written last
    clocks.parquet           schema.CLOCK_OFFSETS_SCHEMA: each capture's fitted offset and uncertainty
    ranks.parquet            schema.CLUSTER_RANKS_SCHEMA: each process's node and rank
    events/node=<host>/rank=<r>/capture-<i>.parquet
                             schema.CLUSTER_EVENTS_SCHEMA, hive-partitioned; ts_ns on the timeline's clock
    communicators.parquet, processes.parquet, names.parquet, stacks.parquet, libraries.parquet
                             the captures' frames, concatenated, on the same clock and pids

Timestamps are the first capture's CLOCK_MONOTONIC (clock_align); a
capture's pids that collide with an earlier capture's move up by
clock_align.PID_STRIDE multiples (`pid_offset` in clocks.parquet)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl

from .. import __version__, schema
from ..parquet_scan import Scanner
from ..read import Capture, with_scan
from ..safe_output import StagedDir
from .clock_align import fit_offsets
from .layout import CLUSTER_KIND, MARKER
#: frames kept whole (not partitioned): what moves with the clock and the pids
_TIME = {"events": ("ts_ns",), "names": ("ts_ns",), "processes": ("start_ns", "exit_ns"), "stacks": (),
         "communicators": ("ts_ns", "end_ts_ns"), "libraries": ()}
_PIDS = {"events": ("pid", "tid"), "names": ("pid",), "processes": ("pid", "ppid"), "stacks": ("pid",),
         "communicators": ("pid",), "libraries": ()}
_FLAT = ("communicators", "processes", "names", "stacks", "libraries")


def _frames(cap: Capture) -> dict[str, pl.LazyFrame]:
    return {"events": cap.events, "names": cap.names, "processes": cap.processes, "stacks": cap.stacks,
            "communicators": cap.communicators, "libraries": cap.libraries}


def _shifted(cap: Capture, off: dict) -> dict[str, pl.LazyFrame]:
    """The capture's frames on the timeline's clock and pids."""
    out = {}
    for name, lf in _frames(cap).items():
        moved = [(pl.col(c) + off["offset_ns"]).alias(c) for c in _TIME[name]]
        moved += [(pl.col(c) + off["pid_offset"]).cast(pl.UInt32).alias(c) for c in _PIDS[name]]
        out[name] = lf.with_columns(moved) if moved else lf
    out["communicators"] = out["communicators"].with_columns(pl.col("host").fill_null(off["node"]))
    return out


def _ranks(frames: dict[str, pl.LazyFrame], off: dict) -> pl.DataFrame:
    """Each process's rank: RANK from its environment, else its rank in the
    largest communicator it joined, else -1."""
    in_comm = (frames["communicators"].filter(pl.col("rank").is_not_null())
               .sort(["pid", "nranks", "ts_ns"], descending=[False, True, False])
               .group_by("pid", maintain_order=True).agg(pl.col("rank").first().alias("_comm_rank")))
    env = frames["processes"].group_by("pid").agg(pl.col("rank").drop_nulls().first())
    pids = pl.concat([frames["events"].select("pid"), frames["processes"].select("pid")]).unique()
    return (
        pids.join(env, on="pid", how="left").join(in_comm, on="pid", how="left")
        .select(pl.lit(off["capture"], pl.UInt32).alias("capture"), pl.lit(off["node"]).alias("node"), "pid",
                (pl.col("pid") - off["pid_offset"]).cast(pl.UInt32).alias("host_pid"),
                pl.coalesce("rank", "_comm_rank", pl.lit(-1)).cast(pl.Int32).alias("rank"))
        .sort("pid").collect()
    )


def _partition(value: str) -> str:
    """A hive directory value: hostnames are [A-Za-z0-9.-], anything else becomes _."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", value)


def _manifest(caps: list[Capture], offsets: pl.DataFrame) -> dict:
    """What tools read from a manifest (clock span, lost counts), over all captures."""
    starts, ends = [], []
    for cap, off in zip(caps, offsets["offset_ns"].to_list()):
        clock = cap.manifest.get("clock") or {}
        if clock.get("start_ns") is not None:
            starts.append(clock["start_ns"] + off)
        if clock.get("end_ns") is not None:
            ends.append(clock["end_ns"] + off)
    counts = {k: sum(int((c.manifest.get("counts") or {}).get(k, 0)) for c in caps)
              for k in ("events", "lost_events", "lost_names")}
    return {"format_version": ".".join(map(str, schema.CAPTURE_FORMAT_VERSION)), "host": None,
            "clock": {"domain": "CLOCK_MONOTONIC of capture 0", "start_ns": min(starts, default=None),
                      "end_ns": max(ends, default=None)},
            "counts": counts, "complete": all(c.complete for c in caps)}


def write_cluster(caps: list[Capture], staged: StagedDir, *, sync_ns: int) -> pl.DataFrame:
    """Merge `caps` into the staged directory; returns clocks.parquet's rows.
    Each frame is streamed from the captures to its file."""
    try:
        offsets = fit_offsets(caps, sync_ns)
        root = staged.dir
        tmp = root.pinned
        offsets.write_parquet(tmp / "clocks.parquet")
        flat: dict[str, list[pl.LazyFrame]] = {k: [] for k in _FLAT}
        ranks = []
        for cap, off in zip(caps, offsets.iter_rows(named=True)):
            frames = _shifted(cap, off)
            rk = _ranks(frames, off)
            ranks.append(rk)
            node = root.subdir("events").subdir(f"node={_partition(off['node'])}")
            events = frames["events"].join(rk.lazy().select("pid", "rank"), on="pid", how="left")
            # one file per (capture, rank): a handful of processes, not rows
            for r in sorted(set(rk["rank"].to_list()) | {-1}):
                part = (events.filter(pl.col("rank_right").fill_null(-1) == r).drop("rank_right").sort("ts_ns")
                        .rename({"rank": "comm_rank"}))
                if part.select(pl.len()).collect().item():
                    d = node.subdir(f"rank={r}").pinned
                    part.sink_parquet(d / f"capture-{off['capture']}.parquet", engine="streaming")
            for k in _FLAT:
                flat[k].append(frames[k])
        for k, parts in flat.items():
            lf = pl.concat(parts, how="vertical_relaxed")
            (lf.unique(maintain_order=True) if k == "libraries" else lf).sink_parquet(
                tmp / f"{k}.parquet", engine="streaming")
        pl.concat(ranks).cast(schema.CLUSTER_RANKS_SCHEMA).write_parquet(tmp / "ranks.parquet")
        meta = {
            "format_version": ".".join(map(str, schema.TIMELINE_FORMAT_VERSION)),
            "kind": CLUSTER_KIND, "pasta_trace_version": __version__,
            "sources": [str(c.path) for c in caps],
            "capture_manifest": _manifest(caps, offsets),
            "manifests": [c.manifest for c in caps],
            "problems": [f"{c.path}: {p}" for c in caps for p in c.problems],
        }
        (tmp / MARKER).write_text(json.dumps(meta, indent=1, default=str))
        staged.commit()
    except BaseException:
        staged.discard()
        raise
    return offsets


def load_cluster(p: Path, meta: dict) -> Capture:
    """A cluster timeline as one Capture (events read without the hive columns,
    the files' comm_rank as schema.EVENTS_SCHEMA's rank)."""
    scan = Scanner()
    events = sorted((p / "events").glob("node=*/rank=*/*.parquet"))
    sch = {"names": schema.NAMES_SCHEMA, "processes": schema.PROCESSES_SCHEMA, "stacks": schema.STACKS_SCHEMA,
           "communicators": schema.COMMUNICATORS_SCHEMA, "libraries": schema.LIBRARIES_SCHEMA}
    cap = Capture(
        path=p, manifest=dict(meta.get("capture_manifest") or {}),
        events=scan.frames(events, schema.CLUSTER_EVENTS_SCHEMA).select(list(schema.CLUSTER_EVENTS_SCHEMA)).rename(
            {"comm_rank": "rank"}),
        **{k: scan.one(p / f"{k}.parquet", v) for k, v in sch.items()},
        aggregate=None, problems=list(meta.get("problems") or []),
        device={k: pl.DataFrame(schema=v).lazy() for k, v in schema.DEVICE_FRAMES.items()},
    )
    cap.cluster = {"clocks": scan.one(p / "clocks.parquet", schema.CLOCK_OFFSETS_SCHEMA),
                   "ranks": scan.one(p / "ranks.parquet", schema.CLUSTER_RANKS_SCHEMA)}
    return with_scan(cap, scan)
