"""The numpy reductions of the pass over access samples (merge/sort_reduce.py)
and numpy's huge-page advice turned off around them (merge/numpy_pages.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
from numpy._core.multiarray import _set_madvise_hugepage

from pasta_trace.merge import sort_reduce
from pasta_trace.merge.numpy_pages import ordinary_pages

U = np.uint64


def test_running_sums_add_found_groups_and_insert_new_ones() -> None:
    r = sort_reduce.RunningSums()
    r.add(np.array([2, 5, 9], U), np.array([1, 1, 1], U), np.array([10, 20, 30], U), np.array([0, 0, 1], U))
    # 5 and 9 again, 1, 7 and 12 new: before, between and after the groups held
    r.add(np.array([1, 5, 7, 9, 12], U), np.array([4, 2, 3, 5, 6], U), np.array([1, 1, 1, 1, 1], U),
          np.array([7, 7, 7, 7, 7], U))
    assert [c.tolist() for c in r.cols] == [[1, 2, 5, 7, 9, 12], [4, 1, 3, 3, 6, 6], [1, 10, 21, 1, 31, 1],
                                            [7, 0, 7, 7, 8, 7]]


def test_batch_columns_are_read_chunk_by_chunk() -> None:
    col = pl.concat([pl.Series([3, 1], dtype=pl.UInt64), pl.Series([2], dtype=pl.UInt64),
                     pl.Series([9, 8, 7], dtype=pl.UInt64)], rechunk=False)
    assert col.n_chunks() == 3
    out = np.zeros(6, U)
    sort_reduce.fill(out, col)
    assert out.tolist() == [3, 1, 2, 9, 8, 7]


def test_group_sums_and_distinct_counts_of_one_batch() -> None:
    s = sort_reduce.Scratch()
    vb = sort_reduce.VALUE_BITS
    # groups 4, 4, 6: (lanes, size) values (32 lanes, 4 B), (1 lane, 8 B), (2 lanes, 4 B)
    hk = pl.Series([(6 << vb) | (4 << 6) | 2, (4 << vb) | (4 << 6) | 32, (4 << vb) | (8 << 6) | 1], dtype=pl.UInt64)
    assert [c.tolist() for c in sort_reduce.group_sums(hk, s)] == [[4, 6], [2, 1], [33, 2], [136, 8]]
    d = sort_reduce.DistinctKeys(8)
    d.append(pl.Series([0x21, 0x20, 0x21, 0x35], dtype=pl.UInt64), s)
    d.append(pl.Series([0x35, 0x36, 0x11], dtype=pl.UInt64), s)
    # high parts (key >> 4) 1, 2, 3 hold 1, 2 and 2 distinct keys, read back 2 at a time
    assert [c.tolist() for c in d.counts(4, s, 2)] == [[1, 2, 3], [1, 2, 2]]


def test_batches_after_one_that_kept_most_keys_go_in_as_they_come() -> None:
    s = sort_reduce.Scratch()
    d = sort_reduce.DistinctKeys(12)
    d.append(pl.Series([0x21, 0x20, 0x21, 0x21], dtype=pl.UInt64), s)  # 2 of 4 kept: deduplicated
    d.append(pl.Series([0x35, 0x36, 0x11, 0x12], dtype=pl.UInt64), s)  # all 4 kept: the last sorted
    assert (d.n, d.dedup) == (6, False)
    d.append(pl.Series([0x36, 0x20, 0x36], dtype=pl.UInt64), s)  # as it came, duplicates and all
    assert d.n == 9 and d.buf[6:9].tolist() == [0x36, 0x20, 0x36]
    # distinct keys per high part (key >> 4): 1 -> 0x11, 0x12; 2 -> 0x20, 0x21; 3 -> 0x35, 0x36
    assert [c.tolist() for c in d.counts(4, s, 2)] == [[1, 2, 3], [2, 2, 2]]


def test_group_sums_of_a_batch_too_long_to_pack_both_sums() -> None:
    """Accesses and bytes share a word per row only where no sum can carry into the other: 2^23 rows of
    32 lanes of 255 B in one group sum to 2^28 accesses and 2^23 * 8,160 bytes (36 bits)."""
    vb = sort_reduce.VALUE_BITS
    top = (7 << vb) | (255 << 6) | 32
    rows = 1 << 23  # the fewest rows whose sums may not share a word
    keys = np.full(rows, top, U)
    keys[0] = (3 << vb) | (4 << 6) | 1
    got = [c.tolist() for c in sort_reduce.group_sums(pl.Series(keys), sort_reduce.Scratch())]
    assert got == [[3, 7], [1, rows - 1], [1, 32 * (rows - 1)], [4, 8_160 * (rows - 1)]]


def test_ordinary_pages_turns_the_advice_off_and_back() -> None:
    before = _set_madvise_hugepage(True)
    try:
        with ordinary_pages():
            inside = _set_madvise_hugepage(False)
        assert (inside, _set_madvise_hugepage(True)) == (False, True)
    finally:
        _set_madvise_hugepage(before)
