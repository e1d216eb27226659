"""Two captures of one job (ranks 0-1 and ranks 2-3), the second on a clock
that reads a known offset more, merged into one cluster timeline: the
offset is found, events line up with the one-capture original, and the
cross-rank tools give the one-capture answers."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pasta_trace import merge
from pasta_trace.merge.clock_align import fit_offsets
from pasta_trace.tools import REGISTRY

from cluster_fixtures import BRACKET_NS, pids, whole, write_part

SHIFT = 7_345_678_901  # the second machine's CLOCK_MONOTONIC reads this much more
CROSS_RANK = ("stragglers", "straggler_ranks", "hangs", "collectives")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("cluster")
    src = whole(tmp)
    p = pids(src)
    write_part(src, tmp / "a", p[:2])
    write_part(src, tmp / "b", p[2:], shift=SHIFT)
    caps = [merge.load(tmp / "a"), merge.load(tmp / "b")]
    out = tmp / "merged"
    offsets = merge.write_cluster(caps, merge.timeline_output(out), sync_ns=10_000_000)
    return {"src": src, "out": out, "offsets": offsets, "tmp": tmp, "pids": p}


def test_offset_found_from_the_clock_samples(cluster):
    off = cluster["offsets"].select("capture", "node", "pid_offset", "offset_ns", "uncertainty_ns", "method",
                                    "realtime_offset_ns", "collectives")
    # same host: CLOCK_REALTIME is one clock, only the brackets (half each, both captures) count
    assert off.rows() == [(0, "synthetic", 0, 0, 0, "reference", 0, 0),
                          (1, "synthetic", 0, -SHIFT, BRACKET_NS, "realtime", -SHIFT, 300)]


def test_events_aligned_with_the_original(cluster):
    merged = merge.load(cluster["out"]).events.collect()
    orig = merge.load(cluster["src"]).events.collect()
    assert merged.height == orig.height
    order = ["pid", "ts_ns", "tid", "api", "seq"]
    merged, orig = merged.sort(order), orig.sort(order)
    assert merged.drop("ts_ns").equals(orig.drop("ts_ns"))
    error = (merged["ts_ns"] - orig["ts_ns"]).abs().max()
    assert error <= 10_000  # 10 us
    assert error == 0  # the brackets are symmetric: the midpoints are exact


@pytest.mark.parametrize("tool", CROSS_RANK)
def test_cross_rank_tools_equal_one_capture(cluster, tool):
    one = REGISTRY[tool].compute(merge.load(cluster["src"]))
    many = REGISTRY[tool].compute(merge.load(cluster["out"]))
    assert one.height > 0
    assert many.equals(one)


def test_hive_layout(cluster):
    files = sorted(str(f.relative_to(cluster["out"])) for f in (cluster["out"] / "events").rglob("*.parquet"))
    assert files == ["events/node=synthetic/rank=0/capture-0.parquet", "events/node=synthetic/rank=1/capture-0.parquet",
                     "events/node=synthetic/rank=2/capture-1.parquet", "events/node=synthetic/rank=3/capture-1.parquet"]
    ranks = merge.load(cluster["out"]).cluster["ranks"].collect()
    assert ranks.select("capture", "pid", "rank").rows() == [
        (0, cluster["pids"][0], 0), (0, cluster["pids"][1], 1), (1, cluster["pids"][2], 2), (1, cluster["pids"][3], 3)]


def test_collectives_correct_a_wrong_realtime_clock(cluster):
    """Another host whose CLOCK_REALTIME is 3 ms off: the samples say SHIFT + 3 ms,
    the shared collectives put it back within 10 us."""
    tmp, src, p = cluster["tmp"], cluster["src"], cluster["pids"]
    write_part(src, tmp / "c", p[2:], shift=SHIFT, realtime_error=3_000_000, host="node-c")
    off = fit_offsets([merge.load(tmp / "a"), merge.load(tmp / "c")], sync_ns=10_000_000).row(1, named=True)
    assert off["realtime_offset_ns"] == -SHIFT + 3_000_000
    assert off["method"] == "collectives"
    assert abs(off["offset_ns"] + SHIFT) <= 10_000
    assert off["uncertainty_ns"] < 10_000
    # trusted clocks (1 us apart at most): the collectives may move the offset no further than that
    tight = fit_offsets([merge.load(tmp / "a"), merge.load(tmp / "c")], sync_ns=1_000).row(1, named=True)
    assert tight["method"] == "realtime"
    assert tight["offset_ns"] == -SHIFT + 3_000_000


def test_colliding_pids_move_up(cluster):
    tmp, src, p = cluster["tmp"], cluster["src"], cluster["pids"]
    caps = [merge.load(tmp / "a"), merge.load(tmp / "a")]
    off = fit_offsets(caps, sync_ns=0)
    assert off["pid_offset"].to_list() == [0, 1 << 22]


def test_merge_command_prints_the_offsets(cluster, capsys):
    from pasta_trace.cli import main

    tmp = cluster["tmp"]
    out = tmp / "cli.parquet"
    assert main(["merge", str(tmp / "a"), str(tmp / "b"), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert [line.split()[-6:] for line in err[1:3]] == [
        ["synthetic", "0.0", "us", "0.0", "us", "reference"], ["synthetic", "-7345678.9", "us", "0.8", "us", "realtime"]]
    assert err[3:] == [f"Wrote {out}", f"You can now run: pasta-trace report {out}"]
    assert main(["merge", str(tmp / "a"), str(tmp / "b"), "x.bin", "-o", str(out), "--force"]) == 1
    assert capsys.readouterr().err == "pasta-trace: error: x.bin: no such device record file\n"


def test_duckdb_reads_the_layout_as_it_is(cluster):
    duckdb = pytest.importorskip("duckdb", reason="duckdb (the dev extra) is not installed")
    events = cluster["out"] / "events" / "*" / "*" / "*.parquet"
    rows = duckdb.sql(f"""
        SELECT node, rank, count(*) AS calls, min(ts_ns) AS first
        FROM read_parquet('{events}', hive_partitioning = true)
        WHERE kind = 'collective' GROUP BY node, rank ORDER BY rank""").fetchall()
    first = merge.load(cluster["src"]).events.filter(pl.col("kind") == "collective").group_by("pid").agg(
        pl.len(), pl.col("ts_ns").min()).sort("pid").collect().rows()
    assert rows == [("synthetic", r, n, t) for r, (_, n, t) in enumerate(first)]
    assert [n for *_, n, _ in rows] == [300, 300, 300, 299]  # the last rank never entered the last one


def _coll_flows(events: list[dict]) -> dict[str, dict[str, tuple]]:
    flows: dict[str, dict[str, tuple]] = {"s": {}, "f": {}}
    for e in events:
        if e.get("cat") == "nccl":
            flows[e["ph"]][e["id"]] = (e["pid"], e["ts"])
    return flows


def test_chrome_export_groups_by_node_and_rank_with_collective_arrows(cluster):
    import json

    from pasta_trace.cli import main

    out = cluster["tmp"] / "cluster.json"
    assert main(["export", str(cluster["out"]), "--format", "chrome", "-o", str(out), "--force"]) == 0
    events = json.loads(out.read_text())["traceEvents"]
    names = sorted(e["args"]["name"] for e in events if e.get("name") == "process_name")
    assert names == [f"synthetic rank {r}: worker {p}" for r, p in enumerate(cluster["pids"])]
    flows = _coll_flows(events)
    # 300 collectives of 4 ranks, the last of 3: one arrow from each rank in to the next
    assert len(flows["s"]) == 299 * 3 + 2
    assert flows["s"].keys() == flows["f"].keys()
    assert all(flows["s"][i][1] <= flows["f"][i][1] and flows["s"][i][0] != flows["f"][i][0] for i in flows["s"])


def test_perfetto_export_has_the_collective_flows(cluster):
    from test_export_perfetto import Parsed

    from pasta_trace.cli import main
    from pasta_trace.export.trace_model import COLLECTIVE_FLOW_BASE

    out = cluster["tmp"] / "cluster.pftrace"
    assert main(["export", str(cluster["out"]), "--format", "perfetto", "-o", str(out), "--force"]) == 0
    t = Parsed(out.read_bytes())
    coll = {f for f in t.flows_out if f >= COLLECTIVE_FLOW_BASE}
    assert len(coll) == 299 * 3 + 2 and coll == {f for f in t.flows_in if f >= COLLECTIVE_FLOW_BASE}
    procs = sorted(n for n in t.tracks.values() if n.startswith("process"))
    assert procs == [f"process {p} synthetic rank {r}: worker {p}" for r, p in enumerate(cluster["pids"])]


def test_realtime_offset_from_the_two_samples():
    from pasta_trace.merge.clock_align import realtime_offset

    clock = {"start_sample": {"mono_before_ns": 1000, "realtime_ns": 5000, "mono_after_ns": 1200},
             "end_sample": {"mono_before_ns": 2000, "realtime_ns": 6010, "mono_after_ns": 2100}}
    # realtime - mono: 3900 (+-100) at the start, 3960 (+-50) at the end: their middle, the wider
    # half-bracket plus half the drift between them
    got = realtime_offset({"clock": clock})
    assert (got.offset_ns, got.uncertainty_ns) == (3930, 100 + 30)
    assert realtime_offset({"clock": {"start_ns": 1}}) is None


def test_report_cluster_without_dask_says_what_to_install(cluster, monkeypatch, capsys):
    import sys

    from pasta_trace.cli import main

    monkeypatch.setitem(sys.modules, "dask.dataframe", None)  # as if the extra were not installed
    assert main(["report", str(cluster["out"]), "--cluster", "tcp://127.0.0.1:8786"]) == 2
    assert capsys.readouterr().err == ("pasta-trace: error: the cluster analyses need Dask (pip install "
                                       "'pasta-trace[cluster]' (dask[dataframe] and distributed))\n")


def test_device_data_left_out_is_said(cluster, capsys):
    from pasta_trace.cli import main

    tmp, src = cluster["tmp"], cluster["src"]
    out = tmp / "with-device.parquet"
    assert main(["merge", str(src), str(tmp / "b"), "-o", str(out)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (f"pasta-trace: warning: {src}: its device data is not in the cluster timeline "
                      f"(see its kernels with: pasta-trace merge {src} -o OUT)")
