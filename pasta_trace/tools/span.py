"""Capture-wide facts the tools share: its time span."""

from __future__ import annotations

import polars as pl

from ..read import Capture


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
