"""Put many captures' CLOCK_MONOTONIC on one clock (docs/cluster.md).

The timeline's clock is the first capture's CLOCK_MONOTONIC.  Each capture's
manifest holds CLOCK_REALTIME bracketed by two CLOCK_MONOTONIC reads at its
start and end, so realtime - monotonic is known to within half a bracket;
two captures' difference of those is their offset, as good as the agreement
of the two machines' CLOCK_REALTIME (`sync_ns`: NTP or PTP; 0 on one host).

Where a capture shares collectives (comm_id, seq) with the reference, the
ranks' entry times locate it too: the median over collectives of
(reference entry - its entry), with the median absolute deviation as its
uncertainty.  It is used when that is tighter than the realtime estimate,
and only inside the realtime window when there is one: a rank that is
always late must stay late, not be taken for a clock offset.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .. import schema
from ..read import Capture
from .collective_calls import collective_entries

#: pids are below 2^22 (Linux PID_MAX_LIMIT): a capture's pids that collide
#: with an earlier capture's move up by a multiple of it.
PID_STRIDE = 1 << 22


@dataclass(frozen=True)
class RealtimeOffset:
    """realtime - monotonic of one capture, and how well it is known."""

    offset_ns: int
    uncertainty_ns: int


def realtime_offset(manifest: dict) -> RealtimeOffset | None:
    """From the manifest's clock samples; None when it has none."""
    clock = manifest.get("clock") or {}
    # a sample missing one of its clocks (the reader checked the types of those present) tells nothing
    samples = [s for s in (clock.get("start_sample"), clock.get("end_sample"))
               if s and all(s.get(k) is not None for k in ("realtime_ns", "mono_before_ns", "mono_after_ns"))]
    if not samples:
        return None
    # integer halves: these are ~1.8e18 ns, beyond float64's exact range
    offs = [s["realtime_ns"] - (s["mono_before_ns"] + s["mono_after_ns"]) // 2 for s in samples]
    half = max((s["mono_after_ns"] - s["mono_before_ns"] + 1) // 2 for s in samples)
    # the two samples disagree by how much the clocks drifted (NTP slewing) during the capture
    drift = (max(offs) - min(offs) + 1) // 2
    return RealtimeOffset((min(offs) + max(offs)) // 2, half + drift)


def _entry_medians(cap: Capture) -> pl.LazyFrame:
    """comm_id, seq, the median entry time of this capture's ranks."""
    return collective_entries(cap).group_by("comm_id", "seq").agg(
        pl.col("ts_ns").median().round().cast(pl.Int64).alias("ts"))


def _collective_offset(ref: pl.DataFrame, cap: Capture) -> tuple[int | None, int | None, int]:
    """(offset, uncertainty, collectives shared) from entry times against the reference's."""
    d = (
        ref.lazy().join(_entry_medians(cap), on=["comm_id", "seq"], suffix="_cap")
        .select((pl.col("ts") - pl.col("ts_cap")).alias("d"))
        .select(pl.len().alias("n"), pl.col("d").median().alias("med"),
                (pl.col("d") - pl.col("d").median()).abs().median().alias("mad"))
        .collect()
    )
    n, med, mad = d.row(0)
    if not n:
        return None, None, 0
    return int(round(med)), max(int(round(mad)), 1), int(n)


def _pid_offsets(caps: list[Capture]) -> list[int]:
    """0 for a capture whose pids no earlier capture has, else capture x PID_STRIDE."""
    seen: set[int] = set()
    out = []
    for i, cap in enumerate(caps):
        pids = set(pl.concat([cap.events.select("pid"), cap.processes.select("pid"),
                              cap.communicators.select("pid")]).unique().collect()["pid"].to_list())
        out.append(i * PID_STRIDE if pids & seen else 0)
        seen |= {p + out[-1] for p in pids}
    return out


def _row(i: int, cap: Capture, pid_offset: int, rt: RealtimeOffset | None, ref: RealtimeOffset | None,
         sync_ns: int, coll: tuple[int | None, int | None, int]) -> dict:
    rt_off = rt_unc = None
    if rt is not None and ref is not None:
        rt_off = rt.offset_ns - ref.offset_ns  # timeline = mono + (realtime - mono here) - (the same there)
        rt_unc = rt.uncertainty_ns + ref.uncertainty_ns + sync_ns
    c_off, c_unc, n = coll
    if c_off is not None and (rt_unc is None or c_unc < rt_unc):
        method, unc = "collectives", c_unc
        off = c_off if rt_off is None else min(max(c_off, rt_off - rt_unc), rt_off + rt_unc)
    elif rt_off is not None:
        method, off, unc = "realtime", rt_off, rt_unc
    else:
        method, off, unc = "none", 0, None
    return {"capture": i, "path": str(cap.path), "node": cap.manifest.get("host") or "unknown",
            "pid_offset": pid_offset, "offset_ns": off, "uncertainty_ns": unc, "method": method,
            "realtime_offset_ns": rt_off, "realtime_uncertainty_ns": rt_unc,
            "collective_offset_ns": c_off, "collective_uncertainty_ns": c_unc, "collectives": n}


def fit_offsets(caps: list[Capture], sync_ns: int) -> pl.DataFrame:
    """schema.CLOCK_OFFSETS_SCHEMA, one row per capture, the first the reference.

    `sync_ns` bounds how far two hosts' CLOCK_REALTIME may disagree; captures
    whose manifests name the reference's host share its clock and add nothing."""
    ref_cap = caps[0]
    ref_rt = realtime_offset(ref_cap.manifest)
    ref_entries = _entry_medians(ref_cap).collect()
    rows = [{"capture": 0, "path": str(ref_cap.path), "node": ref_cap.manifest.get("host") or "unknown",
             "pid_offset": 0, "offset_ns": 0, "uncertainty_ns": 0, "method": "reference",
             "realtime_offset_ns": 0 if ref_rt else None, "realtime_uncertainty_ns": 0 if ref_rt else None,
             "collective_offset_ns": None, "collective_uncertainty_ns": None, "collectives": 0}]
    pid_offsets = _pid_offsets(caps)
    for i, cap in enumerate(caps[1:], start=1):
        same_host = cap.manifest.get("host") == ref_cap.manifest.get("host")
        rows.append(_row(i, cap, pid_offsets[i], realtime_offset(cap.manifest), ref_rt,
                         0 if same_host else sync_ns, _collective_offset(ref_entries, cap)))
    return pl.DataFrame(rows, schema=schema.CLOCK_OFFSETS_SCHEMA)
