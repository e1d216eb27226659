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
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import pyarrow as pa

from .. import schema
from ..parquet_scan import column_ranges
from ..read import Capture
from .attribution import Segments
from .numpy_pages import ordinary_pages
from .sample_batches import Damaged, Keys, key_batches, values
from .sort_reduce import VALUE_BITS, DistinctKeys, KeyColumn, RunningSums, Scratch, group_sums

#: rows per batch handed from the streaming scan to the reduction
BATCH_ROWS = 1 << 22
#: batches whose reductions may wait behind the one running (each holds its two key columns)
MAX_WAITING = 1
#: the columns the pass reads
KEY_COLUMNS = ("pid", "launch_id", "address", "lanes", "size")
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
            raise _unexpected()
        if pidx.len():
            self.check_max(int(pidx.max()), int(launch_id.max()), int(address.max()))

    def check_max(self, pidx: int, launch_id: int, address: int) -> None:
        if pidx >= self.pids.size or launch_id >> self.launch_bits or address >> (self.page_shift + self.page_bits):
            raise pl.exceptions.ComputeError("access samples: a pid, launch_id or address beyond the file's "
                                             "statistics")

    def pid_index_of(self, pid: np.ndarray) -> np.ndarray:
        """pid_index over numpy: the index in `pids` (UInt64) of each pid; raises for another pid."""
        p = pid.astype(np.int64)
        if int(self.pids[-1] - self.pids[0]) == self.pids.size - 1:
            p -= self.pids[0]
            if p.size and int(p.min()) < 0:
                raise _unexpected()
            return p.view(np.uint64)
        at = np.searchsorted(self.pids, p)
        if not np.array_equal(self.pids[np.minimum(at, self.pids.size - 1)], p):
            raise _unexpected()
        return at.astype(np.uint64)


def _unexpected() -> pl.exceptions.ComputeError:
    return pl.exceptions.ComputeError("access samples: a null or unexpected pid, launch_id or address "
                                      "(the file's statistics do not match its data)")


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
            try:
                cap.cache[key] = _sample_sums(cap, segs, pk, page_shift)
            except Damaged as e:  # left out, as the check at open left damaged files out: sums of none
                cap.device.leave_out("access_samples", e.why)
                cap.cache[key] = _sample_sums(cap, segs, replace(pk, rows=0), page_shift)
    return cap.cache[key]


def _batches(cap: Capture, segs: Segments, pk: Packing,
             page_shift: int) -> Iterator[tuple[KeyColumn, KeyColumn, Callable[[], None]]]:
    """(hk, wk, done) of every sample, a batch at a time (done(): the
    batch's arrays may be reused): read by Arrow's reader while the file's
    check waits (sample_batches.py: this pass is the check of the columns
    it reads), else by the streaming query of `keys`."""
    path = cap.device.unchecked("access_samples")
    if path is None:
        for batch in keys(cap, segs, pk, page_shift).collect_batches(chunk_size=BATCH_ROWS, maintain_order=False):
            yield batch["hk"], batch["wk"], _nothing
        return
    nulls: dict[str, int] = {}
    yield from key_batches(path, list(KEY_COLUMNS), BATCH_ROWS, numpy_keys(segs, pk, page_shift), nulls,
                           MAX_WAITING + 1)
    cap.device.checked("access_samples", nulls)


def _nothing() -> None:
    pass


