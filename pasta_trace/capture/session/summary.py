"""The short summary printed at the end of a capture (on stderr)."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Sequence

import polars as pl

from ... import schema
from ...call_result import api_errors, calls, done
from ...lifetimes import (
    MEMORY_NAMES,
    RELEASE_APIS,
    aggregate_totals,
    has_address,
    host_allocs,
    host_frees,
    pair,
    totals,
)
from ...parquet_scan import scan_events


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def top_kernels(calls: pl.LazyFrame, names: pl.DataFrame, n: int = 5) -> list[tuple[int, str]]:
    """(launches, name) of the most launched kernels (call_result.calls rows);
    unnamed handles are shown as unknown@0x<handle>."""
    by_handle = names.group_by("pid", "handle").agg(pl.col("name").first())
    top = (
        calls.filter((pl.col("kind") == "launch") & done())
        .group_by("pid", "func")
        .agg(pl.col("count").sum().alias("launches"))
        .collect()
        .join(by_handle, left_on=["pid", "func"], right_on=["pid", "handle"], how="left")
        .with_columns(pl.when(pl.col("name").is_null()).then(pl.col("func")).alias("unnamed"))
        .group_by("name", "unnamed")
        .agg(pl.col("launches").sum())
        .sort(["launches", "name", "unnamed"], descending=[True, False, False], nulls_last=True)
        .head(n)
    )
    return [
        (launches, name if name is not None else f"unknown@0x{handle or 0:x}")
        for name, handle, launches in top.select("name", "unnamed", "launches").iter_rows()
    ]


def unnamed_lines(names: pl.DataFrame, width: int = 80) -> list[str]:
    """"3 launched kernel handles have no name: <reason>", one per reason
    (names.parquet keeps it per handle), wrapped to ``width`` columns."""
    if "reason" not in names.columns or names.is_empty():
        return []
    per_reason = (
        names.filter(pl.col("reason").is_not_null()).group_by("reason")
        .agg(pl.struct("pid", "handle").n_unique().alias("n")).sort(["n", "reason"], descending=[True, False])
    )
    return [line for reason, n in per_reason.iter_rows()
            for line in textwrap.wrap(f"{n:,} kernel handle{'s have' if n != 1 else ' has'} no name: {reason}",
                                      width, subsequent_indent="  ")]


#: failed-call lines shown before pointing at the report
FAILURE_LINES = 8


def failures(calls: pl.LazyFrame, out_dir: Path) -> list[str]:
    """"209 of 209 cuMemAlloc_v2 calls failed: CUDA_ERROR_NOT_INITIALIZED",
    one line per API with failed calls, all processes together."""
    per_code = (
        api_errors(calls).group_by("api", "error")
        .agg(pl.col("failed").sum(), pl.col("ret").first())
        .sort(["api", "failed", "ret"], descending=[False, True, False])
    )
    per_api = (
        per_code.group_by("api", maintain_order=True)
        .agg(
            pl.col("failed").sum().alias("n"),
            pl.when(pl.len() == 1).then(pl.col("error").first())
            .otherwise(pl.format("{} {}", "error", "failed").str.join(", ")).alias("errors"),
        )
        .join(calls.group_by(pl.col("api").cast(pl.String)).agg(pl.col("count").sum().alias("calls")),
              on="api", how="left")
        .sort(["n", "api"], descending=[True, False])
        .collect()
    )
    lines = [f"{n:,} of {total:,} {api} calls failed: {errors}"
             for api, n, errors, total in per_api.head(FAILURE_LINES).iter_rows()]
    if per_api.height > FAILURE_LINES:
        lines.append(f"... and {per_api.height - FAILURE_LINES} more APIs with failed calls: "
                     f"pasta-trace report {out_dir} --tool api_errors")
    return lines


def _memory_line(what: str, row: dict | None, freed_known: bool) -> str:
    if row is None:
        return f"{what}: none allocated"
    n = row["allocations"]
    text = f"{what}: allocated {_human(row['allocated_bytes'])} in {n:,} allocation{'' if n == 1 else 's'}"
    if freed_known:
        text += f", freed {_human(row['freed_bytes'])}, held at the end {_human(row['held_bytes'])}"
    return text


def paired(events: pl.LazyFrame) -> pl.LazyFrame:
    """The allocations of ``events`` with the free that ended each, paired
    apart in their own spaces as merge.allocations does: VMM physical memory
    by its handle, released only by a release of that handle, and every other
    allocation by its address, freed by a free (never a release) of it.  A
    handle and an address are different things that may hold the same value."""
    allocs, frees = host_allocs(events), host_frees(events)
    handle = ~has_address()
    release = pl.col("free_api").cast(pl.String).is_in(RELEASE_APIS)
    return pl.concat([pair(allocs.filter(handle), frees.filter(release)),
                      pair(allocs.filter(~handle), frees.filter(~release))], how="vertical_relaxed")


def byte_lines(events: pl.LazyFrame, aggregate: pl.LazyFrame | None) -> list[str]:
    """Bytes by what they count: device memory, pinned host memory, copies.
    Failed calls count nowhere.  From the events, each free releases its own
    allocation's bytes (paired); --aggregate keeps no per-free sizes."""
    if aggregate is None:
        per_pid = totals(paired(events))
    else:
        per_pid = aggregate_totals(aggregate)
    copied_from = calls(events if aggregate is None else aggregate)
    by_memory = {r["memory"]: r for r in per_pid.group_by("memory").agg(pl.all().exclude("pid", "memory").sum())
                 .collect().iter_rows(named=True)}
    copied = copied_from.filter((pl.col("kind") == "memcpy") & done()).select(pl.col("bytes").sum()).collect().item()
    lines = [_memory_line(f"{m} memory", by_memory.get(m), aggregate is None) for m in MEMORY_NAMES]
    lines.append(f"copied: {_human(int(copied or 0))}"
                 + (" (--aggregate keeps no per-free sizes)" if aggregate is not None else ""))
    return lines


