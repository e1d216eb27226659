"""Tensor memory: what PyTorch's allocators handed out and took back
(tensor_alloc / tensor_free events from libc10.so), per process and device:
the timeline of allocated against reserved bytes, the peak and the call sites
holding it, fragmentation, leaks, and the tensors never freed.

Kept apart from the driver-level memory tools (`memory`, `leaks`, ...): a
caching allocator takes large segments from the driver (cuMemAlloc, seen
there) and hands tensors out of them, so the two are views of the same bytes
at two layers and are never summed.

One source per process and device: the CUDA and ROCm caching allocators
report every block to reportMemoryUsageToProfiler; CPU tensors go through
ProfiledCPUMemoryReporter::New/Delete, which also call
reportMemoryUsageToProfiler while a PyTorch profiler records memory.  So a
"cpu" device is read from New/Delete when the capture has them, any other
from reportMemoryUsageToProfiler, and a tensor is never counted twice.

"Held" bytes are the allocator's own running total where it gives one (it
counts tensors allocated before the capture began), else the sum of the
tensors this capture saw allocated and not yet freed."""

from __future__ import annotations

import polars as pl

from .. import tensor_source
from ..read import Capture
from ..tensor_source import CPU_APIS, REPORT_API, TENSOR_KINDS, left_at_exit  # noqa: F401 - the tools' names
from . import render
from .common import bounds
from .memory import sparkline
from .registry import PID, TID, TOP_CALL_SITE, columns, tool
from .sites import NO_STACK, top_site, with_site

#: the call site of the bytes an allocator's total held at the peak that no
#: tensor of the capture accounts for (allocated before it began)
BEFORE = "(allocated before the capture)"

_DEVICE = ("device", pl.String, "", 'where the tensor memory is: "cpu", "cuda:0", ...')


def tensor_events(cap: Capture) -> pl.LazyFrame:
    """The tensor events of `cap`, one source per (pid, device) (tensor_source.tensor_events)."""
    return tensor_source.tensor_events(cap.events)


def tensor_lifetimes(cap: Capture) -> pl.LazyFrame:
    """One row per tensor allocated during the capture (tensor_source.tensor_lifetimes):
    a tensor freed only by the interpreter's finalization has freed_at_exit."""
    return tensor_source.tensor_lifetimes(tensor_events(cap))


def _held() -> pl.Expr:
    return pl.coalesce(pl.col("allocated_bytes").cast(pl.Int64), pl.col("live_bytes")).alias("held_bytes")


TIMELINE = columns(
    PID, _DEVICE, ("ts_ns", pl.Int64, "ts", "the event"),
    ("api", pl.String, "", "the probed function"), ("kind", pl.String, "", "tensor_alloc or tensor_free"),
    ("ptr", pl.UInt64, "handle", "the tensor memory's address"),
    ("size", pl.UInt64, "bytes", "its bytes (null: a free whose size was not seen)"),
    ("delta_bytes", pl.Int64, "bytes", "+size for an allocation, -size for the free of a tensor this capture saw "
                                       "allocated, 0 for the free of an older one"),
    ("live_bytes", pl.Int64, "bytes", "bytes of the tensors this capture saw allocated and not yet freed"),
    ("allocated_bytes", pl.UInt64, "bytes", "the allocator's total of allocated bytes after this event (null: it "
                                            "gives none)"),
    ("reserved_bytes", pl.UInt64, "bytes", "the allocator's reserved bytes (its cache, from the driver; null: none "
                                           "given)"),
    ("held_bytes", pl.Int64, "bytes", "allocated_bytes where given, else live_bytes"),
)


def render_timeline(df: pl.DataFrame) -> str:
    if df.height == 0:
        return "no tensor memory events\n"
    out = []
    for (pid, device), part in df.group_by("pid", "device", maintain_order=True):
        reserved = part["reserved_bytes"].drop_nulls()
        res = f", reserved peak {render.human_bytes(reserved.max())}" if reserved.len() else ""
        out.append(
            f"pid {pid} {device}: peak {render.human_bytes(part['held_bytes'].max())}{res}, "
            f"end {render.human_bytes(part['held_bytes'][-1])}, {part.height} events\n"
            f"  {sparkline(part['ts_ns'], part['held_bytes'])}"
        )
    return "\n".join(out) + "\n"


