"""`pasta-trace report`: terminal tables, the INCOMPLETE banner, --json, --html,
and one-line errors with the documented exit codes, run through the real CLI."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from pasta_trace import cli, merge
from pasta_trace.errors import EXIT_OK, EXIT_RUNTIME, EXIT_USAGE
from pasta_trace.tools import REGISTRY
from test_tools_capture import T0, write_capture, write_device_capture


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(["report", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_terminal_report_has_findings_facts_and_every_tool(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")
    rc, out, err = run(capsys, str(write_capture(tmp_path / "cap")))
    assert (rc, err) == (EXIT_OK, "")  # no progress bar: stderr is not a terminal
    lines = out.splitlines()
    # it opens with the key findings, then the capture's facts
    assert lines[:7] == [
        "Key findings",
        "  top kernel  axpy: 2 launches, pid 100 (GPU time needs device data)",
        "       syncs  3.5 µs blocked in 3 sync calls; most in cuStreamSynchronize (2 µs, pid 100)",
        " peak memory  24.0 KiB live on the device, pid 100 at 0.000014 s",
        "      errors  no failed calls",
        "       leaks  4 allocations never freed, 26.0 KiB",
        "",
    ]
    assert "     command  pasta-trace -a -d 1" in lines
    assert "    duration  0.000025 s" in lines
    assert "   processes  100, 200" in lines
    # a table per tool that found something, one line for those that did not, one for those that need device data
    shown = [t.title for t in REGISTRY.values() if t.title in lines]
    assert lines[-4:] == [
        "Nothing found: api_errors, copy_storms",
        "Needs tensor events (a PyTorch program); this capture has none: tensor_memory, tensor_peaks, "
        "tensor_peak_call_sites, tensor_fragmentation, tensor_leaks,",
        "tensors_never_freed",
        "Needs device data (gpu_probes or CUPTI); this capture has none: launch_gaps, gpu_idle, working_set, "
        "alloc_hotness, page_hotness, prefetch",
    ]
    assert len(shown) == len(REGISTRY) - 2 - 6 - 6
    # memory renderer: peak and end per process
    assert "pid 100: peak 24.0 KiB, end 24.0 KiB, 4 steps" in lines
    assert "pid 200: peak 2.0 KiB, end 1.0 KiB, 3 steps" in lines
    assert "cudaMemPrefetchAsync" not in out


def test_banner_counts_lost_events(tmp_path: Path, capsys) -> None:
    rc, out, _ = run(capsys, str(write_capture(tmp_path / "cap", lost_events=7)))
    assert rc == EXIT_OK
    assert out.splitlines()[0] == "INCOMPLETE: 7 events lost"


def test_banner_for_a_capture_that_did_not_finish(tmp_path: Path, capsys) -> None:
    rc, out, _ = run(capsys, str(write_capture(tmp_path / "cap", complete=False)))
    assert rc == EXIT_OK
    assert out.splitlines()[0] == "INCOMPLETE: 0 events lost (manifest says the capture is incomplete)"


def test_json_is_the_only_thing_on_stdout(tmp_path: Path, capsys) -> None:
    rc, out, err = run(capsys, str(write_capture(tmp_path / "cap", lost_events=3)), "--json")
    assert rc == EXIT_OK
    assert err == "pasta-trace: warning: INCOMPLETE: 3 events lost\n"
    doc = json.loads(out)
    assert list(doc["tools"]) == list(REGISTRY)
    assert doc["incomplete"] == "INCOMPLETE: 3 events lost"
    assert doc["key_findings"][1] == {
        "topic": "syncs", "text": "3.5 µs blocked in 3 sync calls; most in cuStreamSynchronize (2 µs, pid 100)",
        "subject": None, "tool": "sync"}
    facts = doc["capture"]
    assert (facts["start_ts_ns"], facts["end_ts_ns"], facts["duration_ns"]) == (T0, T0 + 25_000, 25_000)
    assert (facts["pids"], facts["events"], facts["lost_events"], facts["complete"]) == ([100, 200], 18, 3, True)
    assert facts["started_utc"] == "2026-12-02T12:00:00+00:00"
    leaks = doc["tools"]["leaks"]
    assert leaks["columns"] == ["pid", "tid", "api", "kind", "base", "size", "alloc_ts_ns", "age_ns", "call_site"]
    assert leaks["rows"][0] == {"pid": 100, "tid": 101, "api": "cuMemAlloc_v2", "kind": "device", "base": 0x30000,
                                "size": 16384, "alloc_ts_ns": T0 + 14000, "age_ns": 11000, "call_site": None}
    assert doc["tools"]["prefetch"]["rows"] == []
    assert doc["tools"]["prefetch"]["note"] == "needs device data (gpu_probes or CUPTI); this capture has none"


def test_json_tool_filter(tmp_path: Path, capsys) -> None:
    rc, out, _ = run(capsys, str(write_capture(tmp_path / "cap")), "--json", "--tool", "sync", "--tool", "leaks")
    assert rc == EXIT_OK
    doc = json.loads(out)
    assert list(doc["tools"]) == ["sync", "leaks"]
    assert [r["blocked_ns"] for r in doc["tools"]["sync"]["rows"]] == [2000, 1000, 500]


def test_report_reads_a_merged_timeline(tmp_path: Path, capsys) -> None:
    cap = merge.load(write_device_capture(tmp_path / "cap"))
    merge.write_timeline(cap, tmp_path / "timeline.parquet")
    rc, out, _ = run(capsys, str(tmp_path / "timeline.parquet"), "--json", "--tool", "prefetch", "--tool", "gpu_idle")
    assert rc == EXIT_OK
    doc = json.loads(out)
    assert [r["advice"] for r in doc["tools"]["prefetch"]["rows"]] == [
        "cudaMemPrefetchAsync((void*)0x20000, 8192, 0, (cudaStream_t)0x5)",
        "cudaMemPrefetchAsync((void*)0x24000, 2048, 0, (cudaStream_t)0x5)",
        "cudaMemPrefetchAsync((void*)0x22000, 4096, 0, (cudaStream_t)0x5)",
    ]
    assert doc["tools"]["gpu_idle"]["rows"][0]["idle_ns"] == 1400
    assert doc["capture"]["merge"]["matched_exact"] == 4


def test_html_written_once_then_refused_without_force(tmp_path: Path, capsys) -> None:
    cap = str(write_device_capture(tmp_path / "cap"))
    out_html = tmp_path / "r.html"
    rc, out, err = run(capsys, cap, "--html", str(out_html))
    assert (rc, out) == (EXIT_OK, "")
    assert err == f"Wrote {out_html}  (open it in a browser; no network needed)\n"
    page = out_html.read_text()
    assert page.startswith("<!DOCTYPE html>")
    # self-contained: one inline script, nothing loaded from anywhere (no src=, no <link>, no address at all)
    assert page.count("<script") == 1 and "<script>" in page
    assert " src=" not in page and "<link" not in page and "http://" not in page and "https://" not in page
    assert page.count('class="series"') == 2 and page.count('class="cell"') == 8
    out_html.write_text("keep me")
    rc, out, err = run(capsys, cap, "--html", str(out_html))
    assert rc == EXIT_USAGE
    assert err == f"pasta-trace: error: {out_html} exists (use --force to overwrite it)\n"
    assert out_html.read_text() == "keep me"
    rc, _, _ = run(capsys, cap, "--html", str(out_html), "--force")
    assert rc == EXIT_OK
    assert out_html.read_text().startswith("<!DOCTYPE html>")


def test_html_banner_for_lost_events(tmp_path: Path, capsys) -> None:
    out_html = tmp_path / "r.html"
    rc, _, err = run(capsys, str(write_capture(tmp_path / "cap", lost_events=5)), "--html", str(out_html))
    assert rc == EXIT_OK
    assert err.endswith("pasta-trace: warning: INCOMPLETE: 5 events lost\n")
    assert '<div class="banner" id="incomplete">INCOMPLETE: 5 events lost</div>' in out_html.read_text()


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["{tmp}/nope"], EXIT_RUNTIME, "pasta-trace: error: {tmp}/nope: no such file or directory\n"),
        (["{tmp}/empty"], EXIT_RUNTIME,
         "pasta-trace: error: {tmp}/empty: not a pasta-trace capture (no manifest.json, no events*.parquet)\n"),
        (["{tmp}/cap", "--limit", "0"], EXIT_USAGE, "pasta-trace: error: --limit must be at least 1\n"),
        (["{tmp}/cap", "--html", "{tmp}/no/such/dir/r.html"], EXIT_USAGE,
         "pasta-trace: error: {tmp}/no: no such directory\n"),
    ],
)
def test_errors_are_one_line_with_exit_codes(tmp_path: Path, capsys, argv, code, message) -> None:
    write_capture(tmp_path / "cap")
    (tmp_path / "empty").mkdir()
    rc, out, err = run(capsys, *[a.format(tmp=tmp_path) for a in argv])
    assert (rc, out, err) == (code, "", message.format(tmp=tmp_path))


def test_html_into_a_directory_is_a_usage_error(tmp_path: Path, capsys) -> None:
    cap = str(write_capture(tmp_path / "cap"))
    d = tmp_path / "out"
    d.mkdir()
    for force in ([], ["--force"]):
        assert run(capsys, cap, "--html", str(d), *force) == (
            EXIT_USAGE, "", f"pasta-trace: error: {d} is a directory (give a file name, e.g. {d}/report.html)\n")
    assert list(d.iterdir()) == []


def test_damaged_manifest_is_one_line(tmp_path: Path, capsys) -> None:
    cap = write_capture(tmp_path / "cap")
    (cap / "manifest.json").write_text("{not json")
    rc, out, err = run(capsys, str(cap))
    assert (rc, out) == (EXIT_RUNTIME, "")
    assert err.startswith(f"pasta-trace: error: {cap}/manifest.json: damaged manifest")
    assert err.count("\n") == 1


def test_unknown_tool_is_a_usage_error(tmp_path: Path, capsys) -> None:
    rc = cli.main(["report", str(write_capture(tmp_path / "cap")), "--tool", "nosuch"])
    assert rc == EXIT_USAGE
    choices = ", ".join(f"'{name}'" for name in REGISTRY)
    assert capsys.readouterr().err == (f"pasta-trace: error: argument --tool: invalid choice: 'nosuch' "
                                       f"(choose from {choices})\n")


def test_progress_bar_only_on_a_terminal(tmp_path: Path) -> None:
    """stderr on a pseudo-terminal gets a progress bar; stdout still carries only the JSON."""
    cap = write_capture(tmp_path / "cap")
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(Path(cli.__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "pasta_trace.cli", "report", str(cap), "--json"],
                            stdout=subprocess.PIPE, stderr=slave, env=env)
    os.close(slave)
    out = proc.communicate(timeout=120)[0]
    seen = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.returncode == EXIT_OK
    assert list(json.loads(out)["tools"]) == list(REGISTRY)
    assert b"merging" in seen and b"100%" in seen


def test_a_capture_without_events_reports_nothing_found(tmp_path: Path, capsys) -> None:
    cap = str(write_capture(tmp_path / "cap", rows=[], names=[], processes=[]))
    rc, out, _ = run(capsys, cap)
    assert rc == EXIT_OK
    assert "   processes  none" in out and "      events  0" in out
    host_tools = [name for name, t in REGISTRY.items() if not t.needs_device and not t.needs_tensors]
    # the device tools need device data, the tensor tools tensor events
    assert f"Nothing found: {', '.join(host_tools)}" in out.replace("\n", " ")
    rc, out, _ = run(capsys, cap, "--json")
    assert all(t["rows"] == [] for t in json.loads(out)["tools"].values())
    rc, _, _ = run(capsys, cap, "--html", str(tmp_path / "r.html"))
    assert rc == EXIT_OK
    assert '<p class="note">no events recorded</p>' in (tmp_path / "r.html").read_text()


def test_text_is_not_read_as_markup(tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    names = [(100, 0xF1, "void k<float[4]>(float*)"), (100, 0xF2, "[/red]"), (200, 0xA1, "hip_fill")]
    cap = write_capture(tmp_path / "cap", names=names)
    manifest = json.loads((cap / "manifest.json").read_text())
    manifest["command_line"] = ["python", "train.py", "--layers", "[bold]3[/bold]"]
    (cap / "manifest.json").write_text(json.dumps(manifest))
    rc, out, _ = run(capsys, str(cap), "--tool", "kernels")
    assert rc == EXIT_OK
    assert "command  python train.py --layers '[bold]3[/bold]'" in out
    assert "void k<float[4]>(float*)" in out and "[/red]" in out
