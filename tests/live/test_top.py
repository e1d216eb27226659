"""`pasta-trace top` in a real terminal (tmux panes of 80 and 120 columns),
watching a workload of known rates (tests/fixtures/top_workload.py): every
value on the screen is the workload's, within the screen's rounding and the
pacing of a 10 ms tick; no header or value is cut, no line is wider than the
terminal, and the columns left out at 80 are the ones the screen names."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import build
from pasta_run import pasta_command, tracer_env, wait_for_file
from pasta_trace.reporters import top_screen

pytestmark = [pytest.mark.live, pytest.mark.machine_wide, pytest.mark.usefixtures("require_bpf"),
              pytest.mark.skipif(shutil.which("tmux") is None,
                                 reason="tmux is not installed (scripts/setup.sh installs it)")]

WORKLOAD = Path(__file__).resolve().parents[1] / "fixtures" / "top_workload.py"
MIB = 1 << 20
SECONDS = 4  # of paced calls: 8,000 launches, every total below 10,000 shown exactly
#: the workload's rates, by header (top_workload.PER_TICK at 100 ticks a second)
RATES = {"launch/s": 2000, "alloc/s": 100, "copy/s": 200, "copy B/s": 200 * (64 << 10), "sync/s": 100,
         "tensor/s": 500, "NCCL/s": 100, "fail/s": 20}
HELD = {"device": 12 * MIB, "pinned": 2 * MIB, "tensors": 7 * MIB}
TOLERANCE = 0.1  # a late tick catches up on the next one; the refresh interval is measured, not exact


@pytest.fixture(scope="module")
def nccl_stub(build_dir: Path) -> Path:
    try:
        return build.nccl_stub(build_dir)
    except build.Unavailable as e:
        pytest.skip(f"no stand-in libnccl.so.2: {e}")


def _number(cell: str) -> float:
    """A screen value back as a number: 2.00k, 45, 12.5 MiB, 0 B."""
    m = re.fullmatch(r"([0-9.]+)\s?(k|M|G|B|KiB|MiB|GiB|TiB)?", cell)
    assert m, cell
    scale = {None: 1, "k": 1e3, "M": 1e6, "G": 1e9, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30,
             "TiB": 1 << 40}[m.group(2)]
    return float(m.group(1)) * scale


class Pane:
    def __init__(self, name: str, width: int, cmd: list[str]):
        self.name, self.width = name, width
        script = " ".join(shlex.quote(a) for a in cmd) + "; sleep 600"
        subprocess.run(["tmux", "new-session", "-d", "-s", name, "-x", str(width), "-y", "30", "bash", "-c",
                        script], check=True, env=tracer_env())

    def text(self) -> str:
        # -J joins wrapped lines: a line wider than the pane shows as one longer line
        return subprocess.run(["tmux", "capture-pane", "-p", "-J", "-t", self.name], capture_output=True,
                              text=True).stdout

    def wait_for(self, what: str, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while what not in (text := self.text()):
            assert time.monotonic() < deadline and "error:" not in text, text
            time.sleep(0.1)
        return text

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


def _table(text: str, width: int, pid: int) -> tuple[dict[str, str], list[str]]:
    """The row of ``pid`` by header, and the screen's lines (checked to fit)."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    # the screen, below what was said before it was drawn (compiling, attaching, the banner)
    lines = lines[max(i for i, line in enumerate(lines) if line.startswith("pasta-trace top  ")):]
    for line in lines:
        assert len(line) <= width, (width, line)
        assert "…" not in line, line
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("PID  "))
    headers = re.split(r"\s{2,}", lines[at].strip())
    assert set(headers) <= {c.header for c in top_screen.COLUMNS}, headers
    row = next(line for line in lines[at + 1:] if line.split()[0] == str(pid))
    cells = re.split(r"\s{2,}", row.strip())
    assert len(cells) == len(headers), (headers, cells)
    return dict(zip(headers, cells)), lines


def _left_out(lines: list[str], width: int) -> list[str]:
    text = " ".join(lines)
    m = re.search(rf"not shown at {width} columns: (.*?) \(a wider terminal", text)
    return m.group(1).split(", ") if m else []


