"""Driver memory.  The memory timeline: live device bytes per process over
time (a step series built with cumulative sums over the sorted alloc/free
events), its peaks and the Python lines (call sites) holding the memory at
each peak; the bytes allocated and freed.  Leak candidates: allocations never
freed before the capture ended, each with the Python line (call site) that
made it, and their sum per line.

Pinned host allocations (kind "host") are not device memory and are left out
of the timeline and its peaks; the leaks tools still list them."""

from __future__ import annotations

import polars as pl

from .. import lifetimes, merge
from ..read import Capture
from . import render
from .common import bounds
from .registry import PID, TID, columns, tool
from .sites import NO_STACK, allocation_sites, top_site

_API = ("api", pl.String, "", "allocation API (for a free: the API that allocated the block)")
TIMELINE = columns(
    PID, ("ts_ns", pl.Int64, "ts", "the allocation or free"), _API,
    ("delta_bytes", pl.Int64, "bytes", "+size for an allocation, -size for a free"),
    ("live_bytes", pl.Int64, "bytes", "live device bytes of the process after this step"),
    ("api_live_bytes", pl.Int64, "bytes", "the same, counting only this API's allocations"),
)
PEAKS = columns(
    PID, ("api", pl.String, "", '"all", or one allocation API alone'),
    ("peak_bytes", pl.Int64, "bytes", "peak of live device bytes"),
    ("peak_ts_ns", pl.Int64, "ts", "when the peak was first reached"),
    ("end_bytes", pl.Int64, "bytes", "live at the end of the capture"),
    ("allocations", pl.UInt32, "count", "device allocations made (pinned host memory: memory_totals)"),
    ("device_alloc_bytes", pl.Int64, "bytes", "their bytes"),
    ("top_call_site", pl.String, "", "the Python line whose allocations held the most bytes at the peak; null: "
                                     "none of them had a stack"),
)
TOTALS = columns(
    PID, ("memory", pl.Enum(lifetimes.MEMORY_NAMES), "", '"device" (device, managed, async and VMM allocations) or '
                                               '"pinned host" (page-locked host memory)'),
    ("allocations", pl.UInt32, "count", "successful allocation calls"),
    ("allocated_bytes", pl.UInt64, "bytes", "their bytes"),
    ("freed", pl.UInt32, "count", "those allocations freed during the capture (null: --aggregate)"),
    ("freed_bytes", pl.UInt64, "bytes", "their sizes: each free releases its own allocation's bytes"),
    ("held_bytes", pl.UInt64, "bytes", "allocated, not freed by the end"),
)
PEAK_SITES = columns(
    PID, ("call_site", pl.String, "", "the Python line that allocated; (no stack): none"),
    ("live_bytes", pl.UInt64, "bytes", "its bytes live at the process's peak"),
    ("allocations", pl.UInt32, "count", "its allocations live then"),
    ("peak_ts_ns", pl.Int64, "ts", "the peak (memory_peaks, api all)"),
)


