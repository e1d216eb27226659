"""The whole terminal report of a seeded synthetic capture (device data, syncs,
failed calls, Python stacks), at 80 and 120 columns, against golden files.

Regenerate after an intended change, then read the diff:
    PASTA_REGEN_GOLDEN=1 .venv/bin/python -m pytest tests/unit/test_report_golden.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pasta_trace import cli
from pasta_trace.testing import synthetic

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures/golden"
SPEC = synthetic.Spec(pids=2, launches=60, allocations=12, accesses=600, syncs=10, failed_allocs=3, stacks=True,
                      span_ns=3_000_000_000, tensors=40)


def report(tmp_path: Path, capsys, monkeypatch, width: int, *argv: str) -> str:
    monkeypatch.chdir(tmp_path)  # the capture's path is in the report: keep it the same
    synthetic.write_capture("cap", SPEC)
    monkeypatch.setenv("COLUMNS", str(width))
    assert cli.main(["report", "cap", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out


@pytest.mark.parametrize("width", [80, 120])
def test_terminal_report_is_the_golden_text(tmp_path: Path, capsys, monkeypatch, width: int) -> None:
    out = report(tmp_path, capsys, monkeypatch, width)
    golden = GOLDEN / f"report-{width}.txt"
    if os.environ.get("PASTA_REGEN_GOLDEN") == "1":
        golden.write_text(out)
    assert out == golden.read_text()
    # no line is wider than the terminal, and none ends in blanks
    assert [line for line in out.splitlines() if len(line) > width or line != line.rstrip()] == []


def test_names_are_cut_numbers_and_hex_never(capsys) -> None:
    """At 60 columns: the all-empty column is gone, the least telling ones give
    way, the kernel name keeps its start and the call site its end, and the
    header wraps between words only."""
    import polars as pl
    from rich.console import Console

    from pasta_trace.reporters.terminal_table import table

    name = "void at::native::vectorized_elementwise_kernel<4, at::native::AddFunctor<float>>(int, float*)"
    df = pl.DataFrame({"pid": [4242], "name": [name], "launches": [123456], "launches_per_s": [1.5],
                       "stream": [0x7F0000001000], "gpu_ns": [1_234_567_890], "api_mean_ns": [None],
                       "call_site": ["/home/someone/project/src/model/train.py:120 Trainer.step"]},
                      schema_overrides={"api_mean_ns": pl.Float64})
    Console(width=60).print(table(df, "Kernels", None, 20, 60))
    assert [line.rstrip() for line in capsys.readouterr().out.splitlines()] == [
        "Kernels",
        "                                     GPU",
        "                                    time",
        " pid  kernel              launches   (s)  call site",
        "────────────────────────────────────────────────────────────",
        "4242  void at::native::…    123456  1.23  …:120 Trainer.step",
        "not shown at 60 columns: launches/s, stream (--json has",
        "every column)",
    ]
