#!/usr/bin/env python3
"""Device-side aggregation on the CPU: the reference pipeline PASTA's GPU path is compared against.

Writes a synthetic stream of raw accesses as ACCESS_SAMPLES device files (with
pasta_trace.device.writer), then times

  read     device file -> Polars frames (pasta_trace.device.read_device_file)
  polars   page histogram, working set per launch (distinct pages), hotness per
           allocation (search into the sorted allocation table), one lazy query set
  numpy    the same three results in a plain NumPy pass over the same arrays
           (bincount / searchsorted), the baseline

Attribution searches the allocation table per distinct page, and per access
only inside the few pages an allocation starts or ends in.  Both aggregations
are checked equal to each other, and the hotness to a one-search-per-access
reference, before anything is timed.  Prints accesses/s
for each stage, the polars/numpy ratio and absolute times.

    .venv/bin/python scripts/bench_device.py --accesses 100000000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pasta_trace import schema  # noqa: E402
from pasta_trace.device import read_device_file  # noqa: E402
from pasta_trace.device.writer import DeviceFileWriter, entries  # noqa: E402

RT = schema.DeviceRecordType


def make_allocations(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted, disjoint allocations of 1-256 MiB with gaps, 2 MiB aligned like cudaMalloc's."""
    sizes = rng.integers(1 << 20, 256 << 20, size=n, dtype=np.int64) & ~np.int64(0xFF)
    gaps = rng.integers(1, 64, size=n, dtype=np.int64) << 21
    bases = 0x7F0000000000 + np.cumsum(gaps + ((sizes + (2 << 20) - 1) >> 21 << 21)) - sizes
    bases = bases >> 21 << 21
    return bases.astype(np.uint64), sizes.astype(np.uint64)


