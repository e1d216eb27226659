"""Bad values given to the verbs, through the real CLI: a flag value that is
no usable number or no scheduler address is a usage error (exit 2) of one
line; a server that is not a Dask scheduler, or one with no worker, is one
line too, in bounded time."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest

from pasta_trace import cli
from pasta_trace.errors import EXIT_RUNTIME, EXIT_USAGE

import merge_fixtures as fx

TRY = "try tcp://scheduler:8786"


def run(capsys, *argv: str) -> tuple[int, str, list[str]]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err.splitlines()


@pytest.mark.parametrize(("flag", "value"), [
    ("--tolerance-us", "nan"), ("--tolerance-us", "-1"), ("--tolerance-us", "inf"), ("--tolerance-us", "1e300"),
    ("--clock-sync-us", "inf"), ("--clock-sync-us", "nan"), ("--clock-sync-us", "-inf"),
])
def test_merge_refuses_a_microsecond_value_that_is_no_finite_span(tmp_path: Path, capsys, flag, value) -> None:
    cap = fx.write(tmp_path / "c")
    rc, out, err = run(capsys, "merge", str(cap), str(cap), "-o", str(tmp_path / "tl"), f"{flag}={value}")
    assert (rc, out) == (EXIT_USAGE, "")
    assert err == [f"pasta-trace: error: argument {flag}: {value} is not a number of microseconds in "
                   "0..86400000000: try 1000"]
    assert not (tmp_path / "tl").exists()


def test_merge_refuses_a_word_for_microseconds(tmp_path: Path, capsys) -> None:
    cap = fx.write(tmp_path / "c")
    rc, _, err = run(capsys, "merge", str(cap), "-o", str(tmp_path / "tl"), "--tolerance-us", "soon")
    assert rc == EXIT_USAGE
    assert err == ["pasta-trace: error: argument --tolerance-us: not a number of microseconds: 'soon': try 1000"]


@pytest.mark.parametrize(("value", "why"), [
    ("bogus", ""), ("inproc://x", ""), ("", ""), ("tcp://h", ""), ("tcp://h:1/x", ""), ("udp://h:1", ""),
    ("tcp://[::1", " (Invalid IPv6 URL)"), ("tcp://h:99999", " (Port out of range 0-65535)"),
])
def test_report_refuses_a_cluster_value_that_is_no_scheduler_address(tmp_path: Path, capsys, value, why) -> None:
    cap = fx.write(tmp_path / "c")
    rc, out, err = run(capsys, "report", str(cap), "--cluster", value)
    assert (rc, out) == (EXIT_USAGE, "")
    assert err == [f"pasta-trace: error: argument --cluster: {value!r} is not a scheduler address{why}: {TRY}"]


def _junk_server(answer: bytes) -> tuple[socket.socket, int]:
    """A TCP server on loopback that answers every connection with `answer`."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)

    def serve() -> None:
        while True:
            try:
                c, _ = s.accept()
            except OSError:
                return  # closed by the test
            with c:
                c.sendall(answer)
                time.sleep(0.2)

    threading.Thread(target=serve, daemon=True).start()
    return s, s.getsockname()[1]


@pytest.mark.parametrize("answer", [b"\xff" * 64, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" * 4,
                                    bytes(range(256)) * 4])
def test_report_on_a_server_that_is_not_dask(tmp_path: Path, capsys, answer) -> None:
    pytest.importorskip("distributed")
    cap = fx.write(tmp_path / "c")
    server, port = _junk_server(answer)
    try:
        t = time.monotonic()
        rc, out, err = run(capsys, "report", str(cap), "--cluster", f"tcp://127.0.0.1:{port}")
        took = time.monotonic() - t
    finally:
        server.close()
    assert (rc, out, len(err)) == (EXIT_USAGE, "", 1)
    assert err[0].startswith(f"pasta-trace: error: tcp://127.0.0.1:{port} is not a Dask scheduler (its answer: ")
    assert err[0].endswith(" (give the address `dask scheduler` prints, e.g. tcp://scheduler:8786)")
    assert took < 15


def test_report_on_a_scheduler_without_workers(tmp_path: Path, capsys, monkeypatch) -> None:
    distributed = pytest.importorskip("distributed")
    from pasta_trace import dask_cluster

    monkeypatch.setattr(dask_cluster, "WORKER_WAIT_S", 2.0)
    cap = fx.write(tmp_path / "c")
    with distributed.LocalCluster(n_workers=0, processes=False, protocol="tcp", host="127.0.0.1",
                                  dashboard_address=None) as lc:
        t = time.monotonic()
        rc, out, err = run(capsys, "report", str(cap), "--cluster", lc.scheduler_address)
        took = time.monotonic() - t
    assert (rc, out) == (EXIT_RUNTIME, "")
    assert err == [f"pasta-trace: error: the Dask scheduler at {lc.scheduler_address} has no worker (none joined "
                   f"in 2 s) (start one with: dask worker {lc.scheduler_address})"]
    assert took < 12


U64_MAX = (1 << 64) - 1


