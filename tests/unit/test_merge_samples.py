"""The one sorting pass over access samples (merge/samples.py) against the
hash group-bys it replaces, which stay for keys too wide to pack.  The pass
reads the samples with Arrow's reader when their file's check still waits
(merge/sample_batches.py), else through Polars: both are run."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import merge, parquet_scan, schema
from pasta_trace.testing import synthetic
from pasta_trace.merge import pages, sample_batches, samples
from pasta_trace.read import open_capture

SPEC = synthetic.Spec(seed=7, accesses=30_000, launches=400, allocations=80, page_hist=False)


@pytest.fixture(autouse=True)
def deferred_at_any_size(monkeypatch) -> None:
    """These small files stand for large ones: their check waits for their first reader."""
    monkeypatch.setattr(parquet_scan, "DEFER_BYTES", 0)


@pytest.fixture(scope="module")
def cap_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("samples") / "cap"
    synthetic.write_capture(d, SPEC)
    return d


@pytest.fixture(params=["arrow", "polars"])
def reader(request) -> str:
    return request.param


def frames(cap_dir: Path, reader: str = "arrow") -> tuple[pl.DataFrame, pl.DataFrame]:
    cap = opened(cap_dir, reader)
    return (merge.working_set(cap).collect().sort("pid", "launch_id"),
            merge.hotness(cap).collect().sort("alloc_id"))


def opened(cap_dir: Path, reader: str):
    """The capture, its samples' file checked first ("polars": the pass reads
    through Polars) or not (the pass reads with Arrow's reader, the check)."""
    cap = open_capture(cap_dir)
    assert cap.device.pending == ["access_samples"]
    if reader == "polars":
        cap.device["access_samples"]
        assert cap.device.pending == []
    return cap


def test_both_readers_give_one_result(cap_dir: Path) -> None:
    arrow, polars = frames(cap_dir, "arrow"), frames(cap_dir, "polars")
    assert arrow[0].height == 400 and arrow[1].height == 80
    assert arrow[0].equals(polars[0]) and arrow[1].equals(polars[1])


def test_sorting_pass_equals_the_hash_group_bys(cap_dir: Path, monkeypatch, reader: str) -> None:
    cap = open_capture(cap_dir)
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    assert pk is not None and pk.rows == 30_000 and pk.fits(merge.segments(merge.allocations(cap).collect()))
    ws, hot = frames(cap_dir, reader)
    assert (ws.height, int(ws["samples"].sum()), hot.height) == (400, 30_000, 80)
    monkeypatch.setattr(pages, "packing", lambda *_: None)
    ws_hash, hot_hash = frames(cap_dir)
    assert ws.equals(ws_hash)
    assert hot.equals(hot_hash)


def test_many_batches_add_up_to_one(cap_dir: Path, monkeypatch, reader: str) -> None:
    ws, hot = frames(cap_dir, reader)
    # 30 batches, and the distinct pages read back 1,000 at a time; Arrow's batches of 700
    # rows, each split over two of the pass's
    monkeypatch.setattr(samples, "BATCH_ROWS", 1_000)
    monkeypatch.setattr(sample_batches, "READ_ROWS", 700)
    ws_small, hot_small = frames(cap_dir, reader)
    assert ws.equals(ws_small)
    assert hot.equals(hot_small)


def test_keys_too_wide_to_pack_fall_back(tmp_path: Path) -> None:
    cap = open_capture(fx_capture(tmp_path))
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    # 2 pids (1 bit) + launch ids of 51 bits + pages of 36 bits: 88 bits
    assert (pk.launch_bits, pk.page_bits, pk.lk_bits) == (51, 36, 52)
    assert not pk.fits(merge.segments(merge.allocations(cap).collect()))
    got = merge.working_set(cap).collect().sort("pid", "launch_id")
    assert got.select("pid", "launch_id", "samples", "accesses", "bytes", "pages").rows() == [
        (1, 2**50, 2, 64, 256, 2), (1, 2**50 + 1, 1, 1, 8, 1), (2, 5, 1, 32, 128, 1)]


def fx_capture(tmp_path: Path) -> Path:
    """Four samples of two processes, with launch ids of 51 bits and addresses of 48."""
    synthetic.write_capture(tmp_path / "cap", synthetic.Spec(accesses=10, launches=10, allocations=4,
                                                              page_hist=False))
    rows = {"pid": [1, 1, 1, 2], "launch_id": [2**50, 2**50, 2**50 + 1, 5],
            "address": [0xFFFF_0000_0000, 0xFFFF_0000_1000, 0x10, 0x20], "size": [4, 4, 8, 4],
            "lanes": [0xFFFF_FFFF, 0xFFFF_FFFF, 1, 0xFFFF_FFFF]}
    sch = schema.DEVICE_FRAMES["access_samples"]
    pl.DataFrame({k: rows.get(k, [0] * 4) for k in sch}, schema=sch).write_parquet(
        tmp_path / "cap" / "device" / "access_samples.parquet")
    return tmp_path / "cap"


def test_addresses_beyond_48_bits_are_in_no_allocation(tmp_path: Path, monkeypatch, reader: str) -> None:
    """Keys that fit 64 bits with addresses of 48 bits or more (segments key on 48): those samples count
    in their launch's working set and in no allocation, as in the hash group-bys."""
    d = tmp_path / "cap"
    synthetic.write_capture(d, dataclasses.replace(SPEC, accesses=3_000))
    path = d / "device" / "access_samples.parquet"
    rows = pl.read_parquet(path)
    far = rows.head(40).with_columns((pl.lit(1 << 50, pl.UInt64) + pl.col("address")).alias("address"))
    pl.concat([rows, far]).write_parquet(path)
    cap = open_capture(d)
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    assert pk.page_shift + pk.page_bits > 48 and pk.fits(merge.segments(merge.allocations(cap).collect()))
    ws, hot = frames(d, reader)
    assert int(ws["samples"].sum()) == 3_040 and int(hot["samples"].sum()) < 3_000
    monkeypatch.setattr(pages, "packing", lambda *_: None)
    ws_hash, hot_hash = frames(d)
    assert ws.equals(ws_hash)
    assert hot.equals(hot_hash)


def test_a_short_read_is_an_error_not_a_smaller_result(cap_dir: Path, reader: str) -> None:
    # the streaming engine's batches end quietly when its decoder panics: rows are counted
    cap = opened(cap_dir, reader)
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    segs = merge.segments(merge.allocations(cap).collect())
    with pytest.raises(pl.exceptions.ComputeError, match="read 30000 of 30001 rows"):
        samples.sample_sums(cap, segs, dataclasses.replace(pk, rows=30_001), merge.WS_PAGE_SHIFT)


def test_an_error_in_a_reduction_lane_ends_the_pass_with_it(cap_dir: Path, monkeypatch, reader: str) -> None:
    """The sums and the distinct pages are reduced on threads of their own: what one raises, mid-input,
    is the pass's error (not a hang, not a smaller result), and Arrow's reading threads stop."""
    threads = threading.active_count()
    cap = opened(cap_dir, reader)
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    segs = merge.segments(merge.allocations(cap).collect())
    monkeypatch.setattr(samples, "BATCH_ROWS", 1_000)
    calls: list[int] = []
    real = samples.group_sums

    def fails_at_the_fifth(hk, scratch):
        calls.append(len(hk))
        if len(calls) == 5:
            raise MemoryError("fifth batch")
        return real(hk, scratch)

    monkeypatch.setattr(samples, "group_sums", fails_at_the_fifth)
    with pytest.raises(MemoryError, match="fifth batch"):
        samples.sample_sums(cap, segs, pk, merge.WS_PAGE_SHIFT)
    # the batches after it were not reduced, but for those already waiting in the lane (a race: at most these)
    assert 5 <= len(calls) <= 5 + samples.MAX_WAITING + 1
    assert threading.active_count() == threads
    assert cap.device.pending == (["access_samples"] if reader == "arrow" else [])  # still to be checked


def test_key_widths_come_from_the_footers_without_a_pass(cap_dir: Path, monkeypatch) -> None:
    cap = open_capture(cap_dir)
    scanned = samples._from_scan(cap, merge.WS_PAGE_SHIFT)
    monkeypatch.setattr(samples, "_from_scan", lambda *_: pytest.fail("the samples were scanned"))
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    assert (pk.launch_bits, pk.page_bits, pk.rows) == (scanned.launch_bits, scanned.page_bits, 30_000)
    # every pid between the footers' least and greatest, indexed as pid - least
    assert pk.pids.tolist() == list(range(int(scanned.pids[0]), int(scanned.pids[-1]) + 1))
    assert pk.pids.size > scanned.pids.size


def test_record_files_have_no_footers(cap_dir: Path) -> None:
    cap = open_capture(cap_dir)
    assert cap.device_files["access_samples"] == [cap_dir / "device" / "access_samples.parquet"]
    cap.device_files.clear()  # as for frames decoded from device record files
    assert samples._from_footers(cap, merge.WS_PAGE_SHIFT) is None
    assert samples.packing(cap, merge.WS_PAGE_SHIFT).pids.size == 4


@pytest.mark.parametrize("column", ["launch_id", "address", "pid"])
def test_statistics_that_lie_are_an_error(cap_dir: Path, monkeypatch, column: str) -> None:
    cap = open_capture(cap_dir)
    real = samples.column_ranges(cap.device_files["access_samples"], ["pid", "launch_id", "address"])
    lo, hi, nulls = real[1][column]
    lie = (lo, lo if column == "pid" else hi // 4, nulls)  # a max below the data's
    monkeypatch.setattr(samples, "column_ranges", lambda *_: (real[0], {**real[1], column: lie}))
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    segs = merge.segments(merge.allocations(cap).collect())
    with pytest.raises(pl.exceptions.ComputeError, match="beyond the file's statistics|unexpected pid"):
        samples.sample_sums(cap, segs, pk, merge.WS_PAGE_SHIFT)


def test_the_merge_command_reads_key_widths_from_its_copy(cap_dir: Path, tmp_path: Path, monkeypatch) -> None:
    # `pasta-trace merge` works on the copies it wrote: their footers serve as the capture's would
    ws = merge.working_set(open_capture(cap_dir)).collect().sort("pid", "launch_id")
    monkeypatch.setattr(samples, "_from_scan", lambda *_: pytest.fail("the samples were scanned"))
    merge.write_timeline(open_capture(cap_dir), tmp_path / "tl")
    got = pl.read_parquet(tmp_path / "tl" / "working_set.parquet").sort("pid", "launch_id")
    assert got.equals(ws.select(got.columns)) and got.height == 400


def test_sorting_in_two_halves_sorts(monkeypatch) -> None:
    import numpy as np

    from pasta_trace.merge import sort_reduce

    monkeypatch.setattr(sort_reduce, "HALVES_FROM", 1_000)
    rng = np.random.default_rng(5)
    for n in (999, 1_000, 1_001, 50_000):
        a = rng.integers(0, 1_000, n).astype(np.uint64)  # many equal keys, across the middle too
        want = np.sort(a)
        sort_reduce.sort_halves(a)
        assert np.array_equal(a, want)


def test_the_count_sorting_in_halves_gives_the_same_pages(cap_dir: Path, monkeypatch) -> None:
    from pasta_trace.merge import sort_reduce

    ws, _ = frames(cap_dir)
    monkeypatch.setattr(sort_reduce, "HALVES_FROM", 100)
    assert frames(cap_dir)[0].equals(ws)
