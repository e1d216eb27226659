"""What `top` counts from drained events (capture/session/top_counts.py) and how its
screen shows it (reporters/top_screen.py): exact counts, held bytes that
follow allocations and frees (a free with no size included), failed calls
that count nothing else, nested calls counted once; humanized values and
columns that fit the width."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pasta_trace import schema
from pasta_trace.capture.session.top_counts import COUNTS, HELD, TopCounts
from pasta_trace.probes.catalog import API_NAMES
from pasta_trace.reporters import top_screen

K = schema.Kind
MIB = 1 << 20
SIZE = 1 << schema.PAYLOAD_BITS["size"]


def _events(*rows: tuple) -> np.ndarray:
    """(pid, api, kind, ret or None, ptr, size or None) rows as drained records."""
    recs = np.zeros(len(rows), schema.HOST_EVENT.dtype)
    for r, (pid, api, kind, ret, ptr, size) in zip(recs, rows):
        r["pid"], r["api"], r["kind"], r["ptr"] = pid, API_NAMES.index(api), int(kind), ptr
        if ret is not None:
            r["flags"], r["ret"] = schema.FLAG_HAS_RET, ret
        if size is not None:
            r["size"], r["valid"] = size, SIZE
        r["comm"] = b"train"
    return recs


def _by_pid(frame: pl.DataFrame) -> dict[int, dict]:
    return {r.pop("pid"): r for r in frame.iter_rows(named=True)}


def test_counts_held_bytes_and_failed_calls_of_two_intervals() -> None:
    c = TopCounts(list(API_NAMES))
    c.add(_events(
        (7, "cuMemAlloc_v2", K.alloc, 0, 0x1000, 4 * MIB),
        (7, "cuMemAlloc_v2", K.alloc, 0, 0x9000, 1 * MIB),
        (7, "cuMemAllocHost_v2", K.alloc, 0, 0x7000_0000, 2 * MIB),
        (7, "cuMemAlloc_v2", K.alloc, 1, 0, 8 * MIB),  # failed: holds nothing, counts as failed only
        (7, "cudaLaunchKernel", K.launch, 0, 0, None),
        (7, "cuLaunchKernel", K.nested, 0, 0, None),  # inside the runtime's launch: counted there
        (7, "cuMemcpyHtoD_v2", K.memcpy, 0, 0, 3000),
        (7, "cuMemcpyHtoD_v2", K.memcpy, 700, 0, 5000),  # failed: no bytes copied
        (7, "c10::reportMemoryUsageToProfiler", K.tensor_alloc, None, 0x1000, MIB),  # inside 0x1000's block
        (7, "c10::ProfiledCPUMemoryReporter::New", K.tensor_alloc, None, 0x5000, 3000),
        (8, "ncclAllReduce", K.collective, 0, 0, 4096),
        (8, "ncclAllReduce", K.collective, 5, 0, 4096),  # failed
    ))
    c.add(_events((7, "cuMemFree_v2", K.free, 0, 0x9000, None)))
    interval, totals, held = c.take()
    assert _by_pid(interval) == {
        7: dict(zip(COUNTS, (1, 3, 1, 1, 3000, 0, 2, 0, 0, 0, 2))),
        8: dict(zip(COUNTS, (0, 0, 0, 0, 0, 0, 0, 0, 1, 4096, 1))),
    }
    assert _by_pid(held) == {7: dict(zip(HELD, (4 * MIB, 2 * MIB, MIB + 3000)))}
    assert c.comms == {7: "train", 8: "train"}
    # a CPU tensor's Delete has no size, the driver's free none either: each frees its address's bytes
    c.add(_events(
        (7, "c10::ProfiledCPUMemoryReporter::Delete", K.tensor_free, None, 0x5000, None),
        (7, "cuMemFreeHost", K.free, 0, 0x7000_0000, None),
        (7, "cuMemAlloc_v2", K.alloc, 0, 0x9000, 64),  # the same address again
        (7, "cuMemFree_v2", K.free, 0, 0x1000, None),  # the driver's block: its tensor is the allocator's
    ))
    interval, totals, held = c.take()
    assert _by_pid(interval)[7] == dict(zip(COUNTS, (0, 1, 2, 0, 0, 0, 0, 1, 0, 0, 0)))
    assert _by_pid(totals)[7] == dict(zip(COUNTS, (1, 4, 3, 1, 3000, 0, 2, 1, 0, 0, 2)))
    assert _by_pid(held) == {7: dict(zip(HELD, (64, 0, MIB)))}
    interval, totals, held = c.take()  # nothing drained: no process counted anything
    assert interval.is_empty() and _by_pid(totals)[7]["launches"] == 1
    assert c.holding() == [7]
    c.forget([7])  # exited: holds nothing, its totals stay
    interval, totals, held = c.take()
    assert held.is_empty() and c.holding() == [] and _by_pid(totals)[7]["launches"] == 1


@pytest.mark.parametrize("fmt, value, shown", [
    (top_screen.rate, 0, "0"), (top_screen.rate, 0.5, "0.5"), (top_screen.rate, 42.4, "42"),
    (top_screen.rate, 999.4, "999"), (top_screen.rate, 999.6, "1.00k"), (top_screen.rate, 1234, "1.23k"),
    (top_screen.rate, 45_678, "45.7k"), (top_screen.rate, 789_000, "789k"), (top_screen.rate, 1.234e6, "1.23M"),
    (top_screen.size, 0, "0 B"), (top_screen.size, 512, "512 B"), (top_screen.size, 1536, "1.50 KiB"),
    (top_screen.size, 12 * MIB, "12.0 MiB"), (top_screen.size, 768 * MIB, "768 MiB"),
    (top_screen.count, 9_999, "9,999"), (top_screen.count, 12_345, "12.3k"),
])
def test_numbers_are_humanized_to_three_significant_digits(fmt, value, shown) -> None:
    assert fmt(value) == shown


def _frame() -> pl.DataFrame:
    interval = pl.DataFrame({"pid": [1234], **{c: [n] for c, n in zip(COUNTS, (2000, 100, 100, 200, 200 << 16,
                                                                              100, 500, 500, 100, 409600, 20))}},
                            schema_overrides={"pid": pl.UInt32, **{c: pl.UInt64 for c in COUNTS}})
    held = pl.DataFrame({"pid": [1234], **{c: [n] for c, n in zip(HELD, (12 * MIB, 2 * MIB, 7 * MIB))}},
                        schema_overrides={"pid": pl.UInt32, **{c: pl.UInt64 for c in HELD}})
    return top_screen.table_frame(interval, held, 2.0, {1234: "python"})


def test_the_screen_fits_the_width_leaving_out_the_least_telling_columns_first() -> None:
    frame = _frame()
    ever = set(COUNTS) | set(HELD)
    wide = top_screen.render(frame, width=120, height=30, title="t", totals="since 0:00: ...", ever=ever, notes=[])
    assert wide.left_out == []
    assert wide.lines[2].split() == ["PID", "COMMAND", "launch/s", "alloc/s", "copy/s", "copy", "B/s", "sync/s",
                                     "tensor/s", "NCCL/s", "fail/s", "device", "pinned", "tensors"]
    # rates over the 2 s interval; held bytes as they are
    assert wide.lines[3].split() == ["1234", "python", "1.00k", "50", "100", "6.25", "MiB", "50", "250", "50", "10",
                                     "12.0", "MiB", "2.00", "MiB", "7.00", "MiB"]
    narrow = top_screen.render(frame, width=80, height=30, title="t", totals="since 0:00: ...", ever=ever, notes=[])
    assert narrow.left_out == ["pinned", "NCCL/s", "sync/s", "copy/s"]
    assert max(len(line) for line in narrow.lines) == 80
    assert narrow.lines[1:4] == [
        "                              calls per second                     held now",
        " PID  COMMAND  launch/s  alloc/s  copy B/s  tensor/s  fail/s    device   tensors",
        "1234  python      1.00k       50  6.25 MiB       250      10  12.0 MiB  7.00 MiB"]
    assert narrow.lines[-2:] == ["not shown at 80 columns: pinned, NCCL/s, sync/s, copy/s (a wider terminal, or",
                                 "`top | cat`, shows them)"]
    # a column that never showed anything but zeros goes first
    quiet = top_screen.render(frame.with_columns(pl.lit(0.0).alias("copies")), width=80, height=30, title="t",
                              totals="", ever=ever - {"copies"}, notes=[])
    assert quiet.left_out[0] == "copy/s"


def test_rows_beyond_the_terminals_height_are_counted_not_drawn() -> None:
    interval = pl.DataFrame({"pid": list(range(1, 11)), **{c: list(range(10, 0, -1)) for c in COUNTS}},
                            schema_overrides={"pid": pl.UInt32, **{c: pl.UInt64 for c in COUNTS}})
    held = pl.DataFrame(schema={"pid": pl.UInt32, **{c: pl.UInt64 for c in HELD}})
    frame = top_screen.table_frame(interval, held, 1.0, {})
    screen = top_screen.render(frame, width=200, height=12, title="t", totals="since 0:00: ...",
                               ever=set(COUNTS), notes=[])
    # title, groups, headers, 6 rows, totals, the note and a line for the cursor: the busiest first
    assert [line.split()[0] for line in screen.lines[3:9]] == ["1", "2", "3", "4", "5", "6"]
    assert screen.lines[9:] == ["since 0:00: ...", "4 more processes not shown (a taller terminal shows them)"]
    assert len(top_screen.render(frame, width=200, height=16, title="t", totals="", ever=set(COUNTS),
                                 notes=[]).lines) == 14  # all 10 fit: no note
