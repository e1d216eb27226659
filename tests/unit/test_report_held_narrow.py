"""A report's merge leaves out what no tool reads (the kernel summaries'
counters): the held kernels are the full merge's without them."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from pasta_trace import merge
from pasta_trace.read import open_capture
from pasta_trace.reporters.results import COUNTERS, gather

import merge_fixtures as fx


def test_the_held_kernels_have_no_counters_and_asking_for_one_fails(tmp_path: Path) -> None:
    src = fx.write(tmp_path / "cap")
    full = merge.kernel_executions(open_capture(src)).collect()
    assert set(COUNTERS) <= set(full.columns) and len(COUNTERS) == 14
    held = gather(open_capture(src), ["kernels"]).cap.merged["kernels"]
    assert held.collect_schema().names() == [c for c in full.columns if c not in COUNTERS]
    assert_frame_equal(held.collect(), full.drop(COUNTERS))
    with pytest.raises(pl.exceptions.ColumnNotFoundError):
        held.select("warp_instrs").collect()
