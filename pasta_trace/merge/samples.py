"""One pass over the access samples for both frames made from them.

The working set (per launch: samples, accesses, bytes, distinct 4 KiB pages)
and the hotness (per allocation instance) read the same five columns of the
biggest input (10^7-10^8+ rows).  Both come from one scan here:

1. Polars streams the scan and computes two UInt64 keys per row, natively and
   in the elementwise segment lookup (attribution.py), on every core:
     hk = (segment + 1, pid index, launch_id, lanes set, access size)
     wk = (pid index, launch_id, page)
2. numpy reduces each batch by *sorting* those keys (x86-simd-sort: ~6 ns a
   key) instead of hashing them: a hash group-by with 10^6-10^7 groups costs
   ~60 ns a row (cache misses), and the working set has about as many
   distinct (launch, page) pairs as rows.  Sorted hk runs give the sums per
   (segment, launch); sorted wk, deduplicated, the distinct pages.
3. The small results (~10^6 rows) go back to Polars.

Only the keys are sorted, never the table, and only one batch at a time; what
stays in memory is a few sums per (segment, launch) and one UInt64 per
distinct (launch, page).

The keys must fit 64 bits (`packing`); when they do not (launch ids or
addresses too wide, nulls), pages.py groups with Polars instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from .. import schema
from ..read import Capture
from .attribution import Segments

#: rows per batch handed from the streaming scan to the reduction
BATCH_ROWS = 1 << 22
#: low bits of hk: the lanes set in the warp's mask (0-32, 6 bits) and the access size (8 bits)
VALUE_BITS = 14
_LANES = np.arange(1 << VALUE_BITS, dtype=np.uint64) & np.uint64(63)
#: per value: thread-level accesses and bytes, looked up rather than decoded per row
_ACCESSES, _BYTES = _LANES, _LANES * (np.arange(1 << VALUE_BITS, dtype=np.uint64) >> np.uint64(6))


@dataclass(frozen=True)
class Packing:
    """Bit widths of the sort keys, from one cheap pass over three columns."""

    pids: np.ndarray  # sorted distinct pids of the samples
    launch_bits: int
    page_bits: int
    rows: int

    @property
    def lk_bits(self) -> int:
        return max(1, int(self.pids.size - 1).bit_length()) + self.launch_bits

    def fits(self, segs: Segments) -> bool:
        seg_bits = int(segs.kstart.size).bit_length()
        return self.lk_bits + self.page_bits <= 64 and seg_bits + self.lk_bits + VALUE_BITS <= 64

    def pid_index(self) -> pl.Expr:
        """pid -> its index in `pids` (UInt64), as a when/then chain: native in
        the streaming engine, unlike replace_strict (which buffers the whole column)."""
        idx: pl.Expr = pl.lit(None, pl.UInt64)
        for i, p in enumerate(self.pids.tolist()):
            idx = pl.when(pl.col("pid") == p).then(pl.lit(i, pl.UInt64)).otherwise(idx)
        return idx


def packing(cap: Capture, page_shift: int) -> Packing | None:
    """The key widths of `cap`'s samples; None with nulls in the key columns
    or without samples.  Cached on the capture."""
    key = ("sample_packing", page_shift)
    if key not in cap.cache:
        r = cap.device["access_samples"].select(
            pl.col("pid").unique().sort().implode().alias("pids"),
            pl.col("launch_id").max().alias("lmax"), pl.col("address").max().alias("amax"), pl.len().alias("rows"),
            (pl.col("pid").null_count() + pl.col("launch_id").null_count() + pl.col("address").null_count())
            .alias("nulls"),
        ).collect(engine="streaming").row(0, named=True)
        pids = np.array(r["pids"], dtype=np.int64)
        cap.cache[key] = None if not pids.size or r["nulls"] else Packing(
            pids, max(1, int(r["lmax"]).bit_length()), max(1, int(r["amax"] >> page_shift).bit_length()), r["rows"])
    return cap.cache[key]


@dataclass(frozen=True)
class SampleSums:
    #: pid, launch_id, samples, accesses, bytes, pages: every launch with samples
    per_launch: pl.DataFrame
    #: seg_id, pid, launch_id, samples, accesses, bytes: rows in a segment (not below every allocation)
    per_segment: pl.DataFrame


def sample_sums(cap: Capture, segs: Segments, pk: Packing, page_shift: int) -> SampleSums:
    """The one pass (see the module's docstring); cached on the capture."""
    key = ("sample_sums", page_shift)
    if key not in cap.cache:
        cap.cache[key] = _sample_sums(cap, segs, pk, page_shift)
    return cap.cache[key]


def keys(cap: Capture, segs: Segments, pk: Packing, page_shift: int) -> pl.LazyFrame:
    """The streaming query of step 1: hk and wk of every sample, computed
    elementwise (no sort, no whole-column node: tests check its plan)."""
    lk_bits = pk.lk_bits
    lk = pk.pid_index() * (1 << pk.launch_bits) + pl.col("launch_id")
    value = (pl.col("lanes").bitwise_count_ones().fill_null(0).cast(pl.UInt64)
             + pl.col("size").fill_null(0).cast(pl.UInt64) * (1 << 6))

    def hk(cols: list[pl.Series]) -> pl.Series:
        seg = segs.lookup(cols[0].to_numpy()).astype(np.uint64) + np.uint64(1)
        seg <<= np.uint64(lk_bits + VALUE_BITS)
        seg |= cols[1].to_numpy() << np.uint64(VALUE_BITS)
        seg |= cols[2].to_numpy()
        return pl.Series(seg)

    return cap.device["access_samples"].select(
        pl.map_batches([segs.key(pl.col("pid"), pl.col("address")), lk, value], hk, return_dtype=pl.UInt64,
                       is_elementwise=True).alias("hk"),
        (lk * (1 << pk.page_bits) + pl.col("address") // (1 << page_shift)).alias("wk"),
    )


def _sample_sums(cap: Capture, segs: Segments, pk: Packing, page_shift: int) -> SampleSums:
    lk_bits = pk.lk_bits
    pages = _DistinctKeys(pk.rows)
    parts: list[tuple[np.ndarray, ...]] = []
    seen = 0

    for batch in keys(cap, segs, pk, page_shift).collect_batches(chunk_size=BATCH_ROWS, maintain_order=False):
        seen += batch.height
        parts.append(_group_sums(batch["hk"].to_numpy()))
        pages.append(_distinct(batch["wk"].to_numpy()))
    if seen != pk.rows:
        # the batches end early, with no error, when the decoder panics: say it as Polars would
        raise pl.exceptions.ComputeError(f"access samples: read {seen} of {pk.rows} rows")
    g, n, acc, byt = _merge_sums(parts)
    lk_mask = np.uint64((1 << lk_bits) - 1)
    sums = pl.DataFrame({"lk": g & lk_mask, "seg_id": (g >> np.uint64(lk_bits)).astype(np.int64) - 1,
                         "samples": n, "accesses": acc, "bytes": byt})
    lks, counts = pages.counts(pk.page_bits)
    per_launch = (
        sums.group_by("lk").agg(pl.col("samples", "accesses", "bytes").sum())
        .join(pl.DataFrame({"lk": lks, "pages": counts}), on="lk", how="left")
        .sort("lk")
    )
    return SampleSums(
        _launch_ids(per_launch, pk).select("pid", "launch_id", "samples", "accesses", "bytes", "pages"),
        _launch_ids(sums.filter(pl.col("seg_id") >= 0), pk).select(
            "seg_id", "pid", "launch_id", "samples", "accesses", "bytes"),
    )


def _launch_ids(df: pl.DataFrame, pk: Packing) -> pl.DataFrame:
    """`df` with its `lk` column decoded to pid and launch_id."""
    lk = df["lk"].to_numpy()
    pid = pk.pids[(lk >> np.uint64(pk.launch_bits)).astype(np.intp)]
    return df.with_columns(pl.Series("pid", pid, dtype=schema.DEVICE_FRAMES["access_samples"]["pid"]),
                           pl.Series("launch_id", lk & np.uint64((1 << pk.launch_bits) - 1)))


class _DistinctKeys:
    """The distinct wk keys of every batch, end to end in one buffer sized
    for all rows (only the part written is ever touched, so memory grows with
    the distinct keys, not the rows)."""

    def __init__(self, rows: int) -> None:
        self.buf = np.empty(rows, dtype=np.uint64)
        self.n = 0

    def append(self, u: np.ndarray) -> None:
        self.buf[self.n:self.n + u.size] = u
        self.n += u.size

    def counts(self, low_bits: int) -> tuple[np.ndarray, np.ndarray]:
        """(high part, distinct keys with that high part) of every key >> low_bits.
        The buffer is sorted in place and read a slice at a time: no copy of it."""
        keys = self.buf[:self.n]
        keys.sort()
        highs: list[np.ndarray] = []
        counts: list[np.ndarray] = []
        for lo in range(0, keys.size, BATCH_ROWS):
            part = keys[lo:lo + BATCH_ROWS]
            new = np.empty(part.size, dtype=bool)
            new[0] = lo == 0 or part[0] != keys[lo - 1]
            np.not_equal(part[1:], part[:-1], out=new[1:])
            high = part >> np.uint64(low_bits)
            start = np.flatnonzero(np.concatenate(([True], high[1:] != high[:-1])))
            h, c = high[start], np.add.reduceat(new, start, dtype=np.uint64)
            if highs and h[0] == highs[-1][-1]:  # a run of one high part across two slices
                counts[-1][-1] += c[0]
                h, c = h[1:], c[1:]
            highs.append(h)
            counts.append(c)
        if not highs:
            return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
        return np.concatenate(highs), np.concatenate(counts)


def _distinct(a: np.ndarray) -> np.ndarray:
    return _unique_sorted(np.sort(a))


def _unique_sorted(a: np.ndarray) -> np.ndarray:
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def _group_sums(hk: np.ndarray) -> tuple[np.ndarray, ...]:
    """(group, rows, accesses, bytes) per distinct hk >> VALUE_BITS, sorted."""
    hk = np.sort(hk)
    g = hk >> np.uint64(VALUE_BITS)
    start = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    value = (hk & np.uint64((1 << VALUE_BITS) - 1)).astype(np.intp)
    n = np.diff(np.append(start, hk.size)).astype(np.uint64)
    return g[start], n, np.add.reduceat(_ACCESSES[value], start), np.add.reduceat(_BYTES[value], start)


def _merge_sums(parts: list[tuple[np.ndarray, ...]]) -> tuple[np.ndarray, ...]:
    """The batches' sums added up per group (the batches are sorted, the groups recur)."""
    if not parts:
        return tuple(np.zeros(0, np.uint64) for _ in range(4))
    if len(parts) == 1:
        return parts[0]
    cols = [np.concatenate(c) for c in zip(*parts)]
    order = np.argsort(cols[0], kind="stable")
    g = cols[0][order]
    start = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
    return (g[start], *(np.add.reduceat(c[order], start) for c in cols[1:]))
