"""The short summary printed at the end of a capture (on stderr)."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from .. import schema


def _human(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def top_kernels(events: pl.LazyFrame, names: pl.DataFrame, n: int = 5) -> list[tuple[int, str]]:
    """(launches, name) of the most launched kernels; unnamed handles are
    shown as unknown@0x<handle>."""
    by_handle = names.group_by("pid", "handle").agg(pl.col("name").first())
    weight = pl.col("count").sum() if "count" in events.collect_schema() else pl.len()
    top = (
        events.filter(pl.col("kind") == "launch")
        .group_by("pid", "func")
        .agg(weight.cast(pl.UInt64).alias("launches"))
        .collect()
        .join(by_handle, left_on=["pid", "func"], right_on=["pid", "handle"], how="left")
        .with_columns(pl.when(pl.col("name").is_null()).then(pl.col("func")).alias("unnamed"))
        .group_by("name", "unnamed")
        .agg(pl.col("launches").sum())
        .sort("launches", descending=True, maintain_order=True)
        .head(n)
    )
    return [
        (launches, name if name is not None else f"unknown@0x{handle or 0:x}")
        for name, handle, launches in top.select("name", "unnamed", "launches").iter_rows()
    ]


def byte_totals(events: pl.LazyFrame) -> dict[str, int]:
    """Bytes allocated, freed (sizes of the allocations the frees release) and copied."""
    allocs = events.filter((pl.col("kind") == "alloc") & pl.col("ptr").is_not_null())
    freed = (
        events.filter(pl.col("kind") == "free")
        .select("pid", "ptr")
        .join(allocs.group_by("pid", "ptr").agg(pl.col("size").last()), on=["pid", "ptr"], how="inner")
        .select(pl.col("size").sum())
    )
    return {
        "allocated": int(allocs.select(pl.col("size").sum()).collect().item() or 0),
        "freed": int(freed.collect().item() or 0),
        "copied": int(events.filter(pl.col("kind") == "memcpy").select(pl.col("size").sum()).collect().item() or 0),
    }


def _kind_bytes(aggregate: pl.LazyFrame, kind: str) -> int:
    return int(aggregate.filter(pl.col("kind") == kind).select(pl.col("bytes").sum()).collect().item() or 0)


def render(out_dir: Path, by_kind: dict[str, int], names: pl.DataFrame, lost: tuple[int, int, int],
           buffer_pages: int) -> str:
    files = sorted(Path(out_dir).glob("events*.parquet"))
    events = (
        pl.scan_parquet([str(f) for f in files]) if files else schema.empty_frame(schema.EVENTS_SCHEMA).lazy()
    )
    lines = []
    aggregate = Path(out_dir) / "aggregate.parquet"
    if aggregate.exists():  # --aggregate: counts kept in the kernel, no events
        events = pl.scan_parquet(aggregate)
        counted = events.group_by(pl.col("kind").cast(pl.String)).agg(pl.col("count").sum()).collect()
        by_kind = {k: 0 for k in schema.KIND_NAMES} | dict(counted.iter_rows())
        what = "calls counted in the kernel (--aggregate)"
    else:
        what = "events"
    total = sum(by_kind.values())
    kinds = ", ".join(f"{k} {v:,}" for k, v in by_kind.items() if v)
    lines.append(f"{total:,} {what}" + (f": {kinds}" if kinds else ""))
    top = top_kernels(events, names)
    if top:
        lines.append("top kernels by launches:")
        lines += [f"  {launches:>10,}  {name}" for launches, name in top]
    if aggregate.exists():
        lines.append(f"bytes: allocated {_human(_kind_bytes(events, 'alloc'))}, "
                     f"copied {_human(_kind_bytes(events, 'memcpy'))} (--aggregate keeps no per-free sizes)")
    else:
        b = byte_totals(events)
        lines.append(f"bytes: allocated {_human(b['allocated'])}, freed {_human(b['freed'])}, "
                     f"copied {_human(b['copied'])}")
    lost_total = lost[0] + lost[1]
    if lost_total or lost[2]:
        lines.append(
            f"LOST: {lost[0]:,} events, {lost[1]:,} names, {lost[2]:,} calls without their return "
            f"(in-flight table full): raise --buffer-pages (now {buffer_pages})"
        )
    else:
        lines.append("lost: 0")
    return "\n".join(lines)
