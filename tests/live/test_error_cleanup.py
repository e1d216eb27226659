"""An error in the middle of a capture (here a drain that raises, injected
into the real CLI) still ends cleanly: one line and exit 1, the events writer
process gone, the directory and every file in it the invoking user's, and no
device staging directory left beside it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pasta_run import descendants, tracer_env
from users import unavailable, users_directory  # tests/fixtures/users.py

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf"),
              pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

ROOT = Path(__file__).resolve().parents[2]

#: the real CLI, with the drain loop raising at its 30th drain (mid-capture: the writer runs)
FAILING = """
import sys
from pasta_trace.capture.output import drain
real = drain.DrainLoop.drain
calls = 0
def drain_then_fail(self):
    global calls
    calls += 1
    if calls == 30:
        raise RuntimeError("injected failure")
    return real(self)
drain.DrainLoop.drain = drain_then_fail
from pasta_trace.cli import main
sys.exit(main(sys.argv[1:]))
"""



@pytest.fixture
def base(user):
    with users_directory(user, "pasta-err-") as d:
        yield d


def _run_failing(args: list[str], env: dict[str, str]) -> tuple[int, str, set[int]]:
    """(exit code, stderr, the writer processes seen while it ran); a launched
    `sleep` it leaves running is killed."""
    proc = subprocess.Popen([sys.executable, "-c", FAILING, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, "PYTHONPATH": str(ROOT)})
    writers: set[int] = set()
    sleeps: set[int] = set()
    while proc.poll() is None:
        for p in descendants(proc.pid):
            try:
                cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
            except OSError:
                continue
            if b"pasta_trace.capture.output.event_writer" in cmdline:
                writers.add(p)
            elif cmdline.startswith(b"sleep\0"):
                sleeps.add(p)
        time.sleep(0.01)
    _, err = proc.communicate(timeout=300)
    for p in sleeps:
        try:
            os.kill(p, 9)
        except ProcessLookupError:
            pass
    return proc.returncode, err, writers


def _assert_owned(path: Path, uid: int) -> None:
    for p in [path, *path.rglob("*")]:
        assert p.lstat().st_uid == uid, (p, p.lstat().st_uid)


@pytest.mark.parametrize("device", [False, True])
def test_an_error_mid_capture_hands_everything_over(user, base, device):
    gpu = ROOT / "gpu_probes" / "build" / "libgpu_probes_sanitizer.so"
    if device and not gpu.exists():
        pytest.skip("the Sanitizer backend is not built (scripts/build_gpu_probes.sh)")
    out = base / "cap"
    args = ["-o", str(out), *(["--device", "sanitizer"] if device else []), "--", "sleep", "30"]
    rc, err, writers = _run_failing(args, tracer_env(user.sudo_env))
    assert rc == 1, err
    assert [ln for ln in err.splitlines() if "injected failure" in ln] == [err.strip().splitlines()[-1]], err
    assert "Traceback" not in err
    assert writers, "the events writer never ran: the failure came too early"
    assert all(not Path(f"/proc/{w}").exists() for w in writers), "the events writer outlived the capture"
    assert (out / "manifest.json").exists()
    _assert_owned(out, user.uid)
    assert sorted(p.name for p in base.iterdir()) == ["cap"]  # no staging directory beside it


def test_an_error_mid_capture_as_root_leaves_no_writer(tmp_path, sleeper):
    out = tmp_path / "cap"
    rc, err, writers = _run_failing(["-p", str(sleeper.pid), "-o", str(out)], tracer_env())
    assert rc == 1, err
    assert "injected failure" in err and "Traceback" not in err, err
    assert writers and all(not Path(f"/proc/{w}").exists() for w in writers)
    assert (out / "manifest.json").exists()