def _watch(workload: list[str], tmp_path: Path, rates: dict[str, float], held: dict[str, int],
           libraries: list[str]) -> None:
    """Run the workload under two tops (80 and 120 columns) and check both
    screens, while it runs (rates) and after (rates 0, totals exact), against it."""
    proc = subprocess.Popen([*workload, "--dir", str(tmp_path), "--seconds", str(SECONDS)])
    panes = []
    try:
        pid = int(wait_for_file(tmp_path / "ready", timeout=120, proc=proc))
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
        panes = [Pane(f"pasta-top-{os.getpid()}-{w}", w, [*pasta_command(), "top", "-p", str(pid)])
                 for w in (80, 120)]
        for p in panes:
            p.wait_for("no traced call in the last refresh")  # attached, and drawn once
        (tmp_path / "go").touch()
        time.sleep(SECONDS / 2 + 0.6)  # the last refresh counted a whole second of the paced calls
        running = [p.text() for p in panes]
        done = json.loads(wait_for_file(tmp_path / "done", timeout=60, proc=proc))
        time.sleep(2.3)  # two refreshes after the last call: the rates are 0
        after = [p.text() for p in panes]
        proc.kill()
        proc.wait()
        time.sleep(1.3)  # a refresh after its exit: it holds nothing any more
        gone = [p.text() for p in panes]
    finally:
        proc.kill()
        for p in panes:
            p.close()
    for p, text, end, empty in zip(panes, running, after, gone):
        row, lines = _table(text, p.width, pid)
        shown = [h for h in row if h not in ("PID", "COMMAND")]
        left_out = _left_out(lines, p.width)
        # every column is on the screen or named as left out
        assert sorted(shown + left_out + ["PID", "COMMAND"]) == sorted(c.header for c in top_screen.COLUMNS)
        assert (left_out == []) == (p.width == 120), lines
        assert row["PID"] == str(pid) and row["COMMAND"] == comm, row
        for header in row.keys() - {"PID", "COMMAND"}:
            if header in held:
                assert row[header] == top_screen.size(held[header]), (p.width, header, row)
            else:
                want = rates[header]
                got = _number(row[header])
                assert abs(got - want) <= TOLERANCE * want, (p.width, header, row[header], want)
        row, lines = _table(end, p.width, pid)
        for header in row.keys() - {"PID", "COMMAND"}:
            want = top_screen.size(held[header]) if header in held else ("0 B" if "B/s" in header else "0")
            assert row[header] == want, (p.width, header, row)
        totals = " ".join(lines)
        want = (f"{done['launches']:,} launches, {done['allocs']:,} allocs, {done['frees']:,} frees, "
                f"{done['copies']:,} copies ({top_screen.size(done['copy_bytes'])}), {done['syncs']:,} syncs, "
                f"{done['tensor_allocs']:,} tensor allocs, {done['tensor_frees']:,} tensor frees, "
                f"{done['nccl_calls']:,} NCCL calls ({top_screen.size(done['nccl_bytes'])}), "
                f"{done['failed']:,} failed")
        assert want in totals, (p.width, totals)
        title = " ".join(lines[:2])
        assert f"PID {pid} ({comm}): " in title, title
        assert all(lib in title for lib in libraries), title
        screen = empty[empty.rindex("pasta-trace top  "):]
        assert "(no traced call in the last refresh)" in screen and f"\n{pid}  " not in screen, screen


def test_top_shows_the_workloads_rates_and_held_memory_at_80_and_120_columns(cuda_stub, c10_stub, nccl_stub,
                                                                             tmp_path):
    _watch([sys.executable, str(WORKLOAD), "--cuda", str(cuda_stub), "--c10", str(c10_stub), "--nccl",
            str(nccl_stub)], tmp_path, RATES, HELD, ["libcuda.so.1", "libc10.so", "libnccl.so.2"])


def test_top_shows_a_torch_programs_tensors(torch_cpu, tmp_path):
    """The real PyTorch CPU build: its tensors, and nothing else."""
    rates = dict.fromkeys(RATES, 0) | {"tensor/s": 500}  # top_workload.TORCH_PER_TICK
    held = dict.fromkeys(HELD, 0) | {"tensors": 6 * MIB}  # top_workload.TORCH_HELD
    _watch([torch_cpu.python, str(WORKLOAD), "--torch", str(torch_cpu.site)], tmp_path, rates, held, ["libc10.so"])
