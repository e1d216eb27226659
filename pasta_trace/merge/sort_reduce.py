"""The numpy reductions of the pass over access samples (samples.py): each
batch's keys sorted in work arrays made once, summed per group into running
sums, and deduplicated into one buffer of distinct keys counted at the end.

Fresh memory is dear here: a page fault per 4 KiB (about 0.5 ms a MiB on the
machines this project is measured on, several times that with numpy's
huge-page advice), so nothing allocates per batch what the batch's size
decides, except the small per-group results.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import polars as pl

#: low bits of hk: the lanes set in the warp's mask (0-32, 6 bits) and the access size (8 bits)
VALUE_BITS = 14
_LANES = np.arange(1 << VALUE_BITS, dtype=np.uint64) & np.uint64(63)
#: per value: thread-level accesses and bytes, looked up rather than decoded per row
_ACCESSES, _BYTES = _LANES, _LANES * (np.arange(1 << VALUE_BITS, dtype=np.uint64) >> np.uint64(6))


#: a batch's keys: a Polars column (the streaming query's) or a numpy array (Arrow's reader's)
KeyColumn = pl.Series | np.ndarray


class Scratch:
    """Work arrays of one batch, made once and reused for every batch: a
    fresh 32 MiB numpy temporary is a fresh mapping whose first touch faults
    every page (copying 4 M keys took 69 ms into fresh memory, 2 ms into a
    reused array)."""

    def __init__(self) -> None:
        self.u64: list[np.ndarray] = [np.empty(0, np.uint64) for _ in range(2)]
        self.flags = np.empty(0, dtype=bool)

    def words(self, i: int, n: int) -> np.ndarray:
        if self.u64[i].size < n:
            self.u64[i] = np.empty(n, np.uint64)
        return self.u64[i][:n]

    def changes(self, a: np.ndarray) -> np.ndarray:
        """Where each run of equal values in `a` starts."""
        if self.flags.size < a.size:
            self.flags = np.empty(a.size, dtype=bool)
        new = self.flags[:a.size]
        new[:1] = True
        np.not_equal(a[1:], a[:-1], out=new[1:])
        return np.flatnonzero(new)


#: a batch whose distinct keys are more than this part of its keys ends the deduplication per batch
DEDUP_KEEPS = 0.75


class DistinctKeys:
    """The distinct wk keys of every batch, end to end in one buffer sized
    for all rows (only the part written is ever touched: each batch is
    sorted and deduplicated in place at the end, so memory grows with the
    distinct keys of the batches plus one batch, not with the rows).

    Where a batch keeps most of its keys (samples spread over many pages of
    a launch: the bench's 10^7 samples keep 88 %), sorting it saves the
    count's sort little and costs a sort of its own (at 10^8 samples, 2.2 of
    the pass's ~20 CPU s): the batches after it go in as they come, and
    the count, which sorts the whole buffer anyway, finds their duplicates."""

    def __init__(self, rows: int) -> None:
        self.buf = np.empty(rows, dtype=np.uint64)
        self.n = 0
        self.dedup = True

    def append(self, wk: KeyColumn, scratch: Scratch) -> None:
        """Add the keys of `wk` at the buffer's end: sorted and distinct while
        batches shrink by deduplication, as they come after one that did not."""
        part = self.buf[self.n:self.n + len(wk)]
        fill(part, wk)
        if not self.dedup:
            self.n += part.size
            return
        part.sort()
        start = scratch.changes(part)
        kept = scratch.words(0, start.size)
        np.take(part, start, out=kept, mode="clip")
        part[:start.size] = kept
        self.n += start.size
        self.dedup = start.size <= DEDUP_KEEPS * part.size

    def counts(self, low_bits: int, scratch: Scratch, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(high part, distinct keys with that high part) of every key >> low_bits.
        The buffer is sorted in place and read a slice at a time into the
        work arrays: no copy of it, no fresh memory per slice."""
        keys = self.buf[:self.n]
        sort_halves(keys)
        highs: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        for lo in range(0, keys.size, step):
            part = keys[lo:lo + step]
            high = np.right_shift(part, np.uint64(low_bits), out=scratch.words(1, part.size))
            start = scratch.changes(high)
            h = high[start]
            new = scratch.words(0, part.size)
            np.not_equal(part[1:], part[:-1], out=new[1:])
            new[0] = lo == 0 or part[0] != keys[lo - 1]
            c = np.add.reduceat(new, start)
            if highs and h[0] == highs[-1][-1]:  # a run of one high part across two slices
                counts[-1][-1] += c[0]
                h, c = h[1:], c[1:]
            if h.size:  # none where the slice is all one run, longer than a slice
                highs.append(h)
                counts.append(c)
        if not highs:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        return np.concatenate(highs), np.concatenate(counts)


#: keys sorted in two halves on two threads from this many on
HALVES_FROM = 1 << 22


def sort_halves(a: np.ndarray) -> None:
    """Sort `a` in place, its two halves on two threads once it is large:
    partitioned at its middle first (a linear pass: 0.08 s for 4*10^7
    keys), then each half sorted (numpy's sort lets go of the GIL).  The
    count of distinct pages sorts every distinct key of the pass at its end,
    when the other core has little left to do: 0.43 s for 4*10^7 keys,
    against 0.66 s on one thread."""
    if a.size < HALVES_FROM or (os.cpu_count() or 1) < 2:
        a.sort()
        return
    k = a.size // 2
    a.partition(k)
    with ThreadPoolExecutor(2) as pool:
        for f in [pool.submit(np.ndarray.sort, a[:k]), pool.submit(np.ndarray.sort, a[k:])]:
            f.result()


def fill(out: np.ndarray, col: KeyColumn) -> None:
    """`col` copied into `out` a chunk at a time: a batch holds one chunk per
    morsel, and Series.to_numpy would first join them in fresh memory (32 MiB
    a batch, ~60 ms of page faults here)."""
    if isinstance(col, np.ndarray):
        out[:] = col
        return
    at = 0
    for c in col.get_chunks():
        a = c.to_numpy()
        out[at:at + a.size] = a
        at += a.size


def group_sums(hk: KeyColumn, scratch: Scratch) -> tuple[np.ndarray, ...]:
    """(group, rows, accesses, bytes) per distinct hk >> VALUE_BITS, sorted.
    A numpy `hk` is overwritten."""
    rows = len(hk)
    if isinstance(hk, np.ndarray):  # the caller's own array (sample_batches): sorted and reused in place
        s = hk
    else:
        s = scratch.words(0, rows)
        fill(s, hk)
    s.sort()
    g = scratch.words(1, rows)
    np.right_shift(s, np.uint64(VALUE_BITS), out=g)
    start = scratch.changes(g)
    groups = g[start]
    n = np.diff(start, append=rows).astype(np.uint64)
    value = np.bitwise_and(s, np.uint64((1 << VALUE_BITS) - 1), out=g).view(np.int64)
    # accesses and bytes of a row in one word, accesses low, when no sum of a batch this
    # long can carry into the other: one take and one reduceat for both (a batch of 2^22
    # rows: accesses below 2^28, bytes below 2^36)
    low = int(rows * int(_ACCESSES.max())).bit_length()
    packed = low + int(rows * int(_BYTES.max())).bit_length() <= 64
    sums = []
    for table in [(_BYTES << np.uint64(low)) | _ACCESSES] if packed else [_ACCESSES, _BYTES]:
        np.take(table, value, out=s, mode="clip")
        sums.append(np.add.reduceat(s, start) if start.size else s[:0].copy())
    if packed:
        sums = [sums[0] & np.uint64((1 << low) - 1), sums[0] >> np.uint64(low)]
    return groups, n, *sums


class RunningSums:
    """Sums per group over all batches so far, sorted by group.  Each batch's
    groups are looked up in them (a batch of 4 M samples has most of the ~10^6
    (launch, segment) groups of the whole input), added in place, and the
    new ones merged in: no batch's sums wait for the end, where merging them
    all (10^8 samples: 2*10^7 rows) cost seconds and 1 GB.

    The merge writes into the other of two buffers, each kept for the next
    batches and grown by half again when too small, where np.insert made four
    fresh arrays per batch (10^8 samples: 2.0 CPU s and 13,000 page faults
    before, 1.8 s and 2,600 after; 10 batches of 10^6 at 10^7: 0.59-0.72 s
    before, 0.45-0.54 after)."""

    def __init__(self) -> None:
        self.cols: tuple[np.ndarray, ...] = tuple(np.zeros(0, np.uint64) for _ in range(4))
        self._spare = np.zeros((4, 0), np.uint64)  # the buffer the next merge writes
        self._held = np.zeros((4, 0), np.uint64)  # the buffer self.cols are views of

    def add(self, g: np.ndarray, *vals: np.ndarray) -> None:
        """Add the sums `vals` of the sorted distinct groups `g`."""
        have = self.cols[0]
        if have.size:
            at = np.searchsorted(have, g)
            found = have[np.minimum(at, have.size - 1)] == g
            hit = at[found]  # distinct: g is
            for mine, v in zip(self.cols[1:], vals):
                mine[hit] += v[found]
            new = np.flatnonzero(~found)
        else:
            at = np.zeros(g.size, np.intp)
            new = np.arange(g.size)
        if not new.size:
            return
        size = have.size + new.size
        if self._spare.shape[1] < size:
            self._spare = np.empty((4, size + size // 2), np.uint64)
        out = self._spare[:, :size]
        # each new group goes after the held ones below it and the new ones before it
        dest = at[new] + np.arange(new.size)
        old = np.ones(size, dtype=bool)
        old[dest] = False
        for row, mine, v in zip(out, self.cols, (g, *vals)):
            row[dest] = v[new]
            row[old] = mine
        self._spare, self._held = self._held, self._spare
        self.cols = tuple(out)
