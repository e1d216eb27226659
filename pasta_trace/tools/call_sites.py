"""Call sites: every call grouped by the line that made it (the user's line
of its stack in stacks.parquet, or its innermost frame: tools.sites):
allocations and frees, the other API calls, launches, bytes allocated (device,
pinned host, tensors) and copied, and time blocked in syncs per line; and the
top stacks in full for `report --stacks`.  Each analysis's own view by call
site sits beside it (sync_call_sites, kernel_call_sites, transfer_call_sites, ...).

Tensor allocations and frees are read from one source per process and
device (tools.tensors.tensor_events), never summed with the driver's.

Events without a stack (no Python, --no-stacks, or a lost stack) group under
the call site NO_STACK, so every table still adds up to the whole capture."""

from __future__ import annotations

import polars as pl

from .. import lifetimes
from ..call_result import done
from ..read import Capture
from .common import measured_sum
from .render import human_bytes
from .registry import PID, columns, tool
from .sites import NO_STACK, site_depth, with_site
from .tensors import TENSOR_KINDS, tensor_events

CALL_SITES = columns(
    PID, ("call_site", pl.String, "", "the Python line (file:line function); (no stack): calls without one"),
    ("allocations", pl.UInt32, "count", "allocations it made: driver/runtime calls and tensors"),
    ("frees", pl.UInt32, "count", "frees it made: driver/runtime calls and tensors"),
    ("tensor_alloc_bytes", pl.UInt64, "bytes", "tensor memory allocated (PyTorch's allocators)"),
    ("calls", pl.UInt32, "count", "API calls other than allocations and frees"),
    ("launches", pl.UInt32, "count", "kernel launches among them"),
    ("device_alloc_bytes", pl.UInt64, "bytes", "device memory allocated (successful calls)"),
    ("pinned_alloc_bytes", pl.UInt64, "bytes", "pinned host memory allocated (successful calls)"),
    ("copied_bytes", pl.UInt64, "bytes", "bytes copied (successful calls)"),
    ("syncs", pl.UInt32, "count", "synchronising calls"),
    ("blocked_ns", pl.Int64, "ns", "time blocked in them (null: none measured)"),
)


def _per_stack(cap: Capture) -> pl.LazyFrame:
    """API calls and tensor events summed per (pid, stack, kind, API): integer
    and category keys over millions of calls."""
    ok = done()
    calls = cap.events.filter(~pl.col("kind").cast(pl.String).is_in(TENSOR_KINDS)).group_by(
        "pid", "stack_id", pl.col("kind").cast(pl.String), pl.col("api").cast(pl.String)).agg(
        pl.len().alias("calls"),
        pl.col("size").filter(ok).sum().alias("_ok_size"),  # a failed call allocated or copied nothing
        pl.col("dur_ns").sum().alias("_dur"),
        pl.col("dur_ns").count().alias("_measured"),
    )
    tensors = tensor_events(cap).group_by("pid", "stack_id", "kind", "api").agg(
        pl.len().alias("calls"), pl.col("size").sum().alias("_ok_size"),
        pl.lit(0, pl.Int64).alias("_dur"), pl.lit(0, pl.UInt32).alias("_measured"))
    return pl.concat([calls, tensors], how="vertical_relaxed")


@tool("call_sites", "Call sites (the Python line of each call)", CALL_SITES,
      description="per process and line (the user's, or the innermost with --call-site innermost): allocations and "
                  "frees, tensor bytes allocated, other calls, launches, device and pinned host bytes allocated, "
                  "bytes copied, syncs and time blocked in them; (no stack) gathers the calls without one")
def by_call_site(cap: Capture) -> pl.DataFrame:
    """Per process and line: most time blocked first, then most bytes
    allocated, then most calls."""
    # what depends on the API's name (device or pinned host memory) is worked
    # out once per (stack, kind, API) group, and the groups summed per line
    kind = pl.col("kind")
    alloc = kind == "alloc"
    memory = lifetimes.memory(lifetimes.kind_from_api(pl.col("api")))
    sync = kind == "sync"
    n = pl.col("calls")
    d = CALL_SITES
    return (
        with_site(_per_stack(cap), cap)
        .group_by("pid", "call_site")
        .agg(
            n.filter(kind.is_in(["alloc", "tensor_alloc"])).sum().cast(d["allocations"].dtype).alias("allocations"),
            n.filter(kind.is_in(["free", "tensor_free"])).sum().cast(d["frees"].dtype).alias("frees"),
            pl.col("_ok_size").filter(kind == "tensor_alloc").sum().cast(d["tensor_alloc_bytes"].dtype)
            .alias("tensor_alloc_bytes"),
            n.filter(~kind.is_in(["alloc", "free", "tensor_alloc", "tensor_free"])).sum().cast(d["calls"].dtype)
            .alias("calls"),
            n.filter(kind == "launch").sum().cast(d["launches"].dtype).alias("launches"),
            pl.col("_ok_size").filter(alloc & (memory == "device")).sum().cast(d["device_alloc_bytes"].dtype)
            .alias("device_alloc_bytes"),
            pl.col("_ok_size").filter(alloc & (memory == "pinned host")).sum().cast(d["pinned_alloc_bytes"].dtype)
            .alias("pinned_alloc_bytes"),
            pl.col("_ok_size").filter(kind == "memcpy").sum().cast(d["copied_bytes"].dtype).alias("copied_bytes"),
            n.filter(sync).sum().cast(d["syncs"].dtype).alias("syncs"),
            pl.when(pl.col("_measured").filter(sync).sum() > 0).then(pl.col("_dur").filter(sync).sum())
            .alias("blocked_ns"),
        )
        .with_columns((pl.col("device_alloc_bytes") + pl.col("pinned_alloc_bytes") + pl.col("tensor_alloc_bytes"))
                      .alias("_bytes"), (pl.col("allocations") + pl.col("frees") + pl.col("calls")).alias("_n"))
        .sort([pl.col("blocked_ns"), pl.col("call_site") == NO_STACK, "_bytes", "_n", "pid", "call_site"],
              descending=[True, False, True, True, False, False], nulls_last=True)
        .select(list(CALL_SITES))
        .collect(engine="streaming")
    )


