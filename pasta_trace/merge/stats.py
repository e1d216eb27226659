"""What the merge matched and what it could not: never dropped silently."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import polars as pl

from ..read import Capture
from .kernels import device_executions, kernel_executions
from .pages import alloc_touches, attributed_pages, hotness


@dataclass(frozen=True)
class MergeStats:
    host_launches: int
    device_executions: int
    matched: int
    matched_exact: int
    matched_time: int
    #: host launches of processes with device data that found no execution
    unmatched_host: int
    #: device executions that found no host launch
    unmatched_device: int
    pages: int
    unattributed_pages: int  # page rows no live allocation holds
    alloc_touches: int
    unattributed_touches: int
    samples: int
    unattributed_samples: int  # access samples no live allocation holds

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def lines(self) -> list[str]:
        out = [f"kernel launches: {self.host_launches} on the host, {self.device_executions} on the device"]
        if self.device_executions or self.matched:
            out.append(
                f"  matched {self.matched} ({self.matched_exact} exact, {self.matched_time} by time); "
                f"unmatched: {self.unmatched_host} host, {self.unmatched_device} device"
            )
        if self.pages:
            out.append(f"pages: {self.pages}, {self.unattributed_pages} not in a live allocation")
        if self.alloc_touches:
            out.append(f"allocation touches: {self.alloc_touches}, {self.unattributed_touches} unresolved")
        if self.samples:
            out.append(f"access samples: {self.samples}, {self.unattributed_samples} not in a live allocation")
        return out


def saved_stats(saved: object) -> tuple[dict[str, int] | None, list[str]]:
    """The statistics a timeline saved, as MergeStats fields, and notes.
    Fields written by a newer minor version are ignored (and noted); with a
    field missing (an older version), None: the statistics are counted again."""
    if not isinstance(saved, dict):
        return None, []
    known = [f.name for f in fields(MergeStats)]
    unknown = sorted(str(k) for k in saved if k not in known)
    notes = [f"merge statistics from a newer pasta-trace ignored: {', '.join(unknown)}"] if unknown else []
    values = {k: saved.get(k) for k in known}
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values.values()):
        return None, notes
    return values, notes


def from_frames(kernels: pl.LazyFrame, device: pl.LazyFrame, pages: pl.LazyFrame, touches: pl.LazyFrame,
                samples: int, unattributed_samples: int) -> MergeStats:
    """Count from the merged frames (lazy; each count is one small collect)."""
    dev_pids = device.select("pid").unique()
    k = kernels.select(
        pl.len().alias("host_launches"),
        pl.col("match").is_not_null().sum().alias("matched"),
        (pl.col("match") == "exact").sum().alias("matched_exact"),
        (pl.col("match") == "time").sum().alias("matched_time"),
    )
    unmatched_host = kernels.join(dev_pids, on="pid", how="semi").filter(pl.col("match").is_null()).select(
        pl.len().alias("unmatched_host"))
    d = device.select(pl.len().alias("device_executions"),
                      pl.col("launch_seq").is_null().sum().alias("unmatched_device"))
    p = pages.select(pl.len().alias("pages"), pl.col("alloc_base").is_null().sum().alias("unattributed_pages"))
    t = touches.select(pl.len().alias("alloc_touches"),
                       pl.col("alloc_id").is_null().sum().alias("unattributed_touches"))
    row: dict[str, int] = {}
    for frame in pl.collect_all([k, unmatched_host, d, p, t]):
        row.update({c: int(frame[c][0] or 0) for c in frame.columns})
    return MergeStats(**row, samples=samples, unattributed_samples=unattributed_samples)


def sample_counts(cap: Capture) -> tuple[int, int]:
    """(access samples, samples in no live allocation), without materialising them."""
    total = cap.device["access_samples"].select(pl.len()).collect().item()
    if total == 0:
        return 0, 0
    attributed = hotness(cap).select(pl.col("samples").sum()).collect().item() or 0
    return int(total), int(total - attributed)


def stats(cap: Capture) -> MergeStats:
    """Match and attribution counts of a capture or a merged timeline."""
    saved, _ = saved_stats(cap.manifest.get("merge_stats") if cap.merged else None)
    if saved:
        return MergeStats(**saved)
    samples, unattributed = sample_counts(cap)
    return from_frames(kernel_executions(cap), device_executions(cap), attributed_pages(cap),
                       alloc_touches(cap), samples, unattributed)
