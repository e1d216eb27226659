"""merge.held.with_merged: a report's one merge, done by the reporters'
results builder before the tools run (the tools only read): the held frames
are the merge's, a merged timeline is used as it is, and every tool gives on
them what it gives merging on its own."""

from __future__ import annotations

from pathlib import Path

from polars.testing import assert_frame_equal

from pasta_trace import merge
from pasta_trace.merge.held import with_merged
from pasta_trace.read import open_capture
from pasta_trace.reporters.results import gather
from pasta_trace.tools import REGISTRY

import merge_fixtures as fx

HELD = {"kernels": merge.kernel_executions, "allocations": merge.allocations, "pages": merge.attributed_pages}


def test_held_frames_are_the_merge(tmp_path: Path) -> None:
    src = fx.write(tmp_path / "cap")
    cap = open_capture(src)
    held = with_merged(cap)
    assert not cap.merged and sorted(held.merged) == sorted(HELD)
    for name, fn in HELD.items():
        want = fn(open_capture(src)).collect()
        assert want.height > 0, name
        assert_frame_equal(held.merged[name].collect(), want)
        assert_frame_equal(fn(held).collect(), want)  # the merge reads the held frame back


def test_a_timeline_or_a_held_capture_is_used_as_it_is(tmp_path: Path) -> None:
    src = fx.write(tmp_path / "cap")
    merge.write_timeline(open_capture(src), tmp_path / "tl")
    loaded = merge.load(tmp_path / "tl")
    assert with_merged(loaded) is loaded
    held = with_merged(open_capture(src))
    assert with_merged(held) is held


def test_a_report_merges_before_the_tools_and_they_read_it(tmp_path: Path) -> None:
    src = fx.write(tmp_path / "cap")
    results = gather(open_capture(src))
    assert sorted(results.cap.merged) == sorted(HELD)
    assert [r.tool.name for r in results.tools] == list(REGISTRY)
    differ = [r.tool.name for r in results.tools if not r.frame.equals(r.tool.compute(open_capture(src)))]
    assert differ == []
    # those that found something: the device tools read the held kernels and pages
    assert [r.tool.name for r in results.tools if r.frame.height] == [
        "processes", "api_errors", "kernels", "kernel_call_sites", "memory", "memory_totals", "memory_peaks",
        "peak_call_sites", "leaks", "leak_call_sites", "call_sites", "launch_gaps", "gpu_idle", "working_set",
        "alloc_hotness", "page_hotness", "prefetch"]
