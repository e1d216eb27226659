"""scripts/gpu_check's mid-run attach rows (`record -p PID --device cupti` on a
running vecadd loop and a PyTorch loop), checked here without a GPU: the
comparison passes exact counts and fails each way an attach can go wrong
(a kernel record more or fewer than the launches after the attach, a record
off the host clock's span, no device file, a thread left stopped or traced,
the collector's file still open after the stop, the target dead or wrong);
the command lines --dry writes are the ones the GPU run makes."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from test_gpu_check import gpu_check_module

ATTACH = 5_000_000_000  # the collector's mono_open
END = 9_000_000_000  # the capture's end, CLOCK_MONOTONIC


@pytest.fixture(scope="module")
def g():
    return gpu_check_module()


def _capture(before: int = 3, after: int = 40) -> dict:
    """A capture of the vecadd loop: `before` launches ahead of the attach, `after` from it on (one every
    20 ms), a kernel and a copy record for each of those."""
    launches = [ATTACH - 1_000_000 * (i + 1) for i in range(before)] + [ATTACH + 20_000_000 * (i + 1)
                                                                        for i in range(after)]
    kernels = [{"start": t + 30_000, "end": t + 40_000} for t in launches if t > ATTACH]
    copies = [{"start": k["end"] + 5_000, "end": k["end"] + 15_000} for k in kernels]
    return {"launch_ts": launches, "kernels": kernels, "copies": copies, "mono_open": [ATTACH],
            "start_ns": ATTACH + 1_000_000, "end_ns": END, "notes": [], "problems": []}


GOOD_AFTER = {"stopped": 0, "traced": 0, "open_during": 1, "open_after": 0, "more": 24, "rc": 0, "done": True}


def _failed(rows) -> list[str]:
    return [what for what, _, _, ok in rows if ok is False]


def test_attach_rows_pass_exact_counts(g) -> None:
    rows = g.attach_rows("vecadd", _capture(), GOOD_AFTER)
    assert [(what, str(e), str(m), ok) for what, e, m, ok in rows] == [
        ("[attach vecadd] device files in the capture", "1", "1", True),
        ("[attach vecadd] host launches before the attach (no record expected)", "-", "3", None),
        ("[attach vecadd] host launches after the attach", "> 0", "40", True),
        ("[attach vecadd] CUPTI kernel records = host launches after the attach", "40", "40", True),
        ("[attach vecadd] device records on the host clock, attach <= start <= end <= capture end", "all 80",
         "all 80", True),
        ("[attach vecadd] reader problems", "none", "none", True),
        ("[attach vecadd] threads stopped / traced after the capture", "0 / 0", "0 / 0", True),
        ("[attach vecadd] collector's file open in the target: recording / after the stop", "1 / 0", "1 / 0", True),
        ("[attach vecadd] the target after the capture", "more launches, results right, exit 0",
         "24 more, results right, exit 0", True),
    ]


def test_attach_rows_fail_a_kernel_record_more_or_fewer(g) -> None:
    cap = _capture()
    lost = {**cap, "kernels": cap["kernels"][1:]}
    # a launch made between the collector's file opening and its enabling: host-probed, never recorded
    extra = {**cap, "launch_ts": [*cap["launch_ts"], ATTACH + 500]}
    for c in (lost, extra):
        assert _failed(g.attach_rows("vecadd", c, GOOD_AFTER)) == [
            "[attach vecadd] CUPTI kernel records = host launches after the attach"]
    # a record from before the attach (a launch the collector cannot have seen) is off the clock span too
    early = {**cap, "kernels": [{"start": ATTACH - 10, "end": ATTACH + 10}, *cap["kernels"]]}
    assert _failed(g.attach_rows("vecadd", early, GOOD_AFTER)) == [
        "[attach vecadd] CUPTI kernel records = host launches after the attach",
        "[attach vecadd] device records on the host clock, attach <= start <= end <= capture end"]


def test_attach_rows_fail_records_off_the_host_clock(g) -> None:
    cap = _capture()
    late = {**cap, "copies": [*cap["copies"][:-1], {"start": END - 5, "end": END + 5}]}
    backwards = {**cap, "kernels": [{"start": 7_000_000_000, "end": 6_000_000_000}, *cap["kernels"][1:]]}
    for c in (late, backwards):
        rows = g.attach_rows("vecadd", c, GOOD_AFTER)
        assert _failed(rows) == [
            "[attach vecadd] device records on the host clock, attach <= start <= end <= capture end"]
        assert [m for what, _, m, _ in rows if "host clock" in what] == ["1 outside"]
    # no record at all proves nothing: the count row and the clock row both fail
    none = {**cap, "kernels": [], "copies": []}
    assert _failed(g.attach_rows("vecadd", none, GOOD_AFTER)) == [
        "[attach vecadd] CUPTI kernel records = host launches after the attach",
        "[attach vecadd] device records on the host clock, attach <= start <= end <= capture end"]


def test_attach_rows_fail_without_a_device_file_or_launches_after_the_attach(g) -> None:
    cap = _capture()
    note = "no device timeline for PID 7: CUPTI unavailable: x (no GPU, or a driver CUPTI cannot use)"
    rows = g.attach_rows("torch", {**cap, "mono_open": [], "notes": [note]}, GOOD_AFTER)
    assert _failed(rows) == ["[attach torch] device files in the capture"]
    assert ("[attach torch] capture note", "-", note, None) in rows
    assert not any("CUPTI kernel records" in what for what, *_ in rows)  # nothing to count against
    idle = _capture(after=0)
    assert _failed(g.attach_rows("torch", idle, GOOD_AFTER)) == [
        "[attach torch] host launches after the attach",
        "[attach torch] device records on the host clock, attach <= start <= end <= capture end"]
    damaged = {**cap, "problems": ["x.bin: stopped at byte 80: truncated record header (8 bytes left)"]}
    assert _failed(g.attach_rows("torch", damaged, GOOD_AFTER)) == ["[attach torch] reader problems"]


@pytest.mark.parametrize("change, failed", [
    ({"stopped": 1}, "threads stopped / traced after the capture"),
    ({"traced": 1}, "threads stopped / traced after the capture"),
    ({"stopped": None, "traced": None}, "threads stopped / traced after the capture"),  # the target is gone
    ({"open_after": 1}, "collector's file open in the target: recording / after the stop"),
    ({"open_during": 0}, "collector's file open in the target: recording / after the stop"),  # check blind
    ({"more": 0}, "the target after the capture"),
    ({"done": False, "rc": 1}, "the target after the capture"),  # a wrong result
    ({"rc": -9}, "the target after the capture"),
])
def test_attach_rows_fail_each_way_the_target_can_be_left(g, change, failed) -> None:
    rows = g.attach_rows("vecadd", _capture(), {**GOOD_AFTER, **change})
    assert _failed(rows) == [f"[attach vecadd] {failed}"]
    assert _failed(g.attach_rows("vecadd", _capture(), {})) == [  # nothing measured: nothing passes
        "[attach vecadd] threads stopped / traced after the capture",
        "[attach vecadd] collector's file open in the target: recording / after the stop",
        "[attach vecadd] the target after the capture"]


def test_attach_commands_as_dry_writes_them(g, tmp_path: Path) -> None:
    m = {"artifacts": {"vecadd": "/b/vecadd"}}
    target, tracer, ctl = g.attach_cmds(m, "vecadd", "/venv/python", tmp_path, 4242)
    assert ctl == tmp_path / "attach-vecadd" / "ctl"
    assert target == ["/b/vecadd_loop", str(g.ATTACH_N), str(g.ATTACH_RATE), str(ctl)]
    assert tracer == ["/venv/python", "-m", "pasta_trace.cli", "record", "-p", "4242", "--device", "cupti", "-o",
                      str(tmp_path / "attach-vecadd" / "capture")]
    target, tracer, ctl = g.attach_cmds(m, "torch", None, tmp_path, "PID")
    assert target[1:] == [str(g.PROGRAMS / "torch_loop.py"), str(tmp_path / "attach-torch" / "ctl"),
                          str(g.ATTACH_TORCH_RATE)]
    assert tracer[4:6] == ["-p", "PID"]
    # every attach row is a GPU step: --dry ends it SKIP "no GPU" (test_gpu_check_dry checks every GPU_STEPS row)
    assert [s for s in g.GPU_STEPS if s.startswith("[attach ")] == [
        "[attach vecadd] record -p PID --device cupti, mid-run", "[attach torch] record -p PID --device cupti, mid-run"]
    # dry(): the lines it logs for these rows
    for label in g.ATTACH_LABELS:
        t, r, _ = g.attach_cmds(m, label, "/venv/python", tmp_path, "PID")
        g.log_command(tmp_path, f"[attach {label}] the running workload", t)
        g.log_command(tmp_path, f"[attach {label}] record -p PID --device cupti", r)
    text = (tmp_path / "commands.txt").read_text()
    assert (f"# [attach vecadd] record -p PID --device cupti\n/venv/python -m pasta_trace.cli record -p PID "
            f"--device cupti -o {tmp_path}/attach-vecadd/capture\n") in text
    assert f"# [attach vecadd] the running workload\n/b/vecadd_loop 65536 50 {tmp_path}/attach-vecadd/ctl\n" in text


def test_the_torch_loop_follows_the_control_files(g, tmp_path: Path) -> None:
    """The PyTorch workload's protocol, with a stand-in for torch: ready, paused with its count, resumed,
    done with its count and ok; the check reads exactly these lines."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "class _M:\n"
        "    def __call__(self, x): return self\n"
        "    def cuda(self): return self\n"
        "    def cpu(self): return self\n"
        "class nn:\n"
        "    Sequential = staticmethod(lambda *a: _M())\n"
        "    Linear = staticmethod(lambda *a: None)\n"
        "    ReLU = staticmethod(lambda: None)\n"
        "import contextlib\n"
        "no_grad = contextlib.nullcontext\n"
        "manual_seed = lambda s: None\n"
        "randn = lambda *a, **k: _M()\n"
        "allclose = lambda a, b, **k: True\n")
    ctl = tmp_path / "ctl"
    target, _, _ = g.attach_cmds({"artifacts": {"vecadd": "/b/vecadd"}}, "torch", None, tmp_path, "PID")
    target = [target[0], target[1], str(ctl), "200"]
    log = tmp_path / "out.txt"
    with open(log, "w") as f:
        p = subprocess.Popen(target, stdout=f, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(tmp_path)})
    try:
        assert g._wait_for(lambda: "ready pid=" in g._text(log), p, 30)
        Path(f"{ctl}.pause").touch()
        assert g._wait_for(lambda: "paused launches=" in g._text(log), p, 30)
        Path(f"{ctl}.resume").touch()
        assert g._wait_for(lambda: "resumed" in g._text(log), p, 30)
        Path(f"{ctl}.quit").touch()
        assert p.wait(timeout=30) == 0
    finally:
        if p.poll() is None:
            p.kill()
    lines = g._text(log).splitlines()
    assert lines[0] == f"torch_loop ready pid={p.pid}"
    assert lines[1].startswith("paused launches=") and lines[2] == "resumed" and len(lines) == 4
    paused, done = int(lines[1].split("=")[1]), lines[3]
    assert done.startswith("done launches=") and done.endswith(" ok") and int(done.split("=")[1][:-3]) >= paused
