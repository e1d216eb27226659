"""One pass over the access samples for both frames made from them.

The working set (per launch: samples, accesses, bytes, distinct 4 KiB pages)
and the hotness (per allocation instance) read the same five columns of the
biggest input (10^7-10^8+ rows).  Both come from one scan here:

1. Polars streams the scan and computes two UInt64 keys per row, natively and
   in the elementwise segment lookup (attribution.py), on every core:
     hk = (pid index, launch_id, segment + 1, lanes set, access size)
     wk = (pid index, launch_id, page)
2. numpy reduces each batch by *sorting* those keys (x86-simd-sort: ~6 ns a
   key) instead of hashing them: a hash group-by with 10^6-10^7 groups costs
   ~60 ns a row (cache misses), and the working set has about as many
   distinct (launch, page) pairs as rows.  Sorted hk runs give the sums per
   (launch, segment), added into running sums; sorted wk, deduplicated, the
   distinct pages.
3. The small results (~10^6 rows) go back to Polars.

Only the keys are sorted, never the table, and only one batch at a time; what
stays in memory is a few sums per (launch, segment) and one UInt64 per
distinct (launch, page) of each batch.  Fresh memory is dear (a page fault
per 4 KiB: ~0.5 ms a MiB here, several times that with numpy's huge-page
advice), so each batch is copied into work arrays made once, with numpy's
huge-page advice off (numpy_pages.py).

The keys must fit 64 bits (`packing`, from the Parquet footers' statistics
when there are some); when they do not (launch ids or addresses too wide,
nulls), pages.py groups with Polars instead.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import polars as pl

from .. import schema
from ..parquet_scan import column_ranges
from ..read import Capture
from .attribution import Segments
from .numpy_pages import ordinary_pages
from .sort_reduce import VALUE_BITS, DistinctKeys, RunningSums, Scratch, group_sums

#: rows per batch handed from the streaming scan to the reduction
BATCH_ROWS = 1 << 22
#: batches whose reductions may wait behind the one running (each holds its two key columns)
MAX_WAITING = 1
#: a pid span up to this wide (from the footers' min and max) is indexed as pid - min
PID_SPAN = 1 << 16


@dataclass(frozen=True)
class Packing:
    """Bit widths of the sort keys: from the Parquet footers' statistics when
    the samples are one or more Parquet files that have them, else from one
    cheap pass over three columns.  The pass over the samples checks that
    every row fits them (`check`)."""

    pids: np.ndarray  # sorted pids the samples may hold (a range, from statistics)
    launch_bits: int
    page_bits: int
    rows: int
    page_shift: int = 0

    @property
    def lk_bits(self) -> int:
        return max(1, int(self.pids.size - 1).bit_length()) + self.launch_bits

    def fits(self, segs: Segments) -> bool:
        return self.lk_bits + self.page_bits <= 64 and segment_bits(segs) + self.lk_bits + VALUE_BITS <= 64

    def pid_index(self) -> pl.Expr:
        """pid -> its index in `pids` (UInt64, null for another pid): pid - min
        for a range, else a when/then chain: native in the streaming engine,
        unlike replace_strict (which buffers the whole column)."""
        if self.pids.size and int(self.pids[-1] - self.pids[0]) == self.pids.size - 1:
            return (pl.col("pid").cast(pl.Int64) - int(self.pids[0])).cast(pl.UInt64, strict=False)
        idx: pl.Expr = pl.lit(None, pl.UInt64)
        for i, p in enumerate(self.pids.tolist()):
            idx = pl.when(pl.col("pid") == p).then(pl.lit(i, pl.UInt64)).otherwise(idx)
        return idx

    def check(self, pidx: pl.Series, launch_id: pl.Series, address: pl.Series) -> None:
        """Raise unless every row fits the widths (statistics can be wrong)."""
        if pidx.null_count() or launch_id.null_count() or address.null_count():
            raise pl.exceptions.ComputeError("access samples: a null or unexpected pid, launch_id or address "
                                             "(the file's statistics do not match its data)")
        if pidx.len() and (int(pidx.max()) >= self.pids.size or int(launch_id.max()) >> self.launch_bits
                           or int(address.max()) >> (self.page_shift + self.page_bits)):
            raise pl.exceptions.ComputeError("access samples: a pid, launch_id or address beyond the file's "
                                             "statistics")


def packing(cap: Capture, page_shift: int) -> Packing | None:
    """The key widths of `cap`'s samples; None with nulls in the key columns
    or without samples.  Cached on the capture."""
    key = ("sample_packing", page_shift)
    if key not in cap.cache:
        cap.cache[key] = _from_footers(cap, page_shift) or _from_scan(cap, page_shift)
    return cap.cache[key]


def _widths(pids: np.ndarray, lmax: int, amax: int, rows: int, page_shift: int) -> Packing:
    return Packing(pids, max(1, lmax.bit_length()), max(1, (amax >> page_shift).bit_length()), rows, page_shift)


def _from_footers(cap: Capture, page_shift: int) -> Packing | None:
    paths = cap.device_files.get("access_samples")
    r = column_ranges(paths, ["pid", "launch_id", "address"]) if paths else None
    if r is None or not r[0] or any(n for _, _, n in r[1].values()):
        return None
    (pmin, pmax, _), (_, lmax, _), (_, amax, _) = (r[1][c] for c in ("pid", "launch_id", "address"))
    if pmax - pmin >= PID_SPAN:
        return None
    return _widths(np.arange(pmin, pmax + 1, dtype=np.int64), lmax, amax, r[0], page_shift)


def _from_scan(cap: Capture, page_shift: int) -> Packing | None:
    r = cap.device["access_samples"].select(
        pl.col("pid").unique().sort().implode().alias("pids"),
        pl.col("launch_id").max().alias("lmax"), pl.col("address").max().alias("amax"), pl.len().alias("rows"),
        (pl.col("pid").null_count() + pl.col("launch_id").null_count() + pl.col("address").null_count())
        .alias("nulls"),
    ).collect(engine="streaming").row(0, named=True)
    pids = np.array(r["pids"], dtype=np.int64)
    return None if not pids.size or r["nulls"] else _widths(pids, int(r["lmax"]), int(r["amax"]), r["rows"],
                                                            page_shift)


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
        with ordinary_pages():
            cap.cache[key] = _sample_sums(cap, segs, pk, page_shift)
    return cap.cache[key]


def keys(cap: Capture, segs: Segments, pk: Packing, page_shift: int) -> pl.LazyFrame:
    """The streaming query of step 1: hk and wk of every sample, computed
    elementwise (no sort, no whole-column node: tests check its plan)."""
    launch_bits = np.uint64(pk.launch_bits)
    seg_bits = np.uint64(segment_bits(segs))
    pidx = pk.pid_index()
    lk = pidx * (1 << pk.launch_bits) + pl.col("launch_id")
    value = (pl.col("lanes").bitwise_count_ones().fill_null(0).cast(pl.UInt64)
             + pl.col("size").fill_null(0).cast(pl.UInt64) * (1 << 6))
    # the segments' pid index of each of the packing's (pids.size: no allocation there)
    at = np.searchsorted(segs.pids, pk.pids)
    known = at < segs.pids.size
    known[known] = segs.pids[at[known]] == pk.pids[known]
    seg_pid = np.where(known, at, segs.pids.size).astype(np.int64)

    def hk(cols: list[pl.Series]) -> pl.Series:
        pi, lid, val, addr = cols
        pk.check(pi, lid, addr)
        # segment + 1 (0 below every segment) in place: lookup's array is this call's own.  An
        # address of 48 bits or more lands in a gap beside its process's allocations: no instance's
        seg = segs.lookup_parts(seg_pid[pi.to_numpy()], addr.to_numpy()).view(np.uint64)
        seg += np.uint64(1)
        seg <<= np.uint64(VALUE_BITS)
        lk = pi.to_numpy() << launch_bits
        lk |= lid.to_numpy()
        lk <<= seg_bits + np.uint64(VALUE_BITS)
        seg |= lk
        seg |= val.to_numpy()
        return pl.Series(seg)

    return cap.device["access_samples"].select(
        pl.map_batches([pidx, pl.col("launch_id"), value, pl.col("address")], hk, return_dtype=pl.UInt64,
                       is_elementwise=True).alias("hk"),
        (lk * (1 << pk.page_bits) + pl.col("address") // (1 << page_shift)).alias("wk"),
    )


def segment_bits(segs: Segments) -> int:
    """Bits of segment + 1 in hk (0 .. number of segments)."""
    return int(segs.kstart.size).bit_length()


def _sample_sums(cap: Capture, segs: Segments, pk: Packing, page_shift: int) -> SampleSums:
    pages = DistinctKeys(pk.rows)
    running = RunningSums()
    seen = 0
    # The two reductions of a batch share nothing: each runs on a lane (a
    # thread) of its own, in batch order, with work arrays of its own, while
    # this thread takes the next batch from the scan (numpy's sorts and loops
    # release the GIL).  Inline, they ran one after the other on one core, and
    # after the scan's last batch the other core sat idle (10^7 samples: the
    # scan done at 1.13 s, the reductions at 1.83 s).
    sums_scratch, pages_scratch = Scratch(), Scratch()

    def add_sums(hk: pl.Series) -> None:
        running.add(*group_sums(hk, sums_scratch))

    with ThreadPoolExecutor(1) as sums_lane, ThreadPoolExecutor(1) as pages_lane:
        waiting: deque[tuple[Future, Future]] = deque()
        for batch in keys(cap, segs, pk, page_shift).collect_batches(chunk_size=BATCH_ROWS, maintain_order=False):
            seen += batch.height
            waiting.append((sums_lane.submit(add_sums, batch["hk"]),
                             pages_lane.submit(pages.append, batch["wk"], pages_scratch)))
            if len(waiting) > MAX_WAITING:  # the batches held bound the memory
                _done(waiting.popleft())
        # the count (a sort of every distinct page) follows the last append, beside the last sums
        counted = pages_lane.submit(pages.counts, pk.page_bits, pages_scratch, BATCH_ROWS)
        while waiting:
            _done(waiting.popleft())
        lks, counts = counted.result()
    if seen != pk.rows:
        # the batches end early, with no error, when the decoder panics: say it as Polars would
        raise pl.exceptions.ComputeError(f"access samples: read {seen} of {pk.rows} rows")
    # hk's groups are (launch, segment + 1) in order: each launch's sums are one run of them
    g, n, acc, byt = running.cols
    seg_bits = np.uint64(segment_bits(segs))
    lk = g >> seg_bits
    seg = (g & np.uint64((1 << int(seg_bits)) - 1)).astype(np.int64) - 1
    start = np.flatnonzero(np.r_[True, lk[1:] != lk[:-1]]) if lk.size else np.zeros(0, np.intp)
    launches = lk[start]
    # both reductions saw every sample: the launches with pages are these, in this order
    if not np.array_equal(lks, launches):
        raise AssertionError("access samples: the distinct pages and the sums name other launches")
    per_launch = pl.DataFrame({
        **_launch_ids(launches, pk),
        **{k: np.add.reduceat(v, start) if start.size else v[:0] for k, v in
           (("samples", n), ("accesses", acc), ("bytes", byt))},
        "pages": counts,
    })
    inside = seg >= 0
    per_segment = pl.DataFrame({"seg_id": seg[inside], **_launch_ids(lk[inside], pk), "samples": n[inside],
                                "accesses": acc[inside], "bytes": byt[inside]})
    return SampleSums(per_launch, per_segment)


def _done(lanes: tuple[Future, Future]) -> None:
    for f in lanes:
        f.result()  # raises what the lane raised


def _launch_ids(lk: np.ndarray, pk: Packing) -> dict[str, pl.Series]:
    """The pid and launch_id columns of packed (pid index, launch_id) keys."""
    pid = pk.pids[(lk >> np.uint64(pk.launch_bits)).astype(np.intp)]
    return {"pid": pl.Series("pid", pid, dtype=schema.DEVICE_FRAMES["access_samples"]["pid"]),
            "launch_id": pl.Series("launch_id", lk & np.uint64((1 << pk.launch_bits) - 1))}
