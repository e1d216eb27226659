"""No code from outside the installed package runs as root (docs/security.md,
"Who pasta-trace acts as"): a user who may only run `sudo pasta-trace` runs
it from a directory of theirs holding a `pasta_trace/` package, a
`sitecustomize.py` and a `runpy.py` that would each leave a mark saying whose
code ran as whom.  sudo keeps the caller's directory, and `python -m` put it
first on sys.path of the events writer and the guardians: their code ran as
uid 0 and the capture still succeeded.  Now no mark is left, and the capture
of the user's own workload is complete, call for call."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import expect
from pasta_run import pasta_command, read_report, tracer_env
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

PLANT = """import os
with open({mark!r}, "a") as f:
    f.write(f"{{__name__}} uid={{os.getuid()}} euid={{os.geteuid()}}\\n")
"""
#: the modules a helper of pasta-trace imports first (its package, the
#: runner of -m, the interpreter's start-up hook), planted in the user's directory
PLANTED = ("pasta_trace/__init__.py", "pasta_trace/capture/__init__.py", "pasta_trace/capture/output/event_writer.py",
           "pasta_trace/capture/procs/guardian.py", "sitecustomize.py", "usercustomize.py", "runpy.py")



@pytest.fixture
def hostile_cwd(user):
    """The user's working directory, full of modules named like pasta-trace's."""
    base = Path(tempfile.mkdtemp(prefix="pasta-cwd-", dir="/tmp"))
    base.chmod(0o755)
    mark = base / "mark.txt"
    for rel in PLANTED:
        p = base / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(PLANT.format(mark=str(mark)))
    mark.touch()
    mark.chmod(0o666)  # so that a mark would be left whoever's code ran
    for p in [base, *base.rglob("*")]:
        os.chown(p, user.uid, user.gid)
    yield base, mark
    shutil.rmtree(base, ignore_errors=True)


@pytest.mark.parametrize("mode", ["launch", pytest.param("system_wide", marks=pytest.mark.machine_wide)])
def test_the_users_directory_runs_nothing_as_root(user, hostile_cwd, cuda_stub, cuda_workload, mode):
    cwd, mark = hostile_cwd
    out = cwd / "cap"
    report = cwd / "r.json"
    workload = [str(cuda_workload), "--lib", str(cuda_stub), "--report", str(report), "--threads", "2",
                "--iters", "3"]
    sudo_env = {**tracer_env(), **user.sudo_env}
    sudo_env.pop("PYTHONPATH", None)  # sudo clears it; the tracer finds its package as installed
    if mode == "launch":
        args = ["-o", str(out), "--", *workload]
        r = subprocess.run([*pasta_command(), *args], cwd=cwd, env=sudo_env, capture_output=True, text=True,
                           timeout=300)
    else:
        # -a for a fixed time, with the user's workload started once the probes are ready
        tracer = subprocess.Popen([*pasta_command(), "-a", "-d", "4", "-o", str(out)], cwd=cwd, env=sudo_env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  start_new_session=True)
        try:
            _wait_ready(tracer)
            subprocess.run(workload, user=user.uid, group=user.gid, extra_groups=[], check=True, timeout=60)
            stdout, stderr = tracer.communicate(timeout=300)
        finally:
            if tracer.poll() is None:
                tracer.kill()
                tracer.wait()
        r = subprocess.CompletedProcess(tracer.args, tracer.returncode, stdout, stderr)
    assert r.returncode == 0, r.stderr
    assert mark.read_text() == "", f"planted code ran: {mark.read_text()}"
    cap = open_capture(out)
    assert cap.complete, cap.problems
    assert expect.mismatches(cap, [read_report(report)], {"setup", "before_go", "run"}) == [], r.stderr
    assert json.loads((out / "manifest.json").read_text())["complete"] is True
    assert {p.stat().st_uid for p in [out, *out.iterdir()]} == {user.uid}


def _wait_ready(tracer: subprocess.Popen, timeout: float = 180) -> None:
    import selectors
    import time

    sel = selectors.DefaultSelector()
    sel.register(tracer.stderr, selectors.EVENT_READ)
    seen = ""
    deadline = time.monotonic() + timeout
    while "Ctrl-C to end" not in seen:
        if tracer.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"pasta-trace did not attach:\n{seen}")
        if sel.select(timeout=0.5):
            line = tracer.stderr.readline()
            seen += line
