"""The segment table behind access attribution (pasta_trace.merge.attribution)."""

from __future__ import annotations

import dataclasses

import numpy as np
import polars as pl

from pasta_trace.merge import segments
from pasta_trace.merge.attribution import ADDRESS_BITS, SPLIT_ROWS, TABLE16_SEGMENTS

BIG = np.iinfo(np.int64).max


def _allocs() -> pl.DataFrame:
    # pid 7: A [0x1000, 0x3000) t 10..50, then B [0x1000, 0x1800) from t 60; pid 9: C [0x1000, 0x2000) from t 5
    return pl.DataFrame({
        "alloc_id": [0, 1, 2], "pid": [9, 7, 7], "base": [0x1000, 0x1000, 0x1000],
        "size": [0x1000, 0x2000, 0x800], "alloc_ts_ns": [5, 10, 60], "free_ts_ns": [None, 50, None],
    }, schema={"alloc_id": pl.UInt32, "pid": pl.UInt32, "base": pl.UInt64, "size": pl.UInt64,
               "alloc_ts_ns": pl.Int64, "free_ts_ns": pl.Int64})


def test_segments_cut_at_every_boundary() -> None:
    s = segments(_allocs())
    assert s.pids.tolist() == [7, 9]
    p9 = 1 << ADDRESS_BITS
    assert s.kstart.tolist() == [0x1000, 0x1800, 0x3000, p9 | 0x1000, p9 | 0x2000]
    key = np.array([0x0fff, 0x1000, 0x17ff, 0x1800, 0x2fff, 0x3000, p9 | 0x1fff, p9 | 0x2000, BIG], np.uint64)
    assert s.lookup(key).tolist() == [-1, 0, 0, 1, 1, 2, 3, 4, 4]


def test_instance_live_at_time() -> None:
    s = segments(_allocs())
    seg = np.array([0, 0, 0, 1, 1, 1, 2, 3, 3, -1, 0])
    t = np.array([10, 55, 60, 20, 60, 49, 20, 4, 5, 20, 0])
    known = np.array([True] * 10 + [False])
    # seg 0 is A then B; seg 1 only A (B is smaller); seg 2 is a gap; seg 3 is C
    assert s.instance(seg, t, known).tolist() == [1, -1, 2, 1, -1, 1, -1, -1, 0, -1, 2]


def test_lookup_split_across_threads_equals_one_searchsorted() -> None:
    rng = np.random.default_rng(3)
    allocs = pl.DataFrame({
        "alloc_id": np.arange(500, dtype=np.uint32), "pid": rng.integers(1, 4, 500).astype(np.uint32),
        "base": (rng.integers(0, 1 << 20, 500) * 4096).astype(np.uint64),
        "size": rng.integers(1, 1 << 16, 500).astype(np.uint64), "alloc_ts_ns": np.arange(500, dtype=np.int64),
        "free_ts_ns": np.full(500, None),
    }, schema_overrides={"free_ts_ns": pl.Int64})
    # four threads whatever this machine has, and a spy on the per-part lookups: the split path runs
    s = dataclasses.replace(segments(allocs), threads=4)
    parts: list[int] = []
    inner = s.buckets.lookup

    def spy(kstart: np.ndarray, p: np.ndarray, addr: np.ndarray) -> np.ndarray:
        parts.append(addr.size)
        return inner(kstart, p, addr)

    object.__setattr__(s.buckets, "lookup", spy)
    key = rng.integers(0, 4 << ADDRESS_BITS, 5 * SPLIT_ROWS + 17, dtype=np.uint64)
    want = np.searchsorted(s.kstart, key, side="right") - 1
    assert np.array_equal(s.lookup(key), want)
    # min(4 threads, 5 parts of SPLIT_ROWS) = 4 parts, as np.array_split cuts them
    n = 5 * SPLIT_ROWS + 17
    assert sorted(parts) == sorted([n // 4 + (i < n % 4) for i in range(4)])


def test_bucket_table_is_each_slot_first_and_last_key_searched() -> None:
    """The table is counted; it must equal searching each slot's first and last key."""
    rng = np.random.default_rng(11)
    for align in (1, 4096, 1 << 20):  # starts inside buckets, and on their first keys
        n = 300
        allocs = pl.DataFrame({
            "alloc_id": np.arange(n, dtype=np.uint32), "pid": rng.integers(1, 4, n).astype(np.uint32),
            "base": (rng.integers(1, 1 << 14, n) * align).astype(np.uint64),
            "size": (rng.integers(1, 64, n) * align).astype(np.uint64), "alloc_ts_ns": np.arange(n, dtype=np.int64),
            "free_ts_ns": np.full(n, None),
        }, schema_overrides={"free_ts_ns": pl.Int64})
        s = segments(allocs)
        b = s.buckets
        slots = b.nb + 2
        j = np.arange(int(slots.sum())) - np.repeat(b.offset, slots)
        owner = np.repeat(np.arange(s.pids.size), slots)
        first_key = (b.base[owner] + (np.maximum(j - 1, 0) << b.shift)).astype(np.uint64)
        lo = np.searchsorted(s.kstart, first_key, side="right") - 1
        hi = np.searchsorted(s.kstart, first_key + np.uint64((1 << b.shift) - 1), side="right") - 1
        pidx = (s.kstart >> np.uint64(ADDRESS_BITS)).astype(np.int64)
        first = np.searchsorted(pidx, np.arange(s.pids.size))
        last = np.searchsorted(pidx, np.arange(s.pids.size), side="right") - 1
        below, above = j == 0, j == slots[owner] - 1
        lo[below] = hi[below] = first[owner[below]] - 1
        lo[above] = hi[above] = last[owner[above]]
        assert b.lo.tolist() == lo.tolist() and b.hi.tolist() == hi.tolist()
        assert int((b.lo != b.hi).sum()) < b.lo.size  # most slots map to one segment


def test_lookup_equals_searchsorted_with_int16_and_int32_tables() -> None:
    """The lookup's table is int16 up to TABLE16_SEGMENTS segments, int32 above: both give the search's answer,
    for keys in buckets without a start, in buckets with one, below and above each process, and of no process."""
    rng = np.random.default_rng(5)
    for n in (200, TABLE16_SEGMENTS // 2 + 100):  # ~2n segments: int16, then int32
        allocs = pl.DataFrame({
            "alloc_id": np.arange(n, dtype=np.uint32), "pid": rng.integers(1, 4, n).astype(np.uint32),
            "base": (rng.integers(1, 1 << 24, n) * 64).astype(np.uint64),
            "size": rng.integers(1, 1 << 16, n).astype(np.uint64), "alloc_ts_ns": np.arange(n, dtype=np.int64),
            "free_ts_ns": np.full(n, None),
        }, schema_overrides={"free_ts_ns": pl.Int64})
        s = dataclasses.replace(segments(allocs), threads=1)
        assert s.buckets.table.dtype == (np.int16 if s.kstart.size <= TABLE16_SEGMENTS else np.int32)
        near = s.kstart[rng.integers(0, s.kstart.size, 20_000)] + rng.integers(-2, 3, 20_000).astype(np.uint64)
        key = np.r_[rng.integers(0, 3 << ADDRESS_BITS, 50_000, dtype=np.uint64), near, np.uint64(BIG) * 2 + 1, 0]
        want = np.searchsorted(s.kstart, key, side="right") - 1
        assert np.array_equal(s.lookup(key), want)
        assert (s.buckets.table < -1).any()  # some keys took the search