def keys(cap: Capture, segs: Segments, pk: Packing, page_shift: int) -> pl.LazyFrame:
    """The streaming query of step 1: hk and wk of every sample, computed
    elementwise (no sort, no whole-column node: tests check its plan)."""
    launch_bits = np.uint64(pk.launch_bits)
    pidx = pk.pid_index()
    lk = pidx * (1 << pk.launch_bits) + pl.col("launch_id")
    value = (pl.col("lanes").bitwise_count_ones().fill_null(0).cast(pl.UInt64)
             + pl.col("size").fill_null(0).cast(pl.UInt64) * (1 << 6))
    seg_pid = _seg_pids(segs, pk)

    def hk(cols: list[pl.Series]) -> pl.Series:
        pi, lid, val, addr = cols
        pk.check(pi, lid, addr)
        lk = pi.to_numpy() << launch_bits
        lk |= lid.to_numpy()
        return pl.Series(_packed(segs, seg_pid, pi.to_numpy(), lk, addr.to_numpy(), val.to_numpy()))

    return cap.device["access_samples"].select(
        pl.map_batches([pidx, pl.col("launch_id"), value, pl.col("address")], hk, return_dtype=pl.UInt64,
                       is_elementwise=True).alias("hk"),
        (lk * (1 << pk.page_bits) + pl.col("address") // (1 << page_shift)).alias("wk"),
    )


def numpy_keys(segs: Segments, pk: Packing, page_shift: int) -> Keys:
    """`keys` over the columns of an Arrow batch, in numpy: (hk, wk)."""
    launch_bits, page_bits = np.uint64(pk.launch_bits), np.uint64(pk.page_bits)
    seg_pid = _seg_pids(segs, pk)

    def hk_wk(cols: dict[str, pa.Array]) -> tuple[np.ndarray, np.ndarray]:
        pid, lid, addr = cols["pid"], cols["launch_id"], cols["address"]
        if pid.null_count or lid.null_count or addr.null_count:
            raise _unexpected()
        pi = pk.pid_index_of(pid.to_numpy())
        lid_, addr_ = lid.to_numpy(), addr.to_numpy()
        if pi.size:
            pk.check_max(int(pi.max()), int(lid_.max()), int(addr_.max()))
        lk = pi << launch_bits
        lk |= lid_
        wk = lk << page_bits
        wk += addr_ >> np.uint64(page_shift)
        value = np.bitwise_count(values(cols["lanes"])).astype(np.uint64)
        value |= values(cols["size"]).astype(np.uint64) << np.uint64(6)
        return _packed(segs, seg_pid, pi, lk, addr_, value, split=False), wk

    return hk_wk


def _packed(segs: Segments, seg_pid: np.ndarray, pi: np.ndarray, lk: np.ndarray, addr: np.ndarray,
            value: np.ndarray, split: bool = True) -> np.ndarray:
    """hk of each row: lk (pid index, launch id; overwritten here), segment + 1
    (0 below every segment) and the row's value packed in one UInt64.  An
    address of 48 bits or more lands in a gap beside its process's
    allocations: no instance's.  `split`: the lookup split across the cores."""
    seg = segs.lookup_parts(seg_pid[pi.view(np.int64)], addr, split=split).view(np.uint64)
    seg += np.uint64(1)  # in place: lookup's array is this call's own
    seg <<= np.uint64(VALUE_BITS)
    lk <<= np.uint64(segment_bits(segs) + VALUE_BITS)
    seg |= lk
    seg |= value
    return seg


def _seg_pids(segs: Segments, pk: Packing) -> np.ndarray:
    """The segments' pid index of each of the packing's pids (pids.size: no allocation there)."""
    at = np.searchsorted(segs.pids, pk.pids)
    known = at < segs.pids.size
    known[known] = segs.pids[at[known]] == pk.pids[known]
    return np.where(known, at, segs.pids.size).astype(np.int64)


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

    def add_sums(hk: KeyColumn) -> None:
        running.add(*group_sums(hk, sums_scratch))

    with ThreadPoolExecutor(1) as sums_lane, ThreadPoolExecutor(1) as pages_lane:
        waiting: deque[tuple[Future, Future, Callable[[], None]]] = deque()
        for hk, wk, done in _batches(cap, segs, pk, page_shift):
            seen += len(hk)
            waiting.append((sums_lane.submit(add_sums, hk), pages_lane.submit(pages.append, wk, pages_scratch),
                            done))
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


def _done(lanes: tuple[Future, Future, Callable[[], None]]) -> None:
    for f in lanes[:2]:
        f.result()  # raises what the lane raised
    lanes[2]()  # the batch's arrays may be reused


def _launch_ids(lk: np.ndarray, pk: Packing) -> dict[str, pl.Series]:
    """The pid and launch_id columns of packed (pid index, launch_id) keys."""
    pid = pk.pids[(lk >> np.uint64(pk.launch_bits)).astype(np.intp)]
    return {"pid": pl.Series("pid", pid, dtype=schema.DEVICE_FRAMES["access_samples"]["pid"]),
            "launch_id": pl.Series("launch_id", lk & np.uint64((1 << pk.launch_bits) - 1))}