def test_an_allocation_beyond_the_address_space_is_no_allocation(tmp_path: Path, capsys) -> None:
    """A pointer and a size of 2^64 - 1 (their end wraps around 2^64): the
    merge and the report leave that allocation out, and its free is one of
    unknown memory; every other byte counts as before."""
    import json

    import polars as pl

    events = fx.EVENTS_10 + [fx.ev(900, 10, 11, "cuMemAlloc_v2", "alloc", ptr=U64_MAX, size=U64_MAX, ret=0),
                             fx.ev(950, 10, 11, "cuMemFree_v2", "free", ptr=U64_MAX, ret=0),
                             fx.ev(960, 10, 11, "cuMemAlloc_v2", "alloc", ptr=0x100000, size=U64_MAX, ret=0)]
    cap = fx.write(tmp_path / "c", events=events)
    rc, _, err = run(capsys, "merge", str(cap), "-o", str(tmp_path / "tl"))
    assert rc == 0 and err[-1] == f"You can now run: pasta-trace report {tmp_path / 'tl'}"
    allocs = pl.read_parquet(tmp_path / "tl" / "allocations.parquet")
    assert allocs.select("base", "size").rows() == [(0x10000, 0x20000), (0x40000, 0x10000), (0x10000, 0x8000)]
    for path in (cap, tmp_path / "tl"):
        rc, out, _ = run(capsys, "report", str(path), "--json", "--tool", "memory")
        assert rc == 0
        rows = json.loads(out)["tools"]["memory"]["rows"]
        assert [(r["ts_ns"], r["live_bytes"]) for r in rows if r["pid"] == 10] == [
            (100, 0x20000), (150, 0x30000), (300, 0x10000), (400, 0x18000), (700, 0x8000)]


def test_an_event_without_a_time_is_left_out_and_said(tmp_path: Path, capsys) -> None:
    events = fx.EVENTS_10 + [fx.ev(None, 10, 11, "cuMemAlloc_v2", "alloc", ptr=0x5000, size=0x10, ret=0)]
    cap = fx.write(tmp_path / "c", events=events)
    html = tmp_path / "r.html"
    rc, out, err = run(capsys, "report", str(cap), "--html", str(html))
    assert (rc, out) == (0, "") and html.stat().st_size > 0
    assert err == [f"Wrote {html}  (open it in a browser; no network needed)",
                   "pasta-trace: warning: INCOMPLETE: 0 events lost (events: rows left out (1 without ts_ns))"]


@pytest.mark.parametrize(("clock", "why"), [
    ({"start_ns": 10**40}, "clock.start_ns is an integer beyond 64 bits, expected an integer"),
    ({"end_ns": -(1 << 63) - 1}, "clock.end_ns is an integer beyond 64 bits, expected an integer"),
    ({"start_sample": {"realtime_ns": 1, "mono_before_ns": 1 << 64, "mono_after_ns": 2}},
     "clock.start_sample.mono_before_ns is an integer beyond 64 bits, expected an integer"),
    ({"end_sample": {"realtime_ns": 1.5}}, "clock.end_sample.realtime_ns is a number, expected an integer"),
])
def test_a_manifest_number_beyond_64_bits_is_refused(tmp_path: Path, capsys, clock, why) -> None:
    import json

    cap = fx.write(tmp_path / "c")
    m = json.loads((cap / "manifest.json").read_text())
    (cap / "manifest.json").write_text(json.dumps({**m, "clock": clock}))
    for argv in (["report", str(cap)], ["merge", str(cap), "-o", str(tmp_path / "tl")],
                 ["merge", str(cap), str(cap), "-o", str(tmp_path / "tl")]):
        rc, out, err = run(capsys, *argv)
        assert (rc, out) == (EXIT_RUNTIME, "")
        assert err == [f"pasta-trace: error: {cap / 'manifest.json'}: not a pasta-trace manifest ({why})"]


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_manifest_with_a_number_json_has_not(tmp_path: Path, capsys, constant) -> None:
    cap = fx.write(tmp_path / "c")
    (cap / "manifest.json").write_text('{"format_version": "1.0", "complete": true, "counts": {"lost_events": '
                                       f'{constant}}}}}')
    rc, out, err = run(capsys, "report", str(cap), "--json")
    assert (rc, out) == (EXIT_RUNTIME, "")
    assert err == [f"pasta-trace: error: {cap / 'manifest.json'}: damaged manifest ({constant} is not JSON)"]


def test_a_clock_sample_missing_a_clock_aligns_nothing(tmp_path: Path, capsys) -> None:
    """A cluster merge of captures whose clock samples lack mono_after_ns: no
    offset from them (was a KeyError), the merge is made."""
    import json

    a, b = fx.write(tmp_path / "a"), fx.write(tmp_path / "b")
    for c in (a, b):
        m = json.loads((c / "manifest.json").read_text())
        m["clock"] = {"start_sample": {"realtime_ns": 5, "mono_before_ns": 1}}
        (c / "manifest.json").write_text(json.dumps(m))
    rc, _, err = run(capsys, "merge", str(a), str(b), "-o", str(tmp_path / "tl"))
    assert rc == 0 and err[-1] == f"You can now run: pasta-trace report {tmp_path / 'tl'}"
