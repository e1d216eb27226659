"""Call sites: the Python line that made each call (the innermost frame of its
stack in stacks.parquet), and the analyses grouped by it: time blocked in
syncs, launches, bytes allocated and copied per line; the memory held at
each process's peak and the leaks, by the line that allocated them.

Events without a stack (no Python, --no-stacks, or a lost stack) group under
the call site NO_STACK, so every table still adds up to the whole capture."""

from __future__ import annotations

import polars as pl

from .. import lifetimes, merge
from ..call_result import done
from ..read import Capture
from .exprs import measured_sum
from .memory import memory_peaks
from .registry import Tool

NO_STACK = "(no stack)"


def sites(cap: Capture) -> pl.LazyFrame:
    """(pid, stack_id) -> call_site "file:line function", from each stack's innermost frame."""
    return cap.stacks.filter(pl.col("depth") == 0).select(
        "pid", "stack_id",
        pl.format("{}:{} {}", pl.col("file").fill_null("?"), pl.col("line").cast(pl.String).fill_null("?"),
                  pl.col("function").fill_null("?")).alias("call_site"),
    ).unique(["pid", "stack_id"])


def with_call_site(frame: pl.LazyFrame, cap: Capture) -> pl.LazyFrame:
    """``frame`` (with pid and stack_id) plus its call_site column."""
    return frame.join(sites(cap), on=["pid", "stack_id"], how="left").with_columns(
        pl.col("call_site").fill_null(NO_STACK))


def allocations_with_stack(cap: Capture) -> pl.LazyFrame:
    """Allocation instances with the stack of the call that made them (same
    process, thread and entry time as its event)."""
    calls = cap.events.filter(pl.col("kind") == "alloc").select(
        "pid", "tid", pl.col("ts_ns").alias("alloc_ts_ns"), "stack_id").unique(["pid", "tid", "alloc_ts_ns"])
    allocs = merge.allocations(cap).filter(pl.col("kind") != "host")
    return with_call_site(allocs.join(calls, on=["pid", "tid", "alloc_ts_ns"], how="left"), cap)


def by_call_site(cap: Capture) -> pl.DataFrame:
    ev = with_call_site(cap.events, cap)
    kind = pl.col("kind")
    alloc = (kind == "alloc") & done()
    memory = lifetimes.memory(lifetimes.kind_from_api(pl.col("api")))
    return (
        ev.group_by("pid", "call_site")
        .agg(
            pl.len().alias("calls"),
            (kind == "launch").sum().alias("launches"),
            # a failed call allocated or copied nothing; device and pinned host memory apart
            pl.col("size").filter(alloc & (memory == "device")).sum().alias("device_alloc_bytes"),
            pl.col("size").filter(alloc & (memory == "pinned host")).sum().alias("pinned_alloc_bytes"),
            pl.col("size").filter((kind == "memcpy") & done()).sum().alias("copied_bytes"),
            (kind == "sync").sum().alias("syncs"),
            measured_sum(pl.col("dur_ns").filter(kind == "sync")).alias("blocked_ns"),
        )
        .sort([pl.col("blocked_ns"), pl.col("call_site") == NO_STACK, "calls", "pid", "call_site"],
              descending=[True, False, True, False, False], nulls_last=True)
        .collect(engine="streaming")
    )


def live_at_peak(cap: Capture) -> pl.LazyFrame:
    """The device allocations live at their process's peak of live bytes
    (allocations_with_stack's columns, plus peak_ts_ns)."""
    peaks = memory_peaks(cap).lazy().filter(pl.col("api") == "all").select("pid", "peak_ts_ns")
    return (allocations_with_stack(cap).join(peaks, on="pid")
            .filter((pl.col("alloc_ts_ns") <= pl.col("peak_ts_ns"))
                    & (pl.col("free_ts_ns").is_null() | (pl.col("free_ts_ns") > pl.col("peak_ts_ns")))))


def peak_by_call_site(cap: Capture) -> pl.DataFrame:
    """Device bytes live at each process's peak, by the line that allocated them."""
    return (
        live_at_peak(cap).group_by("pid", "call_site")
        .agg(pl.col("size").sum().alias("live_bytes"), pl.len().alias("allocations"), pl.col("peak_ts_ns").first())
        .sort(["live_bytes", "pid", "call_site"], descending=[True, False, False])
        .collect(engine="streaming")
    )


def leaks_by_call_site(cap: Capture) -> pl.DataFrame:
    return (
        allocations_with_stack(cap).filter(pl.col("free_ts_ns").is_null())
        .group_by("pid", "call_site")
        .agg(pl.col("size").sum().alias("leaked_bytes"), pl.len().alias("allocations"))
        .sort(["leaked_bytes", "pid", "call_site"], descending=[True, False, False])
        .collect(engine="streaming")
    )


def top_stacks(cap: Capture, limit: int) -> pl.DataFrame:
    """The ``limit`` stacks with the most time blocked in syncs, then the most
    calls: one row per frame (pid, stack_id, calls, blocked_ns, depth,
    function, file, line, truncated), innermost frame first."""
    ev = cap.events.filter(pl.col("stack_id").is_not_null()).group_by("pid", "stack_id").agg(
        pl.len().alias("calls"), measured_sum(pl.col("dur_ns").filter(pl.col("kind") == "sync")).alias("blocked_ns"),
        pl.col("api").cast(pl.String).unique().sort().str.join(", ").alias("apis"))
    top = ev.sort(["blocked_ns", "calls", "pid", "stack_id"], descending=[True, True, False, False],
                  nulls_last=True).head(limit).with_row_index("rank")
    return (
        top.join(cap.stacks, on=["pid", "stack_id"])
        .sort("rank", "depth")
        .select("rank", "pid", "stack_id", "apis", "calls", "blocked_ns", "depth", "function", "file", "line",
                "truncated")
        .collect()
    )


def render_stacks(frame: pl.DataFrame) -> str:
    """Each stack in full, innermost frame first, as a traceback reads bottom-up."""
    out = []
    for (rank, pid, sid), rows in frame.group_by("rank", "pid", "stack_id", maintain_order=True):
        first = rows.row(0, named=True)
        blocked = "" if first["blocked_ns"] is None else f", {first['blocked_ns'] / 1e3:,.1f} µs blocked"
        out.append(f"#{rank + 1}  PID {pid}  {first['apis']}: {first['calls']} calls{blocked}")
        for f in rows.iter_rows(named=True):  # a stack's frames, not the events: tens of rows
            out.append(f"    {f['function'] or '?'}  {f['file'] or '?'}:{f['line'] if f['line'] is not None else '?'}")
        if first["truncated"]:
            out.append("    ... (truncated at --stack-depth)")
    return "\n".join(out) if out else "no stacks in this capture (recorded with --no-stacks, or no Python callers)"


TOOLS = [
    Tool(
        name="call_sites",
        title="Call sites (the Python line of each call)",
        compute=by_call_site,
        description="per process and Python line: calls, launches, device and pinned host bytes allocated, "
                    "bytes copied, syncs and time blocked in them; (no stack) gathers the calls without one",
    ),
    Tool(
        name="peak_call_sites",
        title="Memory held at the peak, by call site",
        compute=peak_by_call_site,
        description="device bytes live at each process's peak of live bytes, by the Python line that allocated them",
    ),
    Tool(
        name="leak_call_sites",
        title="Leaks by call site",
        compute=leaks_by_call_site,
        description="allocations never freed before the capture ended, by the Python line that made them",
    ),
]
