"""Leaks that survive interpreter exit: CPython frees every object a program
leaves when it finalizes, so the tensors a launched program leaked are freed
as it exits.  The probe on Py_FinalizeEx/Py_Finalize marks those frees
at_exit, and the leak tools and the record summary count them as left.

Through a stand-in libc10.so under every interpreter (Debian's static
python3 and pyenv's shared 3.10-3.13 builds), and with the real torch CPU
wheel: a program that leaks N tensors of known sizes, named exactly, with
their user line; and the user-line attribution of its optimizer step."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from pasta_run import read_report, run_pasta
from pasta_trace.read import open_capture
from pasta_trace.tools import tensors
from pasta_trace.tools.call_sites import by_call_site
from pasta_trace.tools.findings import key_findings
from pasta_trace.tools.run import run_tools
from pasta_trace.tools.sites import set_policy, with_site

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PYENV = Path.home() / ".pyenv" / "versions"


def interpreters() -> list:
    """Debian's static python3 and the newest pyenv (shared libpython) build of each minor 3.11-3.13: the
    probe is attached as the stack walker registers a process, and it walks 3.11 and later."""
    found = [pytest.param("/usr/bin/python3", id="debian-python3")] if Path("/usr/bin/python3").exists() else []
    for minor in (11, 12, 13):
        builds = sorted(PYENV.glob(f"3.{minor}.*/bin/python3"), key=lambda p: p.parts[-3])
        if builds:
            found.append(pytest.param(str(builds[-1]), id=f"pyenv-{builds[-1].parts[-3]}"))
        else:
            found.append(pytest.param(None, id=f"pyenv-3.{minor}", marks=pytest.mark.skip(
                reason=f"no CPython 3.{minor} under {PYENV}")))
    return found


@pytest.mark.parametrize("python", interpreters())
def test_frees_in_finalization_are_marked(tmp_path: Path, python: str, c10_stub: Path) -> None:
    report = tmp_path / "w.json"
    r = run_pasta(["-o", str(tmp_path / "cap"), "--", python, str(FIXTURES / "at_exit_workload.py"), str(c10_stub),
                   str(report)], timeout=120)
    assert r.returncode == 0, r.stderr
    rep = read_report(report)
    cap = open_capture(tmp_path / "cap")
    assert cap.complete and cap.lost_events == 0, cap.problems
    ev = cap.events.filter(pl.col("pid") == rep["pid"]).filter(
        pl.col("kind").cast(pl.String).str.starts_with("tensor")).sort("ts_ns").collect()
    assert ev.select(pl.col("kind").cast(pl.String), "ptr", "at_exit").rows() == [
        ("tensor_alloc", rep["freed"], False), ("tensor_free", rep["freed"], False),
        ("tensor_alloc", rep["left"], False), ("tensor_free", rep["left"], True)]
    left = tensors.tensors_never_freed(cap)
    assert left.select("ptr", "size", "freed_at_exit").rows() == [(rep["left"], 128, True)]
    assert "freed only at exit: 128 B in 1 tensor" in r.stderr


@pytest.fixture(scope="module")
def leaked(tmp_path_factory, torch_cpu, _bpf_status):
    """-- CMD: a training step, then 3 tensors of known sizes leaked until exit."""
    if _bpf_status:
        pytest.skip(_bpf_status)
    d = tmp_path_factory.mktemp("leak")
    # torch where a real install puts it: under a site-packages directory, so its frames are a library's
    site = d / "venv" / "lib" / "python3.11" / "site-packages"
    site.parent.mkdir(parents=True)
    site.symlink_to(torch_cpu.site)
    report = d / "w.json"
    r = run_pasta(["-o", str(d / "cap"), "--", torch_cpu.python, str(FIXTURES / "torch_leak_workload.py"),
                   "--site", str(site), "--report", str(report)], timeout=300)
    assert r.returncode == 0, r.stderr
    return open_capture(d / "cap"), read_report(report), r.stderr


def test_the_leaked_tensors_are_named_with_their_line(leaked) -> None:
    cap, rep, stderr = leaked
    site = f"{rep['file']}:{rep['leak_line']} leak"
    want = sorted((t["ptr"], t["size"], site, True) for t in rep["leaked"])
    got = tensors.tensors_never_freed(cap).filter(pl.col("pid") == rep["pid"])
    assert sorted(got.select("ptr", "size", "call_site", "freed_at_exit").rows()) == want
    total = sum(t["size"] for t in rep["leaked"])
    assert f"freed only at exit: {total / 2**20:.1f} MiB in 3 tensors" in stderr
    # the key findings read the same table
    results = run_tools(cap)
    lines = [f.line() for f in key_findings(results, None) if f.topic == "tensor leaks"]
    assert lines == [f"3 tensors never freed (freed only at exit), {total / 2**20:.1f} MiB; most from {site} "
                     f"({total / 2**20:.1f} MiB)"]


def test_the_optimizer_step_is_charged_to_the_users_line(leaked) -> None:
    """Adam's state and updates are allocated inside torch/optim: by default at the user's opt.step() line."""
    cap, rep, _ = leaked
    life = tensors.tensor_lifetimes(cap).filter(pl.col("pid") == rep["pid"])
    innermost = cap.stacks.filter(pl.col("depth") == 0).select("pid", "stack_id", pl.col("file").alias("inner"))
    in_adam = life.join(innermost, on=["pid", "stack_id"]).filter(pl.col("inner").str.ends_with("torch/optim/adam.py"))
    got = with_site(in_adam, cap).collect()
    assert got.height > 0
    assert set(got["call_site"]) == {f"{rep['file']}:{rep['opt_line']} train"}
    sites = by_call_site(cap).filter(pl.col("pid") == rep["pid"])
    step = sites.filter(pl.col("call_site") == f"{rep['file']}:{rep['opt_line']} train").row(0, named=True)
    assert step["allocations"] >= got.height and step["tensor_alloc_bytes"] > 0
    assert (step["launches"], step["syncs"], step["device_alloc_bytes"]) == (0, 0, 0)
    set_policy(cap, "innermost")
    files = {s.split(":")[0] for s in with_site(in_adam, cap).collect()["call_site"]}
    assert files and all(f.endswith("/site-packages/torch/optim/adam.py") for f in files)
