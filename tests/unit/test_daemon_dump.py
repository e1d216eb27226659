"""A dump written from a window made here (pasta_trace.daemon.dump, no BPF):
its name, the manifest's trigger and clock, the events from the window's
start on and no earlier one, the drop count, a process row for a process
gone before its /proc was read, and `report` reading it as a capture."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import polars as pl

from pasta_trace import cli, schema
from pasta_trace.capture.output import manifest as mf
from pasta_trace.daemon import dump, window

S = 1_000_000_000


def _launches(pid: int, ts: list[int]) -> np.ndarray:
    recs = np.zeros(len(ts), schema.HOST_EVENT.dtype)
    recs["pid"] = recs["tid"] = pid
    recs["ts_ns"] = ts
    recs["kind"] = int(schema.Kind.launch)
    recs["comm"] = f"w{pid}".encode()
    return recs


def test_a_dump_is_a_capture_of_the_window(tmp_path: Path, capsys) -> None:
    now = 1000 * S
    seg = [window.Segment(_launches(7, [now - 5 * S, now - 3 * S + 1]), now - 5 * S, now - 3 * S + 1,
                          frozenset({7})),
           window.Segment(np.concatenate([_launches(7, [now - S]), _launches(8, [now - S // 2])]),
                          now - S, now - S // 2, frozenset({7, 8}))]
    snap = window.Snapshot(seg, np.empty(0, schema.HOST_NAME.dtype), dropped=4, held=4, pids={7, 8},
                           since_ns=now - 10 * S)
    known = pl.DataFrame([{**dict.fromkeys(schema.PROCESSES_SCHEMA), "pid": 7, "comm": "w7", "cmdline": "w7 --go"}],
                         schema=schema.PROCESSES_SCHEMA, orient="row")
    tables = dump.Tables(["pasta-trace", "daemon"], ["cuLaunchKernel"], known,
                         schema.empty_frame(schema.LIBRARIES_SCHEMA), [], 4096, window_s=3.0, window_bytes=1 << 30,
                         lost={"lost_events": 0})
    at = mf.ClockSample(now, 1_796_563_036_490_006_489, now + 1000)
    done = dump.write_dump(tmp_path / "dumps", snap, dump.Trigger("signal", "SIGUSR1", at), tables, None)
    assert done.path == tmp_path / "dumps" / "dump-20261206T131716.490Z-signal"
    # the launch at now - 5 s is older than the 3 s window: trimmed, and counted with the 4 dropped before
    assert (done.events, done.dropped) == (3, 5)
    manifest = json.loads((done.path / "manifest.json").read_text())
    assert manifest["trigger"] == {"kind": "signal", "cause": "SIGUSR1", "pid": None, "window_s": 3.0,
                                   "window_bytes": 1 << 30, "window_start_ns": now - 3 * S, "dropped_events": 5}
    assert manifest["clock"]["start_ns"] == now - 3 * S and manifest["clock"]["end_ns"] == now + 1000
    assert manifest["clock"]["start_sample"]["realtime_ns"] == 1_796_563_036_490_006_489 - 3 * S
    assert (manifest["complete"], manifest["mode"], manifest["pids"]) == (True, "system", [7, 8])
    assert manifest["counts"]["events"] == 3 and manifest["counts"]["by_kind"]["launch"] == 3
    events = pl.read_parquet(done.path / "events-00000.parquet")
    assert events.select("pid", "ts_ns").rows() == [(7, now - 3 * S + 1), (7, now - S), (8, now - S // 2)]
    procs = pl.read_parquet(done.path / "processes.parquet")
    assert procs.select("pid", "comm", "cmdline").rows() == [(7, "w7", "w7 --go"), (8, "w8", None)]
    assert cli.main(["report", str(done.path)]) == 0
    assert "\n      events  3\n" in capsys.readouterr().out
    # a second dump of the same millisecond gets its own directory
    again = dump.write_dump(tmp_path / "dumps", snap, dump.Trigger("signal", "SIGUSR1", at), tables, None)
    assert again.path.name == done.path.name + ".2"
