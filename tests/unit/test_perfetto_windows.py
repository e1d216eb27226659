"""The Perfetto writer makes its events one window of time at a time: any
windows give the bytes of one window over the whole trace, on a capture with
every kind of event, slices that end windows after they begin, events that
share an instant, and kernels (with device data) out of time order."""

from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest

from pasta_trace import merge
from pasta_trace.export import perfetto, trace_model
from pasta_trace.testing import synthetic

SPEC = synthetic.Spec(pids=2, launches=1_200, allocations=60, accesses=500, syncs=30, failed_allocs=5,
                      stacks=True, copies=20, tensors=40, collectives=12, seed=11)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, trace_model.TraceModel]:
    path = tmp_path_factory.mktemp("win") / "cap"
    synthetic.write_capture(path, SPEC)
    host = path.with_name("host")
    shutil.copytree(path, host, ignore=shutil.ignore_patterns("device"))
    return {"device": trace_model.build(merge.load(path)), "host-only": trace_model.build(merge.load(host))}


@pytest.mark.parametrize("which", ["device", "host-only"])
def test_windows_give_the_bytes_of_one_window(models: dict[str, trace_model.TraceModel], which: str) -> None:
    model = models[which]
    one = io.BytesIO()
    n = perfetto.write(model, one, window_rows=10**9)
    slices = [perfetto._Slices(f) for f in (model.api, model.kernels, model.memops)]
    counts = model.memory["ts_ns"].cast(int).to_numpy()
    assert perfetto._cuts(slices, counts, 10**9) == []  # one window
    cuts = perfetto._cuts(slices, counts, 20)  # a window every 20 begins, or about
    assert len(cuts) >= model.api.height // 20 // 2
    api = slices[0]  # slices that begin in one window and end in a later one
    assert (np.searchsorted(cuts, api.end, side="right")
            > np.searchsorted(cuts, model.api["ts_ns"].to_numpy()[api.end_rows], side="right")).any()
    out = io.BytesIO()
    assert perfetto.write(model, out, chunk_rows=997, window_rows=20) == n
    assert out.getvalue() == one.getvalue()


def test_kernels_with_device_timing_are_drawn_out_of_row_order(models: dict[str, trace_model.TraceModel]) -> None:
    """The kernels with device data are not in time order: they are read in
    time order through an index, not copied to sort them."""
    kernels = perfetto._Slices(models["device"].kernels)
    assert kernels.idx is not None
    assert (np.diff(kernels.ts) >= 0).all()
    assert perfetto._Slices(models["host-only"].kernels).idx is None