@tool("tensor_memory", "Tensor memory timeline (allocated vs reserved, per device)", TIMELINE,
      needs_tensors=True, render_text=render_timeline,
      description="one row per tensor allocation or free (PyTorch's allocators, libc10): tensor bytes held per "
                  "process and device, and what the allocator reserved; never summed with driver allocations")
def tensor_timeline(cap: Capture) -> pl.DataFrame:
    """One row per tensor allocation or free, in time order per process and
    device: allocated against reserved bytes."""
    ev = tensor_events(cap)
    ended = tensor_lifetimes(cap).filter(pl.col("free_ts_ns").is_not_null()).select(
        "pid", "device", pl.col("base").alias("ptr"), pl.col("free_ts_ns").alias("ts_ns"),
        pl.col("size").alias("_freed"))
    delta = (pl.when(pl.col("kind") == "tensor_alloc").then(pl.col("size").fill_null(0).cast(pl.Int64))
             .otherwise(-pl.col("_freed").fill_null(0).cast(pl.Int64)))
    return (
        ev.join(ended, on=["pid", "device", "ptr", "ts_ns"], how="left")
        .with_columns(delta.alias("delta_bytes"))
        # frees sort before allocations at the same instant: a peak is only
        # reported when both tensors really coexisted
        .sort(["pid", "device", "ts_ns", "delta_bytes"])
        .with_columns(pl.col("delta_bytes").cum_sum().over("pid", "device").alias("live_bytes"))
        .with_columns(_held())
        .select(list(TIMELINE))
        .collect(engine="streaming")
    )


PEAKS = columns(
    PID, _DEVICE,
    ("peak_bytes", pl.Int64, "bytes", "the most tensor bytes held (allocator total where given)"),
    ("peak_ts_ns", pl.Int64, "ts", "when first reached"),
    ("reserved_at_peak_bytes", pl.UInt64, "bytes", "what the allocator reserved then (null: not given)"),
    ("end_bytes", pl.Int64, "bytes", "held at the last event"),
    ("tensors", pl.UInt32, "count", "tensors allocated during the capture"),
    ("allocated_total_bytes", pl.Int64, "bytes", "their bytes"),
    TOP_CALL_SITE,
)


def peak_rows(cap: Capture) -> pl.DataFrame:
    """tensor_peaks without its call sites."""
    return (
        tensor_timeline(cap).lazy().group_by("pid", "device")
        .agg(
            pl.col("held_bytes").max().alias("peak_bytes"),
            pl.col("ts_ns").get(pl.col("held_bytes").arg_max()).alias("peak_ts_ns"),
            pl.col("reserved_bytes").get(pl.col("held_bytes").arg_max()).alias("reserved_at_peak_bytes"),
            pl.col("held_bytes").last().alias("end_bytes"),
            (pl.col("kind") == "tensor_alloc").sum().alias("tensors"),
            pl.col("delta_bytes").clip(lower_bound=0).sum().alias("allocated_total_bytes"),
        )
        .sort("pid", "device")
        .collect(engine="streaming")
    )


def live_at_peak(cap: Capture, peaks: pl.DataFrame) -> pl.LazyFrame:
    """The tensors live at their (pid, device)'s peak, with call_site (null: no stack)."""
    live = (pl.col("alloc_ts_ns") <= pl.col("peak_ts_ns")) & (
        pl.col("free_ts_ns").is_null() | (pl.col("free_ts_ns") > pl.col("peak_ts_ns")))
    return with_site(tensor_lifetimes(cap), cap, None).join(
        peaks.lazy().select("pid", "device", "peak_ts_ns", "peak_bytes"), on=["pid", "device"]).filter(live)


@tool("tensor_peaks", "Tensor memory peaks", PEAKS, needs_tensors=True,
      description="per process and device: the most tensor bytes held, when, what was reserved then, and the call "
                  "site holding the most of it")
def tensor_peaks(cap: Capture) -> pl.DataFrame:
    """Per process and device: the peak of tensor bytes held, and when."""
    peaks = peak_rows(cap)
    held = top_site(live_at_peak(cap, peaks), ["pid", "device"], pl.col("size").sum(), pl.len())
    return peaks.lazy().join(held, on=["pid", "device"], how="left", maintain_order="left").select(
        list(PEAKS)).collect()


PEAK_SITES = columns(
    PID, _DEVICE,
    ("call_site", pl.String, "", f"the Python line that allocated; {NO_STACK}: none; {BEFORE}: bytes the "
                                 "allocator's total held that no tensor of the capture accounts for"),
    ("live_bytes", pl.Int64, "bytes", "its tensor bytes live at the peak"),
    ("tensors", pl.UInt32, "count", "its tensors live then (null for the bytes from before the capture)"),
    ("peak_ts_ns", pl.Int64, "ts", "the peak (tensor_peaks)"),
)