_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(ts: pl.Series, live: pl.Series, width: int = 60) -> str:
    """Live bytes as a one-line step plot: the maximum in each of `width` time bins,
    carrying the last level through bins without events."""
    if ts.len() == 0:
        return ""
    t0, t1 = ts.min(), ts.max()
    span = max(t1 - t0, 1)
    bins = (
        pl.DataFrame({"b": ((ts - t0) * (width - 1) // span).cast(pl.Int64), "v": live})
        .group_by("b")
        .agg(pl.col("v").max())
    )
    full = (
        pl.DataFrame({"b": pl.int_range(0, width, eager=True)})
        .join(bins, on="b", how="left")
        .sort("b")
        .with_columns(pl.col("v").forward_fill().fill_null(0))
    )
    top = max(int(full["v"].max()), 1)
    return "".join(_SPARK[min(len(_SPARK) - 1, v * len(_SPARK) // (top + 1))] for v in full["v"])


def render_timeline(df: pl.DataFrame) -> str:
    if df.height == 0:
        return "no device allocations\n"
    out = []
    for (pid,), part in df.group_by("pid", maintain_order=True):
        peak = part["live_bytes"].max()
        out.append(
            f"pid {pid}: peak {render.human_bytes(peak)}, end {render.human_bytes(part['live_bytes'][-1])}, "
            f"{part.height} steps\n  {sparkline(part['ts_ns'], part['live_bytes'])}"
        )
    return "\n".join(out) + "\n"


@tool("memory", "Memory timeline (live device bytes)", TIMELINE, render_text=render_timeline,
      description="one row per allocation or free: live device bytes per process after it, overall and per API")
def memory_timeline(cap: Capture) -> pl.DataFrame:
    """One row per allocation or free of device memory, in time order per process."""
    allocs = merge.allocations(cap).filter((pl.col("kind") != "host") & lifetimes.holds_memory())
    cols = ["pid", pl.col("api").cast(pl.String)]
    steps = pl.concat(
        [
            allocs.select(*cols, pl.col("alloc_ts_ns").alias("ts_ns"), pl.col("size").cast(pl.Int64).alias("delta_bytes")),
            allocs.filter(pl.col("free_ts_ns").is_not_null()).select(
                *cols, pl.col("free_ts_ns").alias("ts_ns"), -pl.col("size").cast(pl.Int64).alias("delta_bytes")
            ),
        ]
    )
    # frees sort before allocations at the same instant: a peak is only
    # reported when both blocks really coexisted
    return (
        steps.sort(["pid", "ts_ns", "delta_bytes"])
        .with_columns(
            pl.col("delta_bytes").cum_sum().over("pid").alias("live_bytes"),
            pl.col("delta_bytes").cum_sum().over(["pid", "api"]).alias("api_live_bytes"),
        )
        .select("pid", "ts_ns", "api", "delta_bytes", "live_bytes", "api_live_bytes")
        .collect(engine="streaming")
    )


def peak_rows(cap: Capture) -> pl.DataFrame:
    """memory_peaks without its call sites."""
    tl = memory_timeline(cap).lazy()

    def peaks(by: list[str], live: str) -> pl.LazyFrame:
        return tl.group_by(by).agg(
            pl.col(live).max().alias("peak_bytes"),
            pl.col("ts_ns").get(pl.col(live).arg_max()).alias("peak_ts_ns"),
            pl.col(live).last().alias("end_bytes"),
            (pl.col("delta_bytes") > 0).sum().alias("allocations"),
            pl.col("delta_bytes").clip(lower_bound=0).sum().alias("device_alloc_bytes"),
        )

    overall = peaks(["pid"], "live_bytes").with_columns(pl.lit("all").alias("api"))
    by_api = peaks(["pid", "api"], "api_live_bytes")
    cols = ["pid", "api", "peak_bytes", "peak_ts_ns", "end_bytes", "allocations", "device_alloc_bytes"]
    return (
        pl.concat([overall.select(cols), by_api.select(cols)])
        .sort(["pid", pl.col("api") != "all", "api"])
        .collect(engine="streaming")
    )


def _live_at_peaks(cap: Capture, peaks: pl.LazyFrame, no_stack: str | None) -> pl.LazyFrame:
    """Device allocations live at each peak: (pid, api) of `peaks`, api "all"
    counting every allocation API together."""
    allocs = allocation_sites(cap).with_columns(pl.col("api").cast(pl.String))
    if no_stack is not None:
        allocs = allocs.with_columns(pl.col("call_site").fill_null(no_stack))
    every = allocs.join(peaks.filter(pl.col("api") == "all"), on="pid", suffix="_peak").drop("api").rename(
        {"api_peak": "api"})
    one = allocs.join(peaks.filter(pl.col("api") != "all"), on=["pid", "api"])
    live = (pl.col("alloc_ts_ns") <= pl.col("peak_ts_ns")) & (
        pl.col("free_ts_ns").is_null() | (pl.col("free_ts_ns") > pl.col("peak_ts_ns")))
    return pl.concat([every, one], how="diagonal_relaxed").filter(live)


@tool("memory_peaks", "Memory peaks", PEAKS,
      description="peak live device bytes per process and when, overall and per allocation API")
def memory_peaks(cap: Capture) -> pl.DataFrame:
    """Per process: the peak of live device bytes and when it was first reached,
    overall (api = "all") and for each allocation API alone."""
    peaks = peak_rows(cap)
    held = top_site(_live_at_peaks(cap, peaks.lazy().select("pid", "api", "peak_ts_ns"), None), ["pid", "api"],
                    pl.col("size").sum(), pl.len())
    return peaks.lazy().join(held, on=["pid", "api"], how="left", maintain_order="left").collect()


def live_at_peak(cap: Capture) -> pl.LazyFrame:
    """The device allocations live at their process's peak of live bytes (all
    APIs together), each with its stack_id and call_site (NO_STACK: none)."""
    peaks = peak_rows(cap).lazy().filter(pl.col("api") == "all").select("pid", "api", "peak_ts_ns")
    return _live_at_peaks(cap, peaks, NO_STACK)


@tool("peak_call_sites", "Memory held at the peak, by call site", PEAK_SITES,
      description="device bytes live at each process's peak of live bytes, by the Python line that allocated them")
def peak_by_call_site(cap: Capture) -> pl.DataFrame:
    """Device bytes live at each process's peak, by the Python line that
    allocated them, most first."""
    return (
        live_at_peak(cap).group_by("pid", "call_site")
        .agg(pl.col("size").sum().alias("live_bytes"), pl.len().alias("allocations"), pl.col("peak_ts_ns").first())
        .sort(["live_bytes", "pid", "call_site"], descending=[True, False, False])
        .collect(engine="streaming")
    )


@tool("memory_totals", "Memory allocated and freed (device vs pinned host)", TOTALS, reads_aggregate=True,
      description="per process: bytes allocated, freed and still held, device memory and pinned host memory apart")
def memory_totals(cap: Capture) -> pl.DataFrame:
    """Per process, device memory and pinned host memory apart.  Failed calls
    count nowhere.  An --aggregate capture keeps no per-free sizes: freed,
    freed_bytes and held_bytes are null.  The summary a recording prints
    shows these totals, all processes together."""
    if cap.aggregate is not None:
        return lifetimes.aggregate_totals(cap.aggregate).collect(engine="streaming")
    return lifetimes.totals(merge.allocations(cap)).collect(engine="streaming")


_SITE_DOC = "the Python line that allocated"
LEAKS = columns(
    PID, TID, ("api", pl.String, "", "allocation API"),
    ("kind", pl.String, "", "device, managed, host (pinned), async, virtual or physical (VMM)"),
    ("base", pl.UInt64, "handle", "the address; of VMM physical memory, its handle"),
    ("size", pl.UInt64, "bytes", "its bytes"),
    ("alloc_ts_ns", pl.Int64, "ts", "when it was allocated"),
    ("age_ns", pl.Int64, "ns", "capture end minus allocation time"),
    ("call_site", pl.String, "", f"{_SITE_DOC}; null: no stack"),
)
LEAK_SITES = columns(
    PID, ("call_site", pl.String, "", f"{_SITE_DOC}; (no stack): none"),
    ("leaked_bytes", pl.UInt64, "bytes", "bytes of its allocations never freed"),
    ("allocations", pl.UInt32, "count", "those allocations"),
)


def _never_freed(cap: Capture) -> pl.LazyFrame:
    return allocation_sites(cap, device_only=False).filter(pl.col("free_ts_ns").is_null())


@tool("leaks", "Leak candidates (never freed)", LEAKS,
      description="allocations with no free before the capture ended, largest first, with age at capture end")
def leak_candidates(cap: Capture) -> pl.DataFrame:
    """Allocations with no free before the capture ended, largest first."""
    _, end = bounds(cap)
    return (
        _never_freed(cap)
        .select(
            "pid", "tid", pl.col("api").cast(pl.String), pl.col("kind").cast(pl.String), "base", "size", pl.col("alloc_ts_ns"),
            (pl.lit(end, pl.Int64) - pl.col("alloc_ts_ns")).alias("age_ns"), "call_site",
        )
        .sort(["size", "alloc_ts_ns", "pid", "base"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )


@tool("leak_call_sites", "Leaks by call site", LEAK_SITES,
      description="allocations never freed before the capture ended, by the Python line that made them")
def leaks_by_call_site(cap: Capture) -> pl.DataFrame:
    """The leak candidates summed per Python line, most bytes first."""
    return (
        _never_freed(cap).with_columns(pl.col("call_site").fill_null(NO_STACK))
        .group_by("pid", "call_site")
        .agg(pl.col("size").sum().alias("leaked_bytes"), pl.len().alias("allocations"))
        .sort(["leaked_bytes", "pid", "call_site"], descending=[True, False, False])
        .collect(engine="streaming")
    )
