"""Device executions matched to host launches: rows paired by position, as-of
matches on rows already in time order, and the output order and claims
worked out without a sort of every execution, giving what the joins and
sorts give (merge/executions.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pasta_trace import merge, schema
from pasta_trace.merge import executions

from merge_fixtures import DEVICE, GPU_OFFSET, dev_launch, launch, write

#: pid 10, two threads: the device numbered thread 11's second launch before
#: thread 12's first, so launch_id - launch_seq is not one constant and every
#: execution is matched by time; launch 5 claims thread 12's last launch again
HOST = [launch(100, 10, 11, 0xA), launch(105, 10, 12, 0xA), launch(200, 10, 11, 0xA), launch(300, 10, 12, 0xA)]
DEV_ROWS = [(1, 11, 110), (2, 11, 210), (3, 12, 115), (4, 12, 310), (5, 12, 320)]


def _summary(launch_id: int, t0: int) -> dict:
    return {"pid": 10, "launch_id": launch_id, "gpu_t_first": GPU_OFFSET + t0, "gpu_t_last": GPU_OFFSET + t0 + 40,
            "gld": 100 * launch_id, "gst": 0, "blocks_in": 4, "blocks_out": 4, "warp_instrs": 0,
            "thread_instrs": 0, "gatom": 0, "gld_warp": 0, "gst_warp": 0, "gatom_warp": 0, "bytes": 0,
            "shared": 0, "local": 0, "dropped": 0}


def _capture(tmp_path, shuffle):
    dev = {"launches": [dev_launch(10, i, tid, t, 0xA) for i, tid, t in DEV_ROWS],
           "kernel_summaries": [_summary(i, t + 20) for i, _, t in DEV_ROWS],
           "clock_sync": DEVICE["clock_sync"]}
    return merge.load(write(tmp_path / "cap", events=HOST, dev=dev, shuffle=shuffle))


@pytest.mark.parametrize("shuffle", [None, 3], ids=["files-in-launch-order", "files-shuffled"])
def test_time_matches_out_of_launch_id_order_come_in_launch_order(tmp_path, shuffle):
    cap = _capture(tmp_path, shuffle)
    got = merge.device_executions(cap).select("pid", "launch_id", "launch_seq", "match", "gld", "gpu_start_ns")
    assert got.collect().rows() == [
        (10, 1, 0, "time", 100, 130),
        (10, 3, 1, "time", 300, 135),
        (10, 2, 2, "time", 200, 230),
        (10, 4, 3, "time", 400, 330),
        (10, 5, None, None, 500, 340),  # launch 4 claimed thread 12's launch at 300 first
    ]
    kernels = merge.kernel_executions(cap).select("ts_ns", "tid", "launch_id", "gld", "match").collect().rows()
    assert kernels == [(100, 11, 1, 100, "time"), (105, 12, 3, 300, "time"), (200, 11, 2, 200, "time"),
                       (300, 12, 4, 400, "time")]
    s = merge.stats(cap)
    assert (s.host_launches, s.device_executions, s.matched, s.matched_exact, s.matched_time, s.unmatched_host,
            s.unmatched_device) == (4, 5, 4, 0, 4, 0, 1)


def test_claims_in_launch_id_order_as_the_sort_of_four_columns_gives_them():
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(0, 40))
        pid = np.sort(rng.integers(1, 4, n)).astype(np.uint32)
        launch_id = np.zeros(n, np.uint64)
        for p in np.unique(pid):
            launch_id[pid == p] = np.cumsum(rng.integers(1, 3, int((pid == p).sum())))
        unmatched = pl.Series(rng.random(n) < 0.2)
        matched = pl.DataFrame({
            "pid": pid, "launch_id": launch_id,
            "launch_seq": pl.Series(rng.integers(0, 8, n)).set(unmatched, None),
            "match": pl.Series(rng.choice(schema.MATCH_NAMES, n), dtype=pl.Enum(schema.MATCH_NAMES)).set(
                unmatched, None),
        })
        want = executions._claimed_once(matched.with_row_index("_dev_row"))
        got = executions._claimed_once_in_order(matched)
        assert_frame_equal(got.with_columns(pl.col("_dev_row").cast(pl.UInt32)), want)