def render_call_sites(frame: pl.DataFrame) -> pl.DataFrame:
    """The table as the terminal shows it: the count and byte columns that
    are zero (or unmeasured) on every row are left out (a tensor capture
    made no launch, copy or sync)."""
    keep = [c for c in frame.columns
            if c in ("pid", "call_site") or frame[c].fill_null(0).cast(pl.Int64).abs().sum() > 0]
    return frame.select(keep)


#: --stacks: the views whose stacks it ranks, and by what
STACK_VIEWS = ("bytes", "time")


def _stack_weights(cap: Capture, by: str) -> pl.LazyFrame:
    """(pid, stack_id, weight, calls, apis) of the calls that weigh in view ``by``:
    bytes allocated (driver, pinned and tensor memory) or time blocked in syncs."""
    ev = cap.events.filter(pl.col("stack_id").is_not_null())
    if by == "time":
        w = ev.filter(pl.col("kind") == "sync").select(
            "pid", "stack_id", pl.col("api").cast(pl.String), pl.col("dur_ns").alias("weight"))
    else:
        driver = ev.filter((pl.col("kind") == "alloc") & done()).select(
            "pid", "stack_id", pl.col("api").cast(pl.String), pl.col("size").cast(pl.Int64).alias("weight"))
        tensors = tensor_events(cap).filter(pl.col("kind") == "tensor_alloc").select(
            "pid", "stack_id", "api", pl.col("size").cast(pl.Int64).alias("weight"))
        w = pl.concat([driver, tensors.filter(pl.col("stack_id").is_not_null())])
    return w.group_by("pid", "stack_id").agg(
        pl.len().alias("calls"), measured_sum(pl.col("weight")).alias("weight"),
        pl.col("api").unique().sort().str.join(", ").alias("apis"))


def top_stacks(cap: Capture, limit: int, by: str = "bytes") -> pl.DataFrame:
    """The ``limit`` stacks that weigh most in view ``by`` ("bytes": bytes
    allocated; "time": time blocked in syncs), then the most calls: one row
    per frame (rank, pid, stack_id, apis, calls, weight, depth, function,
    file, line, truncated, site: the frame that names the call site),
    innermost frame first."""
    if by not in STACK_VIEWS:
        raise ValueError(f"stacks by {by!r}: one of {', '.join(STACK_VIEWS)}")
    top = (_stack_weights(cap, by).filter(pl.col("weight") > 0)
           .sort(["weight", "calls", "pid", "stack_id"], descending=[True, True, False, False])
           .head(limit).with_row_index("rank"))
    return (
        top.join(cap.stacks, on=["pid", "stack_id"])
        .join(site_depth(cap), on=["pid", "stack_id"], how="left")
        .with_columns((pl.col("depth") == pl.col("site_depth")).alias("site"))
        .sort("rank", "depth")
        .select("rank", "pid", "stack_id", "apis", "calls", "weight", "depth", "function", "file", "line",
                "truncated", "site")
        .collect()
    )


def render_stacks(frame: pl.DataFrame, by: str = "bytes") -> str:
    """Each stack in full, innermost frame first, as a traceback reads
    bottom-up; ">" marks the frame that names its call site."""
    out = []
    for (rank, pid, sid), rows in frame.group_by("rank", "pid", "stack_id", maintain_order=True):
        first = rows.row(0, named=True)
        w = first["weight"]
        weight = (f", {human_bytes(w)} allocated" if by == "bytes"
                  else f", {w / 1e3:,.1f} µs blocked" if w is not None else "")
        out.append(f"#{rank + 1}  PID {pid}  {first['apis']}: {first['calls']} calls{weight}")
        for f in rows.iter_rows(named=True):  # a stack's frames, not the events: tens of rows
            mark = ">" if f["site"] else " "
            out.append(f"  {mark} {f['function'] or '?'}  {f['file'] or '?'}:"
                       f"{f['line'] if f['line'] is not None else '?'}")
        if first["truncated"]:
            out.append("    ... (truncated at --stack-depth)")
    return "\n".join(out) if out else "none"
