"""`pasta-trace merge`, the timeline directory, loading it back, and the
streaming plan of the big side."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import polars as pl

from pasta_trace import merge, schema
from pasta_trace.testing import synthetic
from pasta_trace.cli import main
from pasta_trace.device.writer import DeviceFileWriter
from pasta_trace.merge import samples
from pasta_trace.read import open_capture
from pasta_trace.schema import DeviceBackend, DeviceRecordType

import merge_fixtures as fx

STATS_LINES = [
    "kernel launches: 5 on the host, 5 on the device",
    "  matched 4 (3 exact, 1 by time); unmatched: 1 host, 1 device",
    "pages: 9, 3 not in a live allocation",
    "allocation touches: 3, 1 unresolved",
    "access samples: 3, 1 not in a live allocation",
]


def test_merge_writes_a_timeline_and_prints_stats(tmp_path: Path, capsys) -> None:
    src = fx.write(tmp_path / "cap")
    out = tmp_path / "timeline.parquet"
    assert main(["merge", str(src), "-o", str(out)]) == 0
    cap_out = capsys.readouterr()
    assert cap_out.out == ""  # stdout carries data only
    assert cap_out.err.splitlines() == [*STATS_LINES, f"Wrote {out}", f"You can now run: pasta-trace report {out}"]
    meta = json.loads((out / "timeline.json").read_text())
    assert meta["format_version"] == "1.4"
    assert meta["merge_stats"]["unmatched_device"] == 1
    assert sorted(p.name for p in out.iterdir()) == sorted(
        ["timeline.json", "device", "events.parquet", "names.parquet", "processes.parquet", "libraries.parquet",
         "stacks.parquet", "communicators.parquet", *(f"{k}.parquet" for k in schema.TIMELINE_FRAMES)])
    assert sorted(p.name for p in (out / "device").iterdir()) == sorted(f"{k}.parquet" for k in fx.DEVICE)
    assert not list(tmp_path.glob(".timeline.parquet.tmp-*"))


def test_timeline_loads_back_with_the_same_frames(tmp_path: Path) -> None:
    src = fx.write(tmp_path / "cap")
    out = tmp_path / "tl"
    stats = merge.write_timeline(open_capture(src), out)
    direct, loaded = open_capture(src), merge.load(out)
    assert loaded.merged and not direct.merged
    for fn in (merge.kernel_executions, merge.allocations, merge.attributed_pages, merge.alloc_touches,
               merge.working_set, merge.hotness):
        a = fn(direct).collect()
        b = fn(loaded).collect()
        sort = [c for c in ("pid", "launch_id", "alloc_id", "ts_ns", "page") if c in a.columns]
        assert a.sort(sort, nulls_last=True).equals(b.sort(sort, nulls_last=True)), fn.__name__
    assert merge.stats(loaded) == stats == merge.stats(direct)
    assert loaded.events.collect().height == direct.events.collect().height == len(fx.EVENTS_10) + len(fx.EVENTS_20) == 15
    assert loaded.manifest["host"] == "golden"
    # a timeline is not a capture to merge again
    assert main(["merge", str(out), "-o", str(tmp_path / "again")]) == 2


def test_refuses_to_overwrite_without_force(tmp_path: Path, capsys) -> None:
    src = fx.write(tmp_path / "cap")
    out = tmp_path / "tl"
    out.write_text("keep me")
    assert main(["merge", str(src), "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"pasta-trace: error: {out} exists (use --force to replace it)\n"
    assert out.read_text() == "keep me"
    assert main(["merge", str(src), "-o", str(out), "--force"]) == 0
    assert merge.is_timeline(out)
    # --force replaces a timeline, never some other directory
    other = tmp_path / "photos"
    other.mkdir()
    (other / "a.jpg").write_text("x")
    capsys.readouterr()
    assert main(["merge", str(src), "-o", str(other), "--force"]) == 2
    assert "not a pasta-trace timeline" in capsys.readouterr().err
    assert (other / "a.jpg").read_text() == "x"


def test_bad_inputs_are_one_line_errors(tmp_path: Path, capsys) -> None:
    assert main(["merge", str(tmp_path / "nope"), "-o", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == f"pasta-trace: error: {tmp_path / 'nope'}: no such file or directory\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["merge", str(empty), "-o", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a pasta-trace capture" in err
    src = fx.write(tmp_path / "cap", device=False)
    assert main(["merge", str(src), str(tmp_path / "missing.bin"), "-o", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err == f"pasta-trace: error: {tmp_path / 'missing.bin'}: no such device record file\n"
    assert not (tmp_path / "o").exists()


def test_output_under_a_file_is_a_usage_error(tmp_path: Path, capsys) -> None:
    src = fx.write(tmp_path / "cap", device=False)
    for force in ([], ["--force"]):
        assert main(["merge", str(src), "-o", "/dev/null/x", *force]) == 2
        assert capsys.readouterr().err == "pasta-trace: error: /dev/null is not a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap"]


def test_device_record_file_argument(tmp_path: Path) -> None:
    """Host-only capture + a TLV device file written by pasta_trace.device's
    writer and decoded by its reader: the same matches as the golden frames."""
    src = fx.write(tmp_path / "cap", device=False)
    bin_path = tmp_path / "gpu_probes.10.sanitizer.bin"
    with DeviceFileWriter(bin_path, pid=10, backend=DeviceBackend.sanitizer, page_shift=12) as w:
        for t in (0, 2_000_000_000):
            w.record(DeviceRecordType.CLOCK_SYNC, host_mono_before=t, gpu_globaltimer=fx.GPU_OFFSET + t,
                     host_mono_after=t)
        for lid, begin, t0 in ((1, 210, 230), (2, 510, 530), (3, 810, 830)):
            w.record(DeviceRecordType.LAUNCH, launch_id=lid, host_mono_begin=begin, host_mono_end=begin + 10,
                     tid=11, grid_id=lid, grid_x=4, block_x=128)
            w.record(DeviceRecordType.KERNEL_SUMMARY, launch_id=lid, gpu_t_first=fx.GPU_OFFSET + t0,
                     gpu_t_last=fx.GPU_OFFSET + t0 + 40, gld=100 * lid)
        w.page_hist(2, np.array([0x10, 0x28], np.uint64), np.array([7, 4], np.uint64))
    out = tmp_path / "tl"
    assert main(["merge", str(src), str(bin_path), "-o", str(out)]) == 0
    k = pl.read_parquet(out / "kernels.parquet").filter(pl.col("pid") == 10)
    assert k.select("launch_seq", "match", "launch_id", "gpu_start_ns", "gpu_end_ns", "gld").rows() == [
        (0, "exact", 1, 230, 270, 100), (1, "exact", 2, 530, 570, 200), (2, "exact", 3, 830, 870, 300)]
    p = pl.read_parquet(out / "pages.parquet")
    assert p.select("launch_id", "page", "count", "alloc_id").rows() == [(2, 0x10, 7, 2), (2, 0x28, 4, None)]


def _big_side_nodes(lf: pl.LazyFrame) -> list[list[str]]:
    """Physical streaming nodes on every path from a scan that reads access
    samples (its paths mention `lanes`) down to the first group-by."""
    g = lf.show_graph(engine="streaming", plan_stage="physical", raw_output=True)
    labels = {m[0]: m[1] for m in re.findall(r'^(\d+) \[label="(.*?)"[,\]]', g, re.M)}
    edges: dict[str, list[str]] = {}
    for a, b in re.findall(r"^(\d+) -> (\d+);", g, re.M):
        edges.setdefault(a, []).append(b)

    def paths(node: str) -> list[list[str]]:
        here = labels[node]
        if here.startswith("group-by") or not edges.get(node):
            return [[here]]
        return [[here, *rest] for nxt in edges[node] for rest in paths(nxt)]

    chains = []
    for node, label in labels.items():
        if label.startswith("multi-scan"):
            for chain in paths(node):
                if any("lanes" in c for c in chain):
                    chains.append([c.split("\\n")[0] for c in chain])
    return chains


def test_big_side_streams_without_sorts_or_whole_column_nodes(tmp_path: Path) -> None:
    synthetic.write_capture(tmp_path / "cap", synthetic.Spec(accesses=2_000, launches=50, allocations=40,
                                                              page_hist=False))
    cap = open_capture(tmp_path / "cap")
    pk = samples.packing(cap, merge.WS_PAGE_SHIFT)
    segs = merge.segments(merge.allocations(cap).collect())
    assert pk is not None and pk.fits(segs)
    # the working set and hotness: one query computing sort keys row by row
    # (samples.py); the pages folded from samples: a streaming group-by
    for lf, last in ((samples.keys(cap, segs, pk, merge.WS_PAGE_SHIFT), "select"),
                     (merge.attributed_pages(cap), "group-by")):
        chains = _big_side_nodes(lf)
        assert chains, "no access-sample scan found in the plan"
        for chain in chains:
            assert chain[0] == "multi-scan[parquet]" and chain[-1] == last, chain
            # no sort, no in-memory fallback, no columnar-function buffering the
            # column; a multiplexer feeds one scan to two group-bys
            assert set(chain[1:-1]) <= {"select", "with-columns", "filter", "multiplexer"}, chain


def test_synthetic_capture_merges_to_the_generators_truth(tmp_path: Path) -> None:
    truth = synthetic.write_capture(tmp_path / "cap", synthetic.Spec(seed=5, accesses=30_000, launches=400,
                                                                      allocations=80))
    cap = open_capture(tmp_path / "cap")
    got = merge.hotness(cap).join(merge.allocations(cap).select("alloc_id", "alloc_ts_ns"), on="alloc_id").select(
        "pid", "base", "alloc_ts_ns", "samples").collect().sort("pid", "base", "alloc_ts_ns")
    assert got.equals(truth.per_alloc.sort("pid", "base", "alloc_ts_ns"))
    s = merge.stats(cap)
    assert (s.host_launches, s.matched_exact, s.unmatched_host, s.unmatched_device) == (400, 400, 0, 0)
    assert (s.samples, s.unattributed_samples) == (30_000, 30_000 - truth.attributed)
    assert s.unattributed_touches == 0


def _extra_device_file(path: Path) -> Path:
    """Two launches of pid 30, which has no host events."""
    with DeviceFileWriter(path, pid=30, backend=DeviceBackend.sanitizer, page_shift=12) as w:
        for lid in (1, 2):
            w.record(DeviceRecordType.LAUNCH, launch_id=lid, host_mono_begin=100 * lid, host_mono_end=100 * lid + 10,
                     tid=31, grid_id=lid, grid_x=4, block_x=128)
    return path


def test_device_files_add_to_the_captures_own(tmp_path: Path, capsys) -> None:
    """Fails before: the device files given on the command line replaced the
    frames of DIR/device/, so pid 10 and 20 lost every device execution."""
    src = fx.write(tmp_path / "cap")
    extra = _extra_device_file(tmp_path / "gpu_probes.30.sanitizer.bin")
    out = tmp_path / "tl"
    assert main(["merge", str(src), str(extra), "-o", str(out)]) == 0
    launches = pl.read_parquet(out / "device" / "launches.parquet")
    assert sorted(launches.select("pid", "launch_id").rows()) == [
        (10, 1), (10, 2), (10, 3), (20, 7), (20, 8), (30, 1), (30, 2)]
    assert capsys.readouterr().err.splitlines()[:2] == [
        "kernel launches: 5 on the host, 7 on the device",
        "  matched 4 (3 exact, 1 by time); unmatched: 1 host, 3 device",
    ]
    k = pl.read_parquet(out / "kernels.parquet").filter(pl.col("pid") == 10)
    assert k.select("launch_seq", "match", "launch_id").rows() == [(0, "exact", 1), (1, "exact", 2), (2, "exact", 3)]


def test_a_device_file_of_the_capture_given_again_is_read_once(tmp_path: Path) -> None:
    src = fx.write(tmp_path / "cap", device=False)
    (src / "device").mkdir()
    own = _extra_device_file(src / "device" / "gpu_probes.30.sanitizer.bin")
    out = tmp_path / "tl"
    assert main(["merge", str(src), str(own), str(own), "-o", str(out)]) == 0
    launches = pl.read_parquet(out / "device" / "launches.parquet")
    assert sorted(launches.select("pid", "launch_id").rows()) == [(30, 1), (30, 2)]


def test_saved_statistics_of_a_newer_minor_version_load(tmp_path: Path) -> None:
    """Fails before: MergeStats(**saved) raised TypeError on a field it did not know."""
    src = fx.write(tmp_path / "cap")
    out = tmp_path / "tl"
    stats = merge.write_timeline(open_capture(src), out)
    meta = json.loads((out / "timeline.json").read_text())
    meta["merge_stats"]["future_counter"] = 5
    (out / "timeline.json").write_text(json.dumps(meta))
    loaded = merge.load(out)
    assert merge.stats(loaded) == stats
    assert loaded.manifest["notes"] == ["merge statistics from a newer pasta-trace ignored: future_counter"]
    # an older timeline without one of today's fields: counted again from its frames
    del meta["merge_stats"]["unattributed_samples"], meta["merge_stats"]["future_counter"]
    (out / "timeline.json").write_text(json.dumps(meta))
    loaded = merge.load(out)
    assert loaded.manifest["merge_stats"] is None and merge.stats(loaded) == stats


def test_executions_claiming_every_launch_in_order_give_their_own_columns(tmp_path):
    """Every launch claimed in order by the execution in the same row (the device columns
    are then shared, not gathered): each kernel row still has its own execution's columns."""
    from pasta_trace.merge.executions import device_executions

    synthetic.write_capture(tmp_path / "c", synthetic.Spec(pids=3, launches=20_000, allocations=200, syncs=10,
                                                           accesses=100, seed=5))
    cap = merge.load(tmp_path / "c")
    k = merge.kernel_executions(cap).collect()
    assert k.height == 20_000 and k["match"].eq("exact").all()
    dev = device_executions(cap).collect()
    cols = ["launch_id", "gpu_start_ns", "gpu_end_ns", "gld", "gst", "grid_id"]
    want = k.select("pid", "launch_seq").join(dev.select("pid", "launch_seq", *cols), on=["pid", "launch_seq"],
                                              how="left", maintain_order="left")
    assert k.select(cols).equals(want.select(cols))
    # the device's per-process launch_id counts from 1 in launch order
    assert k.select((pl.col("launch_id").cast(pl.Int64) == pl.col("launch_seq") + 1).all()).item()