@tool("tensor_peak_call_sites", "Tensor memory held at the peak, by call site", PEAK_SITES, needs_tensors=True,
      description="tensor bytes live at each process and device's peak, by the Python line that allocated them")
def tensor_peak_call_sites(cap: Capture) -> pl.DataFrame:
    """Tensor bytes held at each (process, device)'s peak, by the Python line
    that allocated them, most first."""
    peaks = peak_rows(cap)
    by_site = (
        live_at_peak(cap, peaks).with_columns(pl.col("call_site").fill_null(NO_STACK))
        .group_by("pid", "device", "call_site")
        .agg(pl.col("size").sum().cast(pl.Int64).alias("live_bytes"), pl.len().alias("tensors"),
             pl.col("peak_ts_ns").first(), pl.col("peak_bytes").first())
    )
    before = (
        by_site.group_by("pid", "device")
        .agg((pl.col("peak_bytes").first() - pl.col("live_bytes").sum()).alias("live_bytes"), pl.col("peak_ts_ns").first())
        .filter(pl.col("live_bytes") > 0)
        .with_columns(pl.lit(BEFORE).alias("call_site"), pl.lit(None, pl.UInt32).alias("tensors"))
    )
    return (
        pl.concat([by_site.drop("peak_bytes"), before], how="diagonal_relaxed")
        .sort(["live_bytes", "pid", "device", "call_site"], descending=[True, False, False, False])
        .select([pl.col(c).cast(col.dtype) for c, col in PEAK_SITES.items()])
        .collect(engine="streaming")
    )


FRAGMENTATION = columns(
    PID, _DEVICE,
    ("peak_reserved_bytes", pl.UInt64, "bytes", "the most the allocator reserved from the driver"),
    ("allocated_at_peak_reserved_bytes", pl.UInt64, "bytes", "its allocated total then"),
    ("max_fragmentation_bytes", pl.Int64, "bytes", "the most reserved minus allocated: cached, not in a tensor"),
    ("max_fragmentation_ts_ns", pl.Int64, "ts", "when first reached"),
    ("max_fragmentation_share", pl.Float64, "share", "that much of what was reserved then"),
    ("end_fragmentation_bytes", pl.Int64, "bytes", "reserved minus allocated at the last event"),
)


@tool("tensor_fragmentation", "Tensor memory fragmentation (reserved - allocated)", FRAGMENTATION, needs_tensors=True,
      description="per process and device of a caching allocator: bytes reserved from the driver and not in a tensor, "
                  "at most and at the end")
def tensor_fragmentation(cap: Capture) -> pl.DataFrame:
    """Per process and device whose allocator reports its totals (the CUDA
    and ROCm caching allocators): reserved bytes against allocated bytes."""
    frag = (pl.col("reserved_bytes").cast(pl.Int64) - pl.col("allocated_bytes").cast(pl.Int64)).alias("_frag")
    top = pl.col("_frag").arg_max()
    return (
        tensor_timeline(cap).lazy()
        .filter(pl.col("reserved_bytes").is_not_null() & pl.col("allocated_bytes").is_not_null())
        .with_columns(frag)
        .group_by("pid", "device")
        .agg(
            pl.col("reserved_bytes").max().alias("peak_reserved_bytes"),
            pl.col("allocated_bytes").get(pl.col("reserved_bytes").arg_max()).alias("allocated_at_peak_reserved_bytes"),
            pl.col("_frag").max().alias("max_fragmentation_bytes"),
            pl.col("ts_ns").get(top).alias("max_fragmentation_ts_ns"),
            (pl.col("_frag").get(top) / pl.col("reserved_bytes").get(top)).alias("max_fragmentation_share"),
            pl.col("_frag").last().alias("end_fragmentation_bytes"),
        )
        .sort("pid", "device")
        .select(list(FRAGMENTATION))
        .collect(engine="streaming")
    )


NEVER_FREED = columns(
    PID, TID, _DEVICE, ("api", pl.String, "", "the probed function that reported it"),
    ("ptr", pl.UInt64, "handle", "its address"), ("size", pl.UInt64, "bytes", "its bytes"),
    ("alloc_ts_ns", pl.Int64, "ts", "when it was allocated"),
    ("age_ns", pl.Int64, "ns", "capture end minus allocation time"),
    ("call_site", pl.String, "", "the Python line that allocated it; null: no stack"),
    ("freed_at_exit", pl.Boolean, "", "freed only by the interpreter's finalization at exit"),
)


