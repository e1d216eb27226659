"""`pasta-trace export` errors: one line, the exit codes of pasta_trace.errors,
no traceback, no half-written output; default output names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pasta_trace.cli import main
from pasta_trace.errors import EXIT_RUNTIME, EXIT_USAGE
from test_export_model import write_capture


def _run(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, list[str]]:
    code = main(["export", *args])
    return code, capsys.readouterr().err.splitlines()


def test_unknown_format_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cap = write_capture(tmp_path / "cap")
    assert _run([str(cap), "--format", "svg", "-o", str(tmp_path / "x")], capsys) == (
        EXIT_USAGE, ["pasta-trace: error: unknown format 'svg'; choose one of: perfetto, chrome, csv"])
    assert not (tmp_path / "x").exists()


def test_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "nope"
    assert _run([str(missing), "-o", str(tmp_path / "t.pftrace")], capsys) == (
        EXIT_RUNTIME, [f"pasta-trace: error: {missing}: no such file or directory"])
    assert list(tmp_path.iterdir()) == []


def test_existing_output_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cap = write_capture(tmp_path / "cap")
    out = tmp_path / "t.json"
    out.write_text("keep me")
    for fmt in ("perfetto", "chrome"):
        assert _run([str(cap), "--format", fmt, "-o", str(out)], capsys) == (
            EXIT_USAGE, [f"pasta-trace: error: {out} exists (use --force to overwrite it)"])
    assert out.read_text() == "keep me"
    code, err = _run([str(cap), "--format", "chrome", "-o", str(out), "--force"], capsys)
    assert code == 0 and out.read_text().startswith('{"displayTimeUnit":"ns"')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap", "t.json"]  # no temporary file left


def test_existing_csv_directory_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cap = write_capture(tmp_path / "cap")
    out = tmp_path / "csv"
    out.mkdir()
    assert _run([str(cap), "--format", "csv", "-o", str(out)], capsys) == (
        EXIT_USAGE, [f"pasta-trace: error: output directory {out} already exists (use --force to overwrite it)"])
    assert list(out.iterdir()) == []
    assert _run([str(cap), "--format", "csv", "-o", str(out), "--force"], capsys)[0] == 0
    assert (out / "events.csv").is_file()


def test_output_of_the_wrong_kind(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cap = write_capture(tmp_path / "cap")
    assert _run([str(cap), "-o", str(cap), "--force"], capsys) == (
        EXIT_USAGE, [f"pasta-trace: error: {cap} is a directory (give a file name, e.g. {cap}/trace.pftrace)"])
    assert _run([str(cap), "-o", str(tmp_path / "no" / "t.pftrace")], capsys) == (
        EXIT_USAGE, [f"pasta-trace: error: {tmp_path / 'no'}: no such directory"])


def test_default_output_names(tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = write_capture(tmp_path / "pasta-host-1")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for fmt in ("perfetto", "chrome", "csv"):
        code, err = _run([str(cap) + "/", "--format", fmt], capsys)
        assert code == 0
        assert err[0].startswith(f"Wrote pasta-host-1{ {'perfetto': '.pftrace', 'chrome': '.json', 'csv': '-csv'}[fmt]} (")
    assert sorted(p.name for p in work.iterdir()) == ["pasta-host-1-csv", "pasta-host-1.json", "pasta-host-1.pftrace"]


def test_capture_problems_and_no_calls_are_warned(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cap = write_capture(tmp_path / "cap", [])
    (cap / "manifest.json").unlink()  # a tracer killed before it finished
    code, err = _run([str(cap), "-o", str(tmp_path / "t.pftrace")], capsys)
    assert code == 0
    assert [line for line in err if "warning" in line] == [
        "pasta-trace: warning: no manifest.json: the tracer did not finish; the last interval may be missing",
        f"pasta-trace: warning: {cap} holds no API calls",
    ]


def test_lost_events_are_reported_and_the_trace_still_written(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    cap = write_capture(tmp_path / "cap")
    assert _run([str(cap), "-o", str(tmp_path / "whole.pftrace")], capsys)[0] == 0
    manifest = json.loads((cap / "manifest.json").read_text())
    manifest["counts"]["lost_events"] = 7
    (cap / "manifest.json").write_text(json.dumps(manifest))
    out = tmp_path / "t.pftrace"
    code, err = _run([str(cap), "-o", str(out)], capsys)
    # the same trace as without losses: every event that was captured
    assert code == 0 and out.read_bytes() == (tmp_path / "whole.pftrace").read_bytes()
    assert err[1:] == ["open it at https://ui.perfetto.dev (Open trace file)",
                       "pasta-trace: warning: INCOMPLETE: 7 events were lost during capture"]
