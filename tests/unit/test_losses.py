"""Loss accounting: every loss counter comes from one table (schema.LOSSES),
the BPF programs use its generated slots, the manifest stores each by name,
the live status line and the summary show each (the summary with its own
remedy), and every report's INCOMPLETE banner adds them all up."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from pasta_trace import cli, schema
from pasta_trace.capture.output import manifest as mf
from pasta_trace.capture.session import summary
from pasta_trace.capture.output.drain import status_text
from pasta_trace.capture.session.options import Options, names_pages
from pasta_trace.capture.bpf.probe_set import program_spec
from pasta_trace.commands.top import loss_line
from pasta_trace.probes import program
from pasta_trace.read import open_capture
from test_tools_capture import write_capture

SETTINGS = {"--buffer-pages": 4096, "--stack-buffer-pages": 256, "--aggregate-max": 4,
            "--native-stack-buffer-pages": 2048}
BPF_SOURCES = sorted(program.BPF_DIR.glob("*.[ch]"))


def test_loss_slots_are_dense_and_the_stack_ones_are_py_stats_and_native_stats() -> None:
    for counter in ("lost", "discover_lost"):
        rows = schema.loss_counters(counter)
        assert [loss.index for loss in rows] == list(range(len(rows)))
    assert {loss.name: loss.index for loss in schema.loss_counters("py_stats")} == {
        "lost_stacks": schema.PY_STATS["lost_stacks"], "unreadable_stacks": schema.PY_STATS["unreadable_stacks"]}
    assert {loss.name: loss.index for loss in schema.loss_counters("native_stats")} == {
        "lost_native_stacks": schema.NATIVE_STATS["lost_native_stacks"],
        "unreadable_native_stacks": schema.NATIVE_STATS["unreadable_native_stacks"]}
    assert len(schema.LOSS_BY_NAME) == len(schema.LOSSES)


def program_text(**kw) -> str:
    return program.build(program_spec(**kw))


def test_no_loss_slot_is_written_by_hand_in_the_bpf_sources() -> None:
    """Fails before: bpf/pasta.h defined PT_LOST_EVENTS..PT_LOST_AGG itself."""
    for src in BPF_SOURCES:
        assert not re.findall(r"#define PT_(LOST|DLOST|UNPAUSED)\w*", src.read_text()), src.name


def test_every_bpf_loss_slot_is_generated_and_each_is_counted() -> None:
    text = program_text(buffer_pages=4096, aggregate=True, filter_pids=True)
    defined = dict(re.findall(r"#define (PT_(?:LOST|UNPAUSED)\w*) (\d+)", text))
    assert defined == {
        "PT_LOST_EVENTS": "0", "PT_LOST_NAMES": "1", "PT_LOST_INFLIGHT": "2", "PT_LOST_AGG": "3", "PT_LOST_CAPTURES": "4",
        "PT_LOST_COMM_IDS": "5", "PT_LOST_N": "6",
        "PT_UNPAUSED_OPENS": "0", "PT_LOST_NOTIFICATIONS": "1",
    }
    assert "#define PT_UNTRACED_CHILDREN 2" in text
    assert "#define PT_DISCOVER_LOST_N 3" in text  # PT_UNTRACED_CHILDREN: 2
    assert f"#define PT_DEPTH {schema.INFLIGHT_DEPTH}" in text
    sources = "".join(src.read_text() for src in BPF_SOURCES)
    used = set(re.findall(r"pt_d?lost\((PT_\w+)\)", sources))
    assert used == {loss.c_define for loss in schema.LOSSES if loss.counter in ("lost", "discover_lost")}


def test_aggregate_map_size_and_names_ring_are_load_time_settings() -> None:
    assert "#define PT_AGG_MAX 4\n" in program_text(buffer_pages=4096, aggregate=True, filter_pids=False,
                                                      aggregate_max=4)
    assert f"#define PT_AGG_MAX {schema.DEFAULT_AGGREGATE_MAX}\n" in program_text(
        buffer_pages=4096, aggregate=True, filter_pids=False)
    # the names ring grows with --buffer-pages, so that raising it cures lost names too
    assert [names_pages(n) for n in (1, 4096, 8192, 65536)] == [64, 64, 128, 1024]
    assert "#define PT_NAMES_PAGES 1024\n" in program_text(buffer_pages=65536, aggregate=False, filter_pids=False)


@pytest.mark.parametrize("value, error", [
    ("0", "0 rows: give at least 1: try 65536"),
    ("lots", "not a number of rows: 'lots': try 65536"),
    ("4194305", "4194305 rows is more than the map may take (about 512 MiB of kernel memory): try 4194304"),
])
def test_aggregate_max_is_a_usage_error_out_of_range(value: str, error: str) -> None:
    # top counts the events themselves: it has no --aggregate map
    r = subprocess.run([sys.executable, "-m", "pasta_trace.cli", "--aggregate-max", value, "-p", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr == f"pasta-trace: error: argument --aggregate-max: {error}\n"


def test_manifest_stores_every_loss_by_name_and_the_reader_adds_them_up(tmp_path: Path) -> None:
    lost = {loss.name: 10 * (i + 1) for i, loss in enumerate(schema.LOSSES)}
    stacks = {"lost_stacks": 0, "unreadable_stacks": 0, "no_python_thread": 3, "truncated_stacks": 1, "stacks": 9}
    counts = mf.counts(events=5, names=2, lost=lost, by_kind={"launch": 5}, known_full=2, stacks=stacks,
                       tallies={"folded_launches": 7})
    assert counts == {
        "events": 5, "names": 2,
        "stacks": {"lost_stacks": 50, "unreadable_stacks": 60, "no_python_thread": 3, "truncated_stacks": 1,
                   "stacks": 9, "lost_native_stacks": 70, "unreadable_native_stacks": 80,
                   "unresolved_native_stacks": 90, "unregistered_python_processes": 150},
        "lost_events": 10, "lost_names": 20, "lost_inflight": 30, "lost_agg": 40,
        "unpaused_opens": 100, "lost_notifications": 110, "lost_writer_behind": 120, "lost_unwritten": 130,
        "untraced_children": 140, "lost_writer_died": 160, "lost_tracer_died": 170, "lost_captures": 180,
        "lost_comm_ids": 190,
        "known_full": 2, "folded_launches": 7, "by_kind": {"launch": 5},
    }
    cap = write_capture(tmp_path / "cap")
    manifest = json.loads((cap / "manifest.json").read_text())
    manifest["counts"] = counts
    (cap / "manifest.json").write_text(json.dumps(manifest))
    c = open_capture(cap)
    assert c.losses == lost  # a tally (launches folded on purpose) is not a loss
    assert c.lost_events == sum(lost.values()) == 1900


def test_without_stacks_the_manifest_has_no_stack_losses() -> None:
    counts = mf.counts(events=0, names=0, lost={"lost_events": 0, "lost_agg": 3}, by_kind={})
    assert counts == {"events": 0, "names": 0, "lost_events": 0, "lost_agg": 3, "known_full": 0, "by_kind": {}}


def test_summary_prints_each_loss_with_its_own_remedy() -> None:
    lost = {loss.name: 1000 + i for i, loss in enumerate(schema.LOSSES)}
    assert summary.loss_lines(lost, SETTINGS) == [
        "LOST: 1,000 events: the events ring buffer was full",
        "  raise --buffer-pages (now 4096)",
        "LOST: 1,001 kernel names: the names ring buffer was full",
        "  raise --buffer-pages: the names ring grows with it (now 4096)",
        "LOST: 1,002 nested calls: more than 4 probed calls in flight on one thread",
        "  a fixed limit of the probes: --buffer-pages does not change it",
        "LOST: 1,003 aggregated calls: the --aggregate map was full",
        "  raise --aggregate-max (now 4)",
        "LOST: 1,004 Python stacks: the stacks ring buffer was full",
        "  raise --stack-buffer-pages (now 256)",
        "LOST: 1,005 unreadable Python stacks: frames changed or were freed while read",
        "  no option changes it; their events are kept, without a stack",
        "LOST: 1,006 native stacks: the native stacks ring buffer was full",
        "  raise --native-stack-buffer-pages (now 2048)",
        "LOST: 1,007 unreadable native stacks: not one byte of the user stack could be read",
        "  no option changes it; their events keep their Python stack only",
        "LOST: 1,008 unresolved native stacks: a library's unwind tables were not ready when the capture ended",
        "  no option changes it; their events keep their Python stack only",
        "LOST: 1,009 unpaused library opens: too many processes waited for probes at once",
        "  no option changes it; the first calls after those opens may be missing",
        "LOST: 1,010 process notifications: the fork/exec/exit ring buffer was full",
        "  no option changes it; processes.parquet may miss those processes",
        "LOST: 1,011 events: the events writer fell behind",
        "  use --aggregate or trace fewer processes",
        "LOST: 1,012 events: they could not be written: the disk was full",
        "  free space or choose another -o",
        "LOST: 1,013 untraced child processes: the table of traced processes was full when they started",
        "  no option changes it; trace fewer processes at once",
        "LOST: 1,014 Python processes without stacks: more Python processes ran at once than the table of "
        "interpreters holds",
        "  no option changes it; their events are kept, without a stack",
        "LOST: 1,015 events: the events writer process died before it wrote them",
        "  no option changes it; the manifest's notes say how it died",
        "LOST: 1,016 events: the tracer died while it held them",
        "  no option changes it; the manifest's notes say so",
        "LOST: 1,017 stream captures: more streams or events were under capture at once than the probes' "
        "tables hold",
        "  no option changes it; the launches, copies and memsets captured on those streams count as run",
        "LOST: 1,018 communicator ids: more communicators were alive at once than the probes' table holds",
        "  no option changes it; the communicators split from those have no comm_id",
    ]
    assert summary.loss_lines({"lost_events": 0}, SETTINGS) == ["lost: 0"]
    assert Options(mode="pid", out_dir=Path("x"), command_line=[], buffer_pages=8, stack_pages=16,
                   aggregate_max=32, native_pages=64).settings == {
        "--buffer-pages": 8, "--stack-buffer-pages": 16, "--aggregate-max": 32, "--native-stack-buffer-pages": 64}


def test_summary_reads_every_loss_the_known_files_overflow_and_the_folded_launches_from_the_counts(tmp_path: Path) -> None:
    counts = {"events": 0, "lost_agg": 18, "stacks": {"lost_stacks": 2}, "known_full": 3, "folded_launches": 12,
              "by_kind": {}}
    text = summary.render(tmp_path, {}, pl.DataFrame(schema={"pid": pl.UInt32, "handle": pl.UInt64,
                                                             "name": pl.String}), counts, SETTINGS)
    assert text.splitlines()[-6:] == [
        "3 library files with probes did not fit the kernel's known-files table: each later open of one "
        "paused its process for a moment",
        "12 driver launches folded into their runtime launch (kernel seen before)",
        "LOST: 18 aggregated calls: the --aggregate map was full",
        "  raise --aggregate-max (now 4)",
        "LOST: 2 Python stacks: the stacks ring buffer was full",
        "  raise --stack-buffer-pages (now 256)",
    ]


def test_live_status_line_shows_every_kind_of_loss() -> None:
    """Fails before: the status line added up events and names only."""
    assert status_text(12345, {"lost_events": 0, "lost_agg": 0}) == "12,345 events, lost: 0"
    assert status_text(7, {"lost_events": 2, "lost_inflight": 1, "lost_stacks": 3}) == (
        "7 events, lost: 2 events, 1 nested calls, 3 Python stacks")


def test_top_shows_the_aggregate_overflow_with_its_remedy() -> None:
    assert loss_line({"lost_agg": 0, "lost_events": 0}, SETTINGS) is None
    assert loss_line({"lost_agg": 18}, SETTINGS) == (
        "LOST: 18 aggregated calls: the --aggregate map was full; raise --aggregate-max (now 4)")


@pytest.mark.parametrize("counts, banner", [
    ({"lost_events": 7}, "INCOMPLETE: 7 events lost"),
    ({"lost_events": 0, "lost_inflight": 2, "stacks": {"lost_stacks": 3, "unreadable_stacks": 1}},
     "INCOMPLETE: 2 nested calls, 3 Python stacks, 1 unreadable Python stacks lost"),
    ({"lost_agg": 18, "unpaused_opens": 1}, "INCOMPLETE: 18 aggregated calls, 1 unpaused library opens lost"),
])
def test_banner_counts_every_kind_of_loss(tmp_path: Path, capsys, counts: dict, banner: str) -> None:
    """Fails before: the banner counted lost events and names only."""
    cap = write_capture(tmp_path / "cap")
    manifest = json.loads((cap / "manifest.json").read_text())
    manifest["counts"] = {"events": 18, **counts}
    (cap / "manifest.json").write_text(json.dumps(manifest))
    assert cli.main(["report", str(cap), "--json"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["incomplete"] == banner
    assert err == f"pasta-trace: warning: {banner}\n"
    # the terminal report heads with the banner, and its facts name each kind
    assert cli.main(["report", str(cap), "--tool", "processes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == banner
    assert [line.strip() for line in lines if line.strip().startswith("lost  ")] == [
        "lost  " + banner.removeprefix("INCOMPLETE: ").removesuffix(" lost")]