@tool("tensors_never_freed", "Tensors never freed by the end", NEVER_FREED, needs_tensors=True,
      description="tensors allocated during the capture and still live at its end, or freed only by the interpreter's "
                  "finalization at exit, largest first")
def tensors_never_freed(cap: Capture) -> pl.DataFrame:
    """Tensors allocated during the capture and still live at its end, or
    freed only when the interpreter finalized (what the program left), largest first."""
    _, end = bounds(cap)
    return (
        with_site(tensor_lifetimes(cap).filter(left_at_exit()), cap, None)
        .select("pid", "tid", "device", "api", pl.col("base").alias("ptr"), "size", "alloc_ts_ns",
                (pl.lit(end, pl.Int64) - pl.col("alloc_ts_ns")).alias("age_ns"), "call_site", "freed_at_exit")
        .sort(["size", "alloc_ts_ns", "pid", "ptr"], descending=[True, False, False, False])
        .collect(engine="streaming")
    )


LEAKS = columns(
    PID, _DEVICE, ("call_site", pl.String, "", f"the Python line that allocated; {NO_STACK}: none"),
    ("growth_bytes", pl.Int64, "bytes", "its tensor bytes live at the end minus those live at the capture's midpoint"),
    ("new_live_tensors", pl.UInt32, "count", "its tensors allocated after the midpoint and live at the end"),
    ("live_bytes", pl.Int64, "bytes", "its tensor bytes live at the end (or freed only at exit)"),
    ("live_tensors", pl.UInt32, "count", "its tensors live at the end (or freed only at exit)"),
    ("tensors", pl.UInt32, "count", "tensors it allocated during the capture"),
)


@tool("tensor_leaks", "Tensor leaks (call sites whose tensors pile up)", LEAKS, needs_tensors=True,
      description="call sites holding more tensor bytes at the end than at the capture's midpoint, through tensors "
                  "allocated in its second half and never freed")
def tensor_leaks(cap: Capture) -> pl.DataFrame:
    """Call sites whose tensors keep piling up: they hold more bytes at the
    end than at the capture's midpoint, through at least two tensors
    allocated in the second half and never freed.  (Tensors made once and
    kept, like a model's weights, hold steady and are not listed: see
    tensors_never_freed for every tensor left.)  Most growth first."""
    start, end = bounds(cap)
    mid = pl.lit(((start or 0) + (end or 0)) // 2, pl.Int64)
    at_end = left_at_exit()
    at_mid = (pl.col("alloc_ts_ns") <= mid) & (at_end | (pl.col("free_ts_ns") > mid))
    size = pl.col("size").cast(pl.Int64)
    return (
        with_site(tensor_lifetimes(cap), cap)
        .group_by("pid", "device", "call_site")
        .agg(
            (size.filter(at_end).sum() - size.filter(at_mid).sum()).alias("growth_bytes"),
            (at_end & (pl.col("alloc_ts_ns") > mid)).sum().alias("new_live_tensors"),
            size.filter(at_end).sum().alias("live_bytes"),
            at_end.sum().alias("live_tensors"),
            pl.len().alias("tensors"),
        )
        .filter((pl.col("growth_bytes") > 0) & (pl.col("new_live_tensors") >= 2))
        .sort(["growth_bytes", "pid", "device", "call_site"], descending=[True, False, False, False])
        .select([pl.col(c).cast(col.dtype) for c, col in LEAKS.items()])
        .collect(engine="streaming")
    )


def site_steps(cap: Capture) -> pl.LazyFrame:
    """+size at each tensor's allocation and -size at its free, with its
    call site (NO_STACK: none): pid, device, call_site, ts_ns, delta_bytes."""
    life = with_site(tensor_lifetimes(cap), cap)
    cols = ["pid", "device", "call_site"]
    return pl.concat([
        life.select(*cols, pl.col("alloc_ts_ns").alias("ts_ns"), pl.col("size").cast(pl.Int64).alias("delta_bytes")),
        life.filter(pl.col("free_ts_ns").is_not_null()).select(
            *cols, pl.col("free_ts_ns").alias("ts_ns"), -pl.col("size").cast(pl.Int64).alias("delta_bytes")),
    ])