def write_stream(path: Path, accesses: int, launches: int, allocs: int, chunk: int, page_shift: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    bases, sizes = make_allocations(rng, allocs)
    hot = rng.zipf(1.3, size=allocs * 8) % allocs  # a few allocations take most of the traffic
    per_launch = -(-accesses // launches)
    with DeviceFileWriter(path, pid=4242, backend=schema.DeviceBackend.synthetic, page_shift=page_shift) as w:
        for b, s in zip(bases.tolist(), sizes.tolist()):
            w.record(RT.ALLOC, host_mono=1, address=b, size=s)
        left = accesses
        for lid in range(1, launches + 1):
            n = min(per_launch, left)
            left -= n
            a = hot[rng.integers(0, len(hot), size=n)]
            addr = bases[a] + (rng.random(n) * sizes[a]).astype(np.uint64) // 4 * 4
            # 1% of accesses fall outside every allocation: a 64 MiB driver-owned window below the first
            stray = rng.random(n) < 0.01
            addr[stray] = bases[0] - np.uint64(256 << 20) + rng.integers(0, 64 << 20, size=int(stray.sum()), dtype=np.uint64)
            # mostly full warps, some divergent ones
            lanes = np.where(rng.random(n) < 0.9, 0xFFFFFFFF, rng.integers(1, 2**32, size=n)).astype(np.uint32)
            for i in range(0, n, chunk):
                m = min(chunk, n - i)
                s_ = entries(
                    schema.DEV_ACCESS_SAMPLE,
                    address=addr[i : i + m],
                    gpu_time=np.arange(i, i + m, dtype=np.uint64),
                    block=np.arange(i, i + m, dtype=np.uint32) // 256,
                    warp=(np.arange(i, i + m) // 32 % 8).astype(np.uint16),
                    size=np.full(m, 4, dtype=np.uint8),
                    lanes=lanes[i : i + m],
                )
                w.access_samples(lid, s_, sample_every=1)


def edge_pages(bases: np.ndarray, ends: np.ndarray, page_shift: int) -> np.ndarray:
    """Pages that an allocation starts or ends inside of: only their accesses need a search each.
    Every other page lies wholly inside one allocation or wholly outside all of them."""
    ps = np.uint64(1 << page_shift)
    starts = bases[bases % ps != 0] >> np.uint64(page_shift)
    lasts = (ends[ends % ps != 0] - np.uint64(1)) >> np.uint64(page_shift)
    return np.unique(np.concatenate([starts, lasts])).astype(np.uint32)


def polars_aggregate(samples: pl.DataFrame, allocs: pl.DataFrame, page_shift: int) -> dict[str, pl.DataFrame]:
    """Page histogram, distinct pages per launch, touches and bytes per allocation.

    Attribution searches the sorted allocation table once per distinct page, and
    once per access only for accesses in edge pages, instead of once per access."""
    a = allocs.sort("address").select(base="address", end=pl.col("address") + pl.col("size"))
    edges = pl.Series("page", edge_pages(a["base"].to_numpy(), a["end"].to_numpy(), page_shift), dtype=pl.UInt32)
    lf = samples.lazy().select(
        "launch_id",
        "address",
        page=(pl.col("address") // (1 << page_shift)).cast(pl.UInt32),  # 48-bit VAs: pages fit 32 bits
        bytes=pl.col("size").cast(pl.UInt32) * pl.col("lanes").bitwise_count_ones(),
    )
    streaming = {"engine": "streaming"}
    ph = lf.group_by("page").agg(count=pl.len(), bytes=pl.col("bytes").sum()).collect(**streaming).sort("page")
    ws = lf.group_by("launch_id").agg(pages=pl.col("page").n_unique()).collect(**streaming).sort("launch_id")
    edge = lf.filter(pl.col("page").is_in(edges.implode())).select("address", "bytes").collect(**streaming)
    parts = pl.concat([
        ph.filter(~pl.col("page").is_in(edges.implode())).select(
            addr=pl.col("page").cast(pl.UInt64) * (1 << page_shift), touches=pl.col("count").cast(pl.UInt64),
            bytes=pl.col("bytes").cast(pl.UInt64),
        ),
        edge.select(addr="address", touches=pl.lit(1, pl.UInt64), bytes=pl.col("bytes").cast(pl.UInt64)),
    ])
    hot = (
        parts.with_columns(alloc=a["base"].search_sorted(parts["addr"], side="right").cast(pl.Int64) - 1)
        .filter((pl.col("alloc") >= 0) & (pl.col("addr") < pl.lit(a["end"]).gather(pl.col("alloc").clip(0))))
        .group_by("alloc")
        .agg(pl.col("touches").sum(), pl.col("bytes").sum())
        .sort("alloc")
    )
    return {"page_hist": ph.select("page", "count"), "ws": ws, "hot": hot}


def numpy_aggregate(address: np.ndarray, launch: np.ndarray, size: np.ndarray, lanes: np.ndarray,
                    bases: np.ndarray, ends: np.ndarray, page_shift: int):
    """The same three results and the same attribution scheme, in plain NumPy (dense bincounts)."""
    page = address >> np.uint64(page_shift)
    pmin = int(page.min())
    rel = (page - np.uint64(pmin)).astype(np.int64)
    span = int(rel.max()) + 1
    nbytes = size.astype(np.uint32) * np.bitwise_count(lanes).astype(np.uint32)
    counts = np.bincount(rel, minlength=span)
    pbytes = np.bincount(rel, weights=nbytes, minlength=span).astype(np.int64)
    nz = np.flatnonzero(counts)
    hist = (nz + pmin, counts[nz])
    lmin = int(launch.min())
    nl = int(launch.max()) - lmin + 1
    lrel = (launch - np.uint64(lmin)).astype(np.int64)
    if nl * span <= 1 << 30:  # distinct (launch, page) pairs by a dense count
        ws = (np.bincount(lrel * span + rel, minlength=nl * span).reshape(nl, span) > 0).sum(axis=1)
    else:
        keys = np.unique(lrel * span + rel)
        ws = np.bincount(keys // span, minlength=nl)
    present = np.flatnonzero(np.bincount(lrel, minlength=nl))
    ws = (present + lmin, ws[present])

    edges = edge_pages(bases, ends, page_shift).astype(np.int64) - pmin
    edges = edges[(edges >= 0) & (edges < span)]
    is_edge = np.zeros(span, dtype=bool)
    is_edge[edges] = True
    in_edge = is_edge[rel]
    whole = nz[~is_edge[nz]]
    addr = np.concatenate([(whole + pmin).astype(np.uint64) << np.uint64(page_shift), address[in_edge]])
    touches = np.concatenate([counts[whole], np.ones(int(in_edge.sum()), dtype=np.int64)])
    byt = np.concatenate([pbytes[whole], nbytes[in_edge].astype(np.int64)])
    idx = np.searchsorted(bases, addr, side="right").astype(np.int64) - 1
    ok = (idx >= 0) & (addr < ends[np.clip(idx, 0, None)])
    t = np.bincount(idx[ok], weights=touches[ok], minlength=len(bases)).astype(np.int64)
    b = np.bincount(idx[ok], weights=byt[ok], minlength=len(bases)).astype(np.int64)
    used = np.flatnonzero(t)
    return {"page_hist": hist, "ws": ws, "hot": (used, t[used], b[used])}


def per_access_reference(address: np.ndarray, size: np.ndarray, lanes: np.ndarray, bases: np.ndarray, ends: np.ndarray):
    """Hotness with one search per access: slow, but obviously right; checks the page-level scheme."""
    idx = np.searchsorted(bases, address, side="right").astype(np.int64) - 1
    ok = (idx >= 0) & (address < ends[np.clip(idx, 0, None)])
    nbytes = size.astype(np.int64) * np.bitwise_count(lanes).astype(np.int64)
    t = np.bincount(idx[ok], minlength=len(bases))
    b = np.bincount(idx[ok], weights=nbytes[ok], minlength=len(bases)).astype(np.int64)
    used = np.flatnonzero(t)
    return used, t[used], b[used]


def check_equal(p: dict[str, pl.DataFrame], n: dict, ref: tuple) -> str:
    for got, want in zip(n["hot"], ref):
        assert np.array_equal(got, want)
    assert np.array_equal(p["page_hist"]["page"].to_numpy().astype(np.int64), n["page_hist"][0])
    assert np.array_equal(p["page_hist"]["count"].to_numpy(), n["page_hist"][1])
    assert np.array_equal(p["ws"]["launch_id"].to_numpy().astype(np.int64), n["ws"][0])
    assert np.array_equal(p["ws"]["pages"].to_numpy(), n["ws"][1])
    assert np.array_equal(p["hot"]["alloc"].to_numpy(), n["hot"][0])
    assert np.array_equal(p["hot"]["touches"].to_numpy(), n["hot"][1])
    assert np.array_equal(p["hot"]["bytes"].to_numpy().astype(np.int64), n["hot"][2])
    return (
        f"pages {len(n['page_hist'][0])}, accesses counted {int(n['page_hist'][1].sum())}, "
        f"launches {len(n['ws'][0])}, ws pages sum {int(n['ws'][1].sum())}, "
        f"allocations hit {len(n['hot'][0])}, attributed {int(n['hot'][1].sum())}, bytes {int(n['hot'][2].sum())}"
    )


def best_of(repeat: int, fn):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--accesses", type=int, default=100_000_000, help="raw accesses in the stream (default 1e8)")
    ap.add_argument("--launches", type=int, default=100, help="kernel launches the accesses are spread over")
    ap.add_argument("--allocs", type=int, default=64, help="allocations in the table")
    ap.add_argument("--chunk", type=int, default=65536, help="samples per ACCESS_SAMPLES record")
    ap.add_argument("--page-shift", type=int, default=16, help="log2 page size (16 = 64 KiB)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs per stage; the best is kept")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dir", type=Path, help="where to write the device file (default: a temporary folder)")
    a = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        path = Path(d) / "gpu_probes.4242.synthetic.bin"
        t = time.perf_counter()
        write_stream(path, a.accesses, a.launches, a.allocs, a.chunk, a.page_shift, a.seed)
        t_write = time.perf_counter() - t
        size = path.stat().st_size

        t_read, data = best_of(a.repeat, lambda: read_device_file(path))
        assert data.problems == [], data.problems
        samples, allocs = data.frames["access_samples"], data.frames["allocs"]
        assert samples.height == a.accesses, samples.height

        a_sorted = allocs.sort("address")
        bases = a_sorted["address"].to_numpy()
        ends = bases + a_sorted["size"].to_numpy()
        address = samples["address"].to_numpy()
        launch = samples["launch_id"].to_numpy()
        size_ = samples["size"].to_numpy()
        lanes = samples["lanes"].to_numpy()
        np_args = (address, launch, size_, lanes, bases, ends, a.page_shift)

        summary = check_equal(
            polars_aggregate(samples, allocs, a.page_shift),
            numpy_aggregate(*np_args),
            per_access_reference(address, size_, lanes, bases, ends),
        )
        t_pl, _ = best_of(a.repeat, lambda: polars_aggregate(samples, allocs, a.page_shift))
        t_np, _ = best_of(a.repeat, lambda: numpy_aggregate(*np_args))

    n = a.accesses
    rate = lambda s: f"{n / s / 1e6:8.1f} M accesses/s"  # noqa: E731
    print(f"stream: {n:,} accesses, {a.launches} launches, {a.allocs} allocations, {a.page_shift=}, "
          f"file {size / 2**20:.0f} MiB written in {t_write:.1f} s")
    print(f"check : polars == numpy ({summary})")
    print(f"read   (file -> Polars frames)          {t_read:8.3f} s  {rate(t_read)}  {size / t_read / 2**30:.2f} GiB/s")
    print(f"polars (page hist + ws/launch + hotness) {t_pl:8.3f} s  {rate(t_pl)}")
    print(f"numpy  (same, bincount/searchsorted)     {t_np:8.3f} s  {rate(t_np)}")
    print(f"ratio polars/numpy throughput: {t_np / t_pl:.2f}x   target >= 50 M accesses/s for polars: "
          f"{'met' if n / t_pl >= 50e6 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
