"""Under sudo, a capture holds the invoking user's processes and nothing else
(issue 19): real users made with useradd, real uprobes on the stub libcuda.

- `-a` with user 1's SUDO_*: user 1's workload is traced call for call; user
  2's, and user 1's own setuid-root program, leave no event, no row in
  processes.parquet, and the fresh library copy each loads late is never
  attached (a stop at its open would have attached it), and both finish.
  Without SUDO_* the same run records all three.
- `-p` of root's process, of user 2's and of a setuid-root program user 1
  started: refused with one line (exit 77) naming the PID and its owner,
  before anything is written.
- The tracer tells its own processes apart by PID: a user's program named
  `pasta-trace` is traced with its exact count.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import polars as pl
import pytest

import expect
import users
from cli_run import cli, one_error_line
from pasta_run import READY_TEXT, pasta_command, read_report, run_pasta, tracer_env, wait_for_file
from pasta_trace.read import open_capture

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

ALL_PHASES = {"setup", "before_go", "run"}
WORKLOAD_ARGS = ["--threads", "2", "--iters", "2"]


@pytest.fixture
def shared_dir():
    """A directory every test user can reach (pytest's tmp_path is root's, mode 0700)."""
    d = Path(tempfile.mkdtemp(prefix="pasta-reach-", dir="/tmp"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def two_users():
    if (why := users.unavailable()) is not None:
        pytest.skip(why)
    with users.temporary_user() as u1, users.temporary_user() as u2:
        yield u1, u2


def _home(base: Path, user: users.User | None, name: str) -> Path:
    """A directory of ``user``'s own (root's with None), with its own copy of the stub: a new inode."""
    d = base / name
    d.mkdir()
    if user is not None:
        os.chown(d, user.uid, user.gid)
    return d


def _setuid_root(src: Path, dest: Path) -> Path:
    """A copy of ``src`` owned by root with the setuid bit: whoever runs it has effective uid 0."""
    shutil.copy(src, dest)
    os.chown(dest, 0, 0)
    dest.chmod(0o4755)
    return dest


def _run_as(user: users.User, cmd: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(cmd, user=user.uid, group=user.gid, extra_groups=[], **kw)


def _start_tracer(args: list[str], env: dict[str, str], log: Path) -> tuple[subprocess.Popen, object]:
    err = open(log, "w")
    proc = subprocess.Popen([*pasta_command(), *args], stdout=subprocess.PIPE, stderr=err, text=True,
                            start_new_session=True, env={**tracer_env(), **env})
    deadline = time.monotonic() + 180
    while READY_TEXT not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"pasta-trace did not attach:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)
    return proc, err


def _workload(cuda_workload: Path, lib: Path, report: Path) -> list[str]:
    return [str(cuda_workload), "--lib", str(lib), "--report", str(report), *WORKLOAD_ARGS]


@pytest.mark.machine_wide
@pytest.mark.parametrize("under_sudo", [True, False], ids=["sudo-user1", "root"])
def test_system_wide_under_sudo_records_only_the_invoking_users_processes(
        under_sudo, two_users, shared_dir, cuda_stub, cuda_workload):
    u1, u2 = two_users
    dirs = {name: _home(shared_dir, user, name) for name, user in (("u1", u1), ("u2", u2), ("suid", u1))}
    libs = {name: shutil.copy(cuda_stub, d / "libcuda.so.1") for name, d in dirs.items()}  # fresh inodes
    suid = _setuid_root(cuda_workload, shared_dir / "suid_workload")
    # written as the invoking user under sudo, so somewhere that user may write
    out = (_home(shared_dir, u1, "out") if under_sudo else shared_dir) / "cap"
    proc, err = _start_tracer(["-a", "-o", str(out), "--buffer-pages", "16384"],
                              u1.sudo_env if under_sudo else {}, shared_dir / "tracer.log")
    try:
        # each loads its own copy after the tracer started: an open a traced process is stopped at
        runs = {
            "u1": _run_as(u1, _workload(cuda_workload, Path(libs["u1"]), dirs["u1"] / "r.json")),
            "u2": _run_as(u2, _workload(cuda_workload, Path(libs["u2"]), dirs["u2"] / "r.json")),
            "suid": _run_as(u1, _workload(suid, Path(libs["suid"]), dirs["suid"] / "r.json")),
        }
        for name, p in runs.items():
            assert p.wait(timeout=120) == 0, name  # never left stopped
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=180)
        err.close()
    log = (shared_dir / "tracer.log").read_text(errors="replace")
    assert proc.returncode == 0, log
    reports = {name: read_report(d / "r.json") for name, d in dirs.items()}
    assert os.stat(dirs["suid"] / "r.json").st_uid == 0  # it did run as root
    cap = open_capture(out)
    assert cap.complete, cap.problems
    events = cap.events.collect()
    pids = set(events["pid"].unique().to_list())
    rows = set(pl.read_parquet(out / "processes.parquet")["pid"].to_list())
    attached = {lib["path"] for lib in cap.manifest["libraries"]}
    traced = ["u1"] if under_sudo else ["u1", "u2", "suid"]
    assert expect.mismatches(cap, [reports[n] for n in traced], ALL_PHASES) == [], log
    for name in traced:
        assert reports[name]["pid"] in rows
        assert str(libs[name]) in attached
    for name in ({"u1", "u2", "suid"} - set(traced)):
        pid = reports[name]["pid"]
        assert pid not in pids, name
        assert pid not in rows, name
        assert str(libs[name]) not in attached, name  # never stopped: a stop attaches the library it opened
        assert f"PID {pid}" not in log, name
    if under_sudo:  # nothing of any other user: not root's processes either
        owners = {os.stat(f"/proc/{p}").st_uid for p in pids if os.path.exists(f"/proc/{p}")}
        assert owners <= {u1.uid}


@pytest.fixture
def root_sleeper():
    p = subprocess.Popen(["sleep", "60"])
    yield p
    p.kill()
    p.wait()


def test_p_of_another_users_process_is_refused_before_anything_is_read(two_users, shared_dir, root_sleeper):
    u1, u2 = two_users
    suid_sleep = _setuid_root(Path(shutil.which("sleep")), shared_dir / "suid_sleep")
    with ExitStack() as stack:
        theirs = _run_as(u2, ["sleep", "60"])
        stack.callback(lambda: (theirs.kill(), theirs.wait()))
        setuid = _run_as(u1, [str(suid_sleep), "60"])
        stack.callback(lambda: (setuid.kill(), setuid.wait()))
        mine = _run_as(u1, ["sleep", "60"])
        stack.callback(lambda: (mine.kill(), mine.wait()))
        deadline = time.monotonic() + 10
        while os.stat(f"/proc/{setuid.pid}").st_uid != 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # /proc/PID belongs to the effective uid once it has exec'd
        cases = [
            (root_sleeper.pid, f"PID {root_sleeper.pid} belongs to root (uid 0), not to {u1.name} (uid {u1.uid})"),
            (theirs.pid, f"PID {theirs.pid} belongs to {u2.name} (uid {u2.uid}), not to {u1.name} (uid {u1.uid})"),
            (setuid.pid, f"PID {setuid.pid} belongs to root (effective uid 0: a setuid program, or one that changed "
                         f"uid), not to {u1.name} (uid {u1.uid})"),
        ]
        for pid, said in cases:
            out = shared_dir / f"cap{pid}"
            for args in (["-p", str(pid)], ["-p", f"{mine.pid},{pid}"]):
                r = cli(*args, "-o", str(out), env=u1.sudo_env)
                assert r.returncode == 77, r.stderr
                assert one_error_line(r) == (f"pasta-trace: error: {said}: under sudo pasta-trace traces only the "
                                             "invoking user's own processes")
                assert not out.exists()
        # the user's own process passes this check (and fails later only for what the machine lacks)
        r = cli("--dry-run", "-p", str(mine.pid), env=u1.sudo_env)
        assert "belongs to" not in r.stderr


def test_a_program_named_pasta_trace_is_traced(tmp_path, cuda_stub, cuda_workload):
    """Its comm is the tracer's display name; it is stopped at its exec and at its late library open like
    any other program, so its calls are traced from the first (before: 0 events, lost: 0)."""
    prog = tmp_path / "bin" / "pasta-trace"
    prog.parent.mkdir()
    shutil.copy(cuda_workload, prog)
    lib = tmp_path / "private" / "libcuda.so.1"  # in no search path: found only when opened
    lib.parent.mkdir()
    shutil.copy(cuda_stub, lib)
    out = tmp_path / "cap"
    report = tmp_path / "r.json"
    r = run_pasta(["-o", str(out), "--", str(prog), "--lib", str(lib), "--report", str(report), *WORKLOAD_ARGS],
                  timeout=300)
    assert r.returncode == 0, r.stderr
    cap = open_capture(out)
    rep = read_report(report)
    assert len(expect.expected_calls(rep, ALL_PHASES)) > 0
    assert expect.mismatches(cap, [rep], ALL_PHASES) == []
    comms = cap.events.collect().filter(pl.col("pid") == rep["pid"])["comm"].cast(pl.String).unique().to_list()
    assert comms == ["pasta-trace"]
