"""What the tools share: a capture's calls, read the same from its events and
from an --aggregate capture's in-kernel counts (which has no events); its
time span; and Polars expressions."""

from __future__ import annotations

import polars as pl

from ..call_result import calls
from ..read import Capture


def is_aggregate(cap: Capture) -> bool:
    return cap.aggregate is not None


def capture_calls(cap: Capture) -> pl.LazyFrame:
    """call_result.CALLS_SCHEMA rows: sum `count` to count calls."""
    return calls(cap.aggregate if cap.aggregate is not None else cap.events)


def bounds(cap: Capture) -> tuple[int | None, int | None]:
    """(start, end) of the capture in ns CLOCK_MONOTONIC.

    The tracer's own start and end from the manifest when it wrote them; a
    capture cut short has no end there, and then the last recorded event's end
    stands in (likewise the first event for a missing start).  (None, None)
    for a capture with neither."""
    clock = cap.manifest.get("clock") or {}
    start, end = clock.get("start_ns"), clock.get("end_ns")
    if start is None or end is None:
        first, last = (
            cap.events.select(
                pl.col("ts_ns").min(),
                (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max().alias("end"),
            )
            .collect(engine="streaming")
            .row(0)
        )
        start = first if start is None else start
        end = last if end is None else end
    return start, end


def duration_ns(cap: Capture) -> int:
    start, end = bounds(cap)
    return 0 if start is None or end is None else int(end - start)


def measured_sum(e: pl.Expr) -> pl.Expr:
    """Sum of the non-null values; null when none was measured.  Entry-only
    probes leave `dur_ns` null and some device sources leave `bytes` null:
    "not measured" must not read as "zero"."""
    return pl.when(e.count() > 0).then(e.sum())
