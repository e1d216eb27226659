"""Device addresses -> the allocation instance live there at that time.

The big side (pages, access samples: up to 1e8+ rows) is never sorted and
never joined to anything but small tables: sorting or as-of joining 1e8 rows
costs several GB and a blocking sort, a lookup into the few thousand segments
does not (scripts/bench_merge.py):

1. The address space of each process is cut into *segments* at every
   allocation boundary, so each address falls in exactly one segment and each
   segment is covered by a few allocation instances over time (address reuse).
2. Each row finds its segment by a numpy `searchsorted` over the segment
   starts, keyed ``pid_index << 48 | address`` (user-space addresses fit in
   48 bits), inside an elementwise `map_batches`: it streams and runs on every
   core, and needs no sort and no `join_asof(by=)`.
3. Rows are aggregated to (pid, launch, segment, ...) *before* any time
   check; only then does each aggregate find the instance live at its
   launch's host time: a second searchsorted, over (segment, alloc-time rank)
   keys of the instances covering each segment.  No sort, no range join.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import polars as pl

from ..lifetimes import ADDRESS_BITS

#: a morsel is split across threads only above this many rows per part
SPLIT_ROWS = 32_768


@dataclass(frozen=True)
class Segments:
    """Every process's address space cut at every allocation start and end.

    The segments tile each process's span from its lowest boundary on; the
    last one of each process runs to the next process's first (a gap).  Gaps
    are segments that no instance covers, so the lookup is a bare
    searchsorted: no end check, no mask."""

    pids: np.ndarray  # sorted distinct pids
    kstart: np.ndarray  # sorted segment starts, keyed pid_index << 48 | address (uint64)
    # instances covering each segment, sorted by ckey = seg_id << rank_bits | (alloc time rank + 1)
    ckey: np.ndarray
    c_alloc_id: np.ndarray
    c_free: np.ndarray  # free time, int64 max when never freed
    alloc_times: np.ndarray  # sorted distinct alloc times: ranks keep ckey in 64 bits
    rank_bits: int
    buckets: Buckets
    #: the streaming engine runs a Python UDF on one morsel at a time, but
    #: np.searchsorted releases the GIL: each morsel is split across the cores
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(os.cpu_count() or 1),
                                     repr=False, compare=False)

    def lookup(self, key: np.ndarray) -> np.ndarray:
        """Segment index of each key; -1 below the first segment."""
        p = key >> np.uint64(ADDRESS_BITS)  # the 2^64-1 "no pid" key: the extra entry
        np.minimum(p, np.uint64(self.pids.size), out=p)
        return self.lookup_parts(p.view(np.int64), key & np.uint64((1 << ADDRESS_BITS) - 1))

    def lookup_parts(self, p: np.ndarray, addr: np.ndarray, split: bool = True) -> np.ndarray:
        """Segment index of each (pid index, address < 2^48), as `lookup` of
        p << 48 | addr: pid index pids.size stands for no process's (the last
        gap).  With the pid index at hand, no key of 64 bits is made per row.
        Split across the cores with `split` (a caller on one thread of
        several does not)."""
        if self.kstart.size == 0:
            return np.full(p.shape, -1, dtype=np.int64)
        parts = min(self.threads, p.size // SPLIT_ROWS) if split else 1
        if parts < 2:
            return self.buckets.lookup(self.kstart, p, addr)
        return np.concatenate(list(self.pool.map(lambda pa: self.buckets.lookup(self.kstart, *pa),
                                                 zip(np.array_split(p, parts), np.array_split(addr, parts)))))

    def key(self, pid: pl.Expr, addr: pl.Expr) -> pl.Expr:
        """pid_index << 48 | address as a native Polars expression (UInt64;
        2^64-1 for a pid without allocations or an address beyond 48 bits,
        which lands in the last gap).  A when/then chain, not replace_strict:
        that one buffers the whole column in the streaming engine."""
        idx: pl.Expr = pl.lit(None, pl.UInt64)
        for i, p in enumerate(self.pids.tolist()):
            idx = pl.when(pid == p).then(pl.lit(i << ADDRESS_BITS, pl.UInt64)).otherwise(idx)
        return pl.when(addr < (1 << ADDRESS_BITS)).then(idx + addr).fill_null(np.iinfo(np.uint64).max)

    def expr(self, pid: str | pl.Expr, addr: pl.Expr) -> pl.Expr:
        """Polars expression: segment id (Int64).  An elementwise numpy UDF:
        it streams and runs on every core (np.searchsorted releases the GIL)."""
        if self.kstart.size == 0:
            return pl.lit(-1, pl.Int64)
        key = self.key(pl.col(pid) if isinstance(pid, str) else pid, addr)
        return key.map_batches(lambda s: pl.Series(self.lookup(s.to_numpy())), return_dtype=pl.Int64,
                               is_elementwise=True)

    def instance(self, seg: np.ndarray, t: np.ndarray, t_known: np.ndarray) -> np.ndarray:
        """alloc_id live in segment `seg` at host time `t` (the latest one
        allocated at or before t, unless it was freed by then); where t is
        unknown, the latest instance of the segment.  -1 where none."""
        if self.ckey.size == 0:
            return np.full(seg.shape, -1, dtype=np.int64)
        rank = np.where(t_known, np.searchsorted(self.alloc_times, t, side="right"), self.alloc_times.size)
        q = (np.maximum(seg, 0) << self.rank_bits) | rank
        i = np.searchsorted(self.ckey, q, side="right") - 1
        ic = np.maximum(i, 0)
        ok = (seg >= 0) & (i >= 0) & ((self.ckey[ic] >> self.rank_bits) == seg) & (~t_known | (t < self.c_free[ic]))
        return np.where(ok, self.c_alloc_id[ic].astype(np.int64), -1)

    def instance_expr(self, seg: pl.Expr, t: pl.Expr) -> pl.Expr:
        """Polars expression: alloc_id (UInt32, null where no instance was live)."""

        def f(cols: list[pl.Series]) -> pl.Series:
            s, tt = cols
            known = tt.is_not_null().to_numpy()
            return pl.Series(self.instance(s.to_numpy(), tt.fill_null(0).to_numpy(), known))

        out = pl.map_batches([seg, t], f, return_dtype=pl.Int64, is_elementwise=True)
        return pl.when(out >= 0).then(out).cast(pl.UInt32)


#: bucket table entries per segment (at least BUCKETS_MIN, at most BUCKETS_MAX in all):
#: accesses crowd the starts of small allocations, so buckets must be finer
#: than those (measured at 1e7: 8 per segment left 70 % of keys to the
#: search, 256 per segment 2 %, for a 20 MB table)
BUCKETS_PER_SEGMENT = 256
BUCKETS_MIN = 1 << 16
BUCKETS_MAX = 1 << 23
#: up to this many segments the lookup's table is int16 (-2 - lo down to -32768)
TABLE16_SEGMENTS = (1 << 15) - 2


@dataclass(frozen=True)
class Buckets:
    """A direct-indexed table in front of the binary search.

    A binary search over ~10^4 segment starts costs ~80 ns a key (a branch
    mispredict per probe, measured 0.85 s for 1e7 keys).  Each process's span
    is cut into equal 2^shift buckets; a bucket holding no segment start maps
    every key in it to one segment with one gather, and only keys in buckets
    that hold a start fall back to the search.  Slot 0 of each process catches
    keys below its first start, the last slot keys above its last one."""

    shift: int
    base: np.ndarray  # per pid index: its first segment start (int64 key)
    offset: np.ndarray  # per pid index: its first slot in lo/hi
    nb: np.ndarray  # per pid index: its number of buckets
    lo: np.ndarray  # per slot: segment of the slot's first key (int32 where it fits)
    hi: np.ndarray  # per slot: segment of the slot's last key
    #: what the lookup gathers: per slot its segment where lo == hi, else
    #: -2 - lo (search); two more slots for keys of no process (2^64-1), the
    #: last segment.  One table, not lo and hi: the gathers miss the cache
    #: (10^7 keys into 2.5*10^6 slots), and int16 where the segments fit
    #: halves what they miss (a lookup 21 -> 10 ns a key)
    table: np.ndarray
    #: base (its address alone), offset and nb with one more entry, for the keys of no process
    pbase: np.ndarray
    poffset: np.ndarray
    pnb: np.ndarray

    def lookup(self, kstart: np.ndarray, p: np.ndarray, addr: np.ndarray) -> np.ndarray:
        """Segment of each (pid index, address): p is an int64 index into
        pbase (base.size for keys of no process), addr below 2^48."""
        # np.maximum/np.minimum in place: np.clip is ~10x slower here
        b = addr.view(np.int64) - self.pbase[p]
        b >>= self.shift
        np.maximum(b, -1, out=b)
        np.minimum(b, self.pnb[p], out=b)
        b += self.poffset[p] + 1
        out = self.table[b].astype(np.int64)
        todo = np.flatnonzero(out < -1)
        if todo.size:
            key = (p[todo].astype(np.uint64) << np.uint64(ADDRESS_BITS)) | addr[todo].astype(np.uint64)
            out[todo] = np.searchsorted(kstart, key, side="right") - 1
        return out


def _buckets(pids: np.ndarray, kstart: np.ndarray) -> Buckets:
    """The table for `kstart`, counted rather than searched: the slots of all
    processes follow each other in kstart's order, so the last start at or
    before a slot's end is the running count of starts per slot, and the last
    one at or before its first key is that count before the slot, plus one
    where a start falls on that first key.  Searching each slot's first and
    last key (2.5*10^6 slots for the 10^7-sample bench capture) made the
    segment table cost 0.10-0.12 CPU s; counting, 0.027."""
    pidx = (kstart >> np.uint64(ADDRESS_BITS)).astype(np.int64)
    first = np.searchsorted(pidx, np.arange(pids.size))
    last = np.searchsorted(pidx, np.arange(pids.size), side="right") - 1
    base = kstart[first].astype(np.int64)
    span = kstart[last].astype(np.int64) - base
    budget = min(BUCKETS_MAX, max(BUCKETS_MIN, BUCKETS_PER_SEGMENT * kstart.size))
    shift = next(s for s in range(ADDRESS_BITS + 1) if int(((span >> s) + 3).sum()) <= budget)
    nb = (span >> shift) + 1
    slots = nb + 2
    offset = np.cumsum(slots) - slots
    # each start's slot: slot 0 of a process is below its first start, the last above its last
    within = kstart.astype(np.int64) - base[pidx]
    slot = (within >> shift) + offset[pidx] + 1
    through = np.cumsum(np.bincount(slot, minlength=int(slots.sum()))) - 1
    lo = np.empty_like(through)
    lo[:1] = -1
    lo[1:] = through[:-1]
    lo[slot[(within & ((1 << shift) - 1)) == 0]] += 1
    small = np.int32 if kstart.size < 1 << 31 else np.int64
    last = kstart.size - 1
    table = np.where(lo == through, lo, -2 - lo)
    table = np.r_[table, last, last].astype(np.int16 if kstart.size <= TABLE16_SEGMENTS else small)
    total = int(slots.sum())
    return Buckets(shift, base, offset, nb, lo.astype(small), through.astype(small), table,
                   np.r_[base & ((1 << ADDRESS_BITS) - 1), 0], np.r_[offset, total], np.r_[nb, 0])


def segments(allocs: pl.DataFrame) -> Segments:
    """Cut each process's address space at every allocation start and end."""
    a = allocs.filter(pl.col("size") > 0).select(
        "alloc_id", "pid", "base", (pl.col("base") + pl.col("size")).alias("end"), "alloc_ts_ns", "free_ts_ns"
    )
    pids = np.sort(a["pid"].unique().to_numpy())
    shift = np.uint64(ADDRESS_BITS)
    pidx = np.searchsorted(pids, a["pid"].to_numpy()).astype(np.uint64) << shift
    kbase = pidx | a["base"].to_numpy().astype(np.uint64)
    kend = pidx | a["end"].to_numpy().astype(np.uint64)
    kstart = np.unique(np.concatenate([kbase, kend]))
    # an instance covers the contiguous run of segments from its base to its end
    first, stop = np.searchsorted(kstart, kbase), np.searchsorted(kstart, kend)
    n_cov = stop - first
    c_seg = np.repeat(first, n_cov) + (np.arange(n_cov.sum()) - np.repeat(np.cumsum(n_cov) - n_cov, n_cov))
    c_inst = np.repeat(np.arange(a.height), n_cov)
    alloc_ts = a["alloc_ts_ns"].to_numpy()
    alloc_times = np.unique(alloc_ts)
    rank_bits = max(1, int(alloc_times.size + 1).bit_length())
    if kstart.size >= 1 << (63 - rank_bits):
        raise ValueError(f"{kstart.size} segments x {alloc_times.size} allocation times do not fit 63 bits")
    ckey = (c_seg.astype(np.int64) << rank_bits) | (np.searchsorted(alloc_times, alloc_ts[c_inst]) + 1)
    order = np.argsort(ckey, kind="stable")
    free = a["free_ts_ns"].fill_null(np.iinfo(np.int64).max).to_numpy()
    return Segments(pids, kstart, ckey[order], a["alloc_id"].to_numpy()[c_inst][order], free[c_inst][order],
                    alloc_times, rank_bits, _buckets(pids, kstart))
