"""Call sites: every call grouped by the Python line that made it (the
innermost frame of its stack in stacks.parquet): calls, launches, bytes
allocated and copied, and time blocked in syncs per line; and the top stacks
in full for `report --stacks`.  Each analysis's own view by call site sits
beside it (sync_call_sites, kernel_call_sites, transfer_call_sites, ...).

Events without a stack (no Python, --no-stacks, or a lost stack) group under
the call site NO_STACK, so every table still adds up to the whole capture."""

from __future__ import annotations

import polars as pl

from .. import lifetimes
from ..call_result import done
from ..read import Capture
from .exprs import measured_sum
from .registry import PID, Tool, columns, returns
from .sites import NO_STACK, with_site

CALL_SITES = columns(
    PID, ("call_site", pl.String, "", "the Python line (file:line function); (no stack): calls without one"),
    ("calls", pl.UInt32, "count", "API calls it made"),
    ("launches", pl.UInt32, "count", "kernel launches among them"),
    ("device_alloc_bytes", pl.UInt64, "bytes", "device memory allocated (successful calls)"),
    ("pinned_alloc_bytes", pl.UInt64, "bytes", "pinned host memory allocated (successful calls)"),
    ("copied_bytes", pl.UInt64, "bytes", "bytes copied (successful calls)"),
    ("syncs", pl.UInt32, "count", "synchronising calls"),
    ("blocked_ns", pl.Int64, "ns", "time blocked in them (null: none measured)"),
)


@returns(CALL_SITES)
def by_call_site(cap: Capture) -> pl.DataFrame:
    """Per process and Python line, most time blocked first, then most calls."""
    # summed per (stack, kind, API) first: integer and category keys over millions of
    # calls; what depends on the API's name (device or pinned host memory) is then
    # worked out once per group, and the groups summed per line: every column is a
    # count or an integer sum
    ok = done()
    per_stack = cap.events.group_by("pid", "stack_id", "kind", "api").agg(
        pl.len().alias("calls"),
        pl.col("size").filter(ok).sum().alias("_ok_size"),  # a failed call allocated or copied nothing
        pl.col("dur_ns").sum().alias("_dur"),
        pl.col("dur_ns").count().alias("_measured"),
    )
    kind = pl.col("kind")
    alloc = kind == "alloc"
    memory = lifetimes.memory(lifetimes.kind_from_api(pl.col("api")))
    sync = kind == "sync"
    d = CALL_SITES
    return (
        with_site(per_stack, cap)
        .group_by("pid", "call_site")
        .agg(
            pl.col("calls").sum().cast(d["calls"].dtype),
            pl.col("calls").filter(kind == "launch").sum().cast(d["launches"].dtype).alias("launches"),
            pl.col("_ok_size").filter(alloc & (memory == "device")).sum().cast(d["device_alloc_bytes"].dtype)
            .alias("device_alloc_bytes"),
            pl.col("_ok_size").filter(alloc & (memory == "pinned host")).sum().cast(d["pinned_alloc_bytes"].dtype)
            .alias("pinned_alloc_bytes"),
            pl.col("_ok_size").filter(kind == "memcpy").sum().cast(d["copied_bytes"].dtype).alias("copied_bytes"),
            pl.col("calls").filter(sync).sum().cast(d["syncs"].dtype).alias("syncs"),
            pl.when(pl.col("_measured").filter(sync).sum() > 0).then(pl.col("_dur").filter(sync).sum())
            .alias("blocked_ns"),
        )
        .sort([pl.col("blocked_ns"), pl.col("call_site") == NO_STACK, "calls", "pid", "call_site"],
              descending=[True, False, True, False, False], nulls_last=True)
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
]
