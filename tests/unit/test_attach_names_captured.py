"""capture.naming.attach_names: a driver launch recorded into a CUDA graph (kind
captured) of a handle looked up before the attach is named from its driver
object, as a launch that ran is: the graph's launches run it by that name."""

from __future__ import annotations

import os
import time

import numpy as np
import polars as pl

from conftest import _built
from pasta_trace import schema
from pasta_trace.capture.naming.attach_names import AttachNamer
from test_attach_names import API, driver_objects, fake_proc, launches


def test_captured_launches_are_named_from_the_driver_objects(build_dir, tmp_path):
    proc = fake_proc(tmp_path, _built("attach_names_workload", build_dir))
    keep: list = []
    vec, scale = driver_objects([b"_Z6vecAddPKfS0_Pfi", b"_Z5scaleIfEvPT_S0_i"], keep, decoy=True)
    me = os.getpid()
    captured = launches(me, [vec, scale])
    captured["kind"] = int(schema.Kind.captured)
    namer = AttachNamer(API, proc=proc)
    namer.observe(captured, np.zeros(0, dtype=schema.HOST_NAME.dtype))
    namer.poll()
    deadline = time.monotonic() + 30
    while namer._running is not None and time.monotonic() < deadline:  # noqa: SLF001 - wait for the worker
        time.sleep(0.01)
        namer.poll()
    found = namer.finish()
    assert sorted(found.select("handle", "name", pl.col("source").cast(pl.String)).iter_rows()) == sorted(
        [(vec, "_Z6vecAddPKfS0_Pfi", "driver_object"), (scale, "_Z5scaleIfEvPT_S0_i", "driver_object")])