def tensor_lines(events: pl.LazyFrame, out_dir: Path) -> list[str]:
    """Tensor memory per device (PyTorch's allocators, one source per process
    and device as the tools read it): allocated, peak, held at the end, and
    what the program left to the interpreter's finalization; none without
    tensor events."""
    from ...tensor_source import device_totals

    lines = []
    for r in device_totals(events).iter_rows(named=True):
        n = r["tensors"]
        lines.append(f"tensor memory on {r['device']}: allocated {_human(r['allocated_bytes'])} in {n:,} "
                     f"tensor{'' if n == 1 else 's'}, peak {_human(r['peak_bytes'])}, held at the end "
                     f"{_human(r['end_bytes'])}")
        if r["at_exit"]:
            k = r["at_exit"]
            lines.append(f"  freed only at exit: {_human(r['at_exit_bytes'])} in {k:,} tensor{'' if k == 1 else 's'}"
                         f" (left by the program: pasta-trace report {out_dir} --tool tensors_never_freed)")
    return lines


def loss_lines(lost: dict[str, int], settings: dict[str, int]) -> list[str]:
    """Each loss that counted (schema.LOSSES): how many of what, and why, then
    what cures it, with the option's value now; "lost: 0" when nothing was."""
    lines = []
    for loss in schema.LOSSES:
        if n := lost.get(loss.name, 0):
            now = f" (now {settings[loss.flag]})" if loss.flag in settings else ""
            lines += [f"LOST: {n:,} {loss.what}: {loss.meaning}", f"  {loss.remedy}{now}"]
    return lines or ["lost: 0"]


def known_full_line(counts: dict) -> list[str]:
    n = counts.get("known_full", 0)
    if not n:
        return []
    return [f"{n:,} library files with probes did not fit the kernel's known-files table: "
            "each later open of one paused its process for a moment"]


def tally_lines(counts: dict) -> list[str]:
    """Calls the probes handled without an event on purpose (schema.TALLIES): not losses."""
    return [f"{n:,} {t.summary}" for t in schema.TALLIES if (n := counts.get(t.name, 0))]


#: manifest notes shown before pointing at the manifest
NOTE_LINES = 5


def render(out_dir: Path, by_kind: dict[str, int], names: pl.DataFrame, counts: dict,
           settings: dict[str, int], notes: Sequence[str] = ()) -> str:
    """``counts``: the manifest's; ``settings``: Options.settings (the values
    the loss remedies name); ``notes``: the manifest's warnings."""
    events = scan_events(sorted(Path(out_dir).glob("events*.parquet")))
    lines = []
    agg_path = Path(out_dir) / "aggregate.parquet"
    aggregate = pl.scan_parquet(agg_path) if agg_path.exists() else None
    if aggregate is not None:  # --aggregate: counts kept in the kernel, no events
        counted = aggregate.group_by(pl.col("kind").cast(pl.String)).agg(pl.col("count").sum()).collect()
        by_kind = {k: 0 for k in schema.KIND_NAMES} | dict(counted.iter_rows())
        what = "calls counted in the kernel (--aggregate)"
    else:
        what = "events"
    all_calls = calls(events if aggregate is None else aggregate)
    total = sum(by_kind.values())
    kinds = ", ".join(f"{k} {v:,}" for k, v in by_kind.items() if v)
    lines.append(f"{total:,} {what}" + (f": {kinds}" if kinds else ""))
    top = top_kernels(all_calls, names)
    if top:
        lines.append("top kernels by launches:")
        lines += [f"  {launches:>10,}  {name}" for launches, name in top]
    lines += unnamed_lines(names)
    lines += failures(all_calls, Path(out_dir))
    lines += byte_lines(events, aggregate)
    if aggregate is None:
        lines += tensor_lines(events, Path(out_dir))
    lines += known_full_line(counts)
    lines += tally_lines(counts)
    lines += loss_lines({loss.name: loss.count_in(counts) for loss in schema.LOSSES}, settings)
    lines += [f"warning: {note}" for note in notes[:NOTE_LINES]]
    if len(notes) > NOTE_LINES:
        lines.append(f"... and {len(notes) - NOTE_LINES} more warnings in {Path(out_dir) / 'manifest.json'}")
    return "\n".join(lines)


def device_line(backend: str | None, files: list[str]) -> str | None:
    """What --device recorded: said even when it is nothing, which is never silent."""
    if backend is None:
        return None
    if not files:
        return (f"device (--device {backend}): nothing recorded (the command made no GPU work the backend saw, "
                "or the backend did not load in it)")
    return f"device (--device {backend}): {len(files)} file{'' if len(files) == 1 else 's'} in device/"
