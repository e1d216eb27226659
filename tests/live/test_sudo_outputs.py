"""Under sudo pasta-trace acts as the user who ran it (pasta_trace.privilege):
each attack below is played by a real unprivileged user made for the test,
through the real CLI run as root with that user's SUDO_* variables.  Nothing
outside the user's reach is created, replaced, removed or chowned; the
refusal is one line with its documented exit code.  The honest user's
outputs are complete and entirely theirs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from cli_run import ROOT, cli, one_error_line  # tests/fixtures/cli_run.py
from users import unavailable  # tests/fixtures/users.py

from pasta_trace import merge
from pasta_trace.testing import synthetic

pytestmark = [pytest.mark.live, pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

SECRET = b"root's secret\n"



def chown_tree(path: Path, user) -> None:
    for p in [path, *path.rglob("*")]:
        os.chown(p, user.uid, user.gid)


def snapshot(path: Path) -> dict:
    """Every entry under `path` (itself included): kind, owner, mode and content."""
    out = {}
    for p in [path, *sorted(path.rglob("*"))]:
        st = p.lstat()
        out[str(p)] = (stat.S_IFMT(st.st_mode), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode),
                       p.read_bytes() if stat.S_ISREG(st.st_mode) else None)
    return out


@pytest.fixture
def base(user):
    """A directory everyone can pass through (like /), holding stand-ins for
    /etc and /usr/lib (root's, 0755), /opt/rootdir (an earlier capture of
    root's), /root (0700) and the user's home."""
    d = Path(tempfile.mkdtemp(prefix="pasta-sudo-"))
    d.chmod(0o755)
    (d / "etc").mkdir(mode=0o755)
    (d / "etc" / "FILE").write_bytes(SECRET)
    (d / "etc" / "FILE").chmod(0o600)
    (d / "usrlib").mkdir(mode=0o755)
    rootdir = d / "opt" / "rootdir"
    (rootdir / "device").mkdir(parents=True, mode=0o755)
    (rootdir / "manifest.json").write_text('{"complete": true}')
    (rootdir / "device" / "gpu_probes.1.sanitizer.bin").write_bytes(SECRET)
    (d / "root").mkdir(mode=0o700)
    (d / "root" / "dir").mkdir(mode=0o700)
    (d / "root" / "dir" / "manifest.json").write_bytes(SECRET)
    home = d / "home"
    home.mkdir(mode=0o755)
    os.chown(home, user.uid, user.gid)
    yield d
    shutil.rmtree(d)


@pytest.fixture(scope="module")
def capture(user):
    """A capture of the user's (under sudo the offline verbs read as the user)."""
    d = Path(tempfile.mkdtemp(prefix="pasta-src-"))
    d.chmod(0o755)
    synthetic.write_capture(d / "cap", synthetic.Spec(pids=1, launches=20, allocations=4, accesses=100))
    chown_tree(d / "cap", user)
    yield d / "cap"
    shutil.rmtree(d)


def untouched(before: dict, base: Path) -> None:
    """Nothing under `base` but the user's home changed."""
    after = {k: v for k, v in snapshot(base).items() if not k.startswith(str(base / "home"))}
    assert after == {k: v for k, v in before.items() if not k.startswith(str(base / "home"))}


# ---------------------------------------------------------------- record

def test_record_where_the_user_cannot_create_is_refused(require_bpf, user, base):
    """`record -o /usr/lib/python311.zip`: the parent is root's 0755."""
    before = snapshot(base)
    for out, refused in [(base / "usrlib" / "python311.zip", "the output directory "),
                         (base / "etc" / "new" / "cap", "")]:
        r = cli("-o", str(out), "--", "true", env=user.sudo_env)
        assert r.returncode == 2, r.stderr
        where = out if refused else out.parent
        assert one_error_line(r) == (f"pasta-trace: error: cannot create {refused}{where}: Permission denied"
                                     + (" (choose another output)" if refused else ""))
    untouched(before, base)
    real = Path("/usr/lib/python311.zip")
    if not os.path.lexists(real):
        r = cli("-o", str(real), "--", "true", env=user.sudo_env)
        assert (r.returncode, one_error_line(r)) == (
            2, f"pasta-trace: error: cannot create the output directory {real}: Permission denied "
               "(choose another output)")
        assert not os.path.lexists(real)


@pytest.mark.parametrize("target", ["opt/rootdir", "root/dir"])
def test_record_force_over_roots_directory_deletes_nothing(require_bpf, user, base, target):
    """`-o /opt/rootdir --force` (root's, with root's manifest.json and
    device/) and `-o /root/dir --force` (inside a root-only directory)."""
    before = snapshot(base)
    out = base / target
    r = cli("-o", str(out), "--force", "--", "true", env=user.sudo_env)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == {
        "opt/rootdir": f"pasta-trace: error: cannot write in {out}: Permission denied (choose another output)",
        "root/dir": f"pasta-trace: error: cannot open {base / 'root'}: Permission denied",
    }[target]
    untouched(before, base)


def test_record_into_the_users_own_directory_is_complete_and_theirs(require_bpf, user, base):
    """The honest use: parents made as by `mkdir -p` run by the user, every
    file the user's from the start, nothing of root's anywhere in it."""
    before = snapshot(base)
    out = base / "home" / "runs" / "cap"
    r = cli("-o", str(out), "--", "true", env=user.sudo_env, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["launched"]["exit_code"] == 0
    owners = {(p.name, p.stat().st_uid, p.stat().st_gid) for p in [out.parent, out, *out.rglob("*")]}
    assert owners == {(p.name, user.uid, user.gid) for p in [out.parent, out, *out.rglob("*")]}
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o600}
    assert not [p for p in (base / "home").rglob(".*")]  # no temporaries, no staging
    untouched(before, base)


# ---------------------------------------------------------------- offline verbs

@pytest.mark.parametrize("verb", [
    ("export", "{cap}", "--format", "chrome", "-o", "{out}", "--force"),
    ("report", "{cap}", "--html", "{out}", "--force"),
    ("merge", "{cap}", "-o", "{out}", "--force"),
    ("export", "{cap}", "--format", "chrome", "-o", "{new}"),
    ("report", "{cap}", "--html", "{new}"),
], ids=["export-force", "report-force", "merge-force", "export-new", "report-new"])
def test_an_offline_verb_cannot_write_in_roots_directory(user, base, capture, verb):
    """`export ... -o /etc/FILE --force` on root's 0600 file, `merge -o
    /etc/FILE --force`, and a new file in /etc: refused, nothing changed."""
    before = snapshot(base)
    r = cli(*(a.format(cap=capture, out=base / "etc" / "FILE", new=base / "etc" / "new") for a in verb),
            env=user.sudo_env)
    assert r.returncode == 2, r.stderr
    assert one_error_line(r) == (f"pasta-trace: error: cannot write in {base / 'etc'}: Permission denied "
                                 "(choose another output)")
    untouched(before, base)


def test_an_offline_verb_cannot_write_in_the_real_etc(user, capture):
    name = Path("/etc") / f"pasta-trace-test-{os.getpid()}.json"
    r = cli("export", str(capture), "--format", "chrome", "-o", str(name), env=user.sudo_env)
    assert (r.returncode, one_error_line(r)) == (
        2, "pasta-trace: error: cannot write in /etc: Permission denied (choose another output)")
    assert not os.path.lexists(name)


def test_csv_export_force_over_roots_directory_deletes_nothing(user, base, capture):
    before = snapshot(base)
    out = base / "opt" / "rootdir"
    r = cli("export", str(capture), "--format", "csv", "-o", str(out), "--force", env=user.sudo_env)
    assert (r.returncode, one_error_line(r)) == (
        2, f"pasta-trace: error: cannot write in {out}: Permission denied (choose another output)")
    untouched(before, base)


def test_the_users_offline_outputs_are_theirs(user, base, capture):
    home = base / "home"
    for args in [("export", str(capture), "--format", "csv", "-o", str(home / "csv")),
                 ("export", str(capture), "--format", "perfetto", "-o", str(home / "t.pftrace")),
                 ("merge", str(capture), "-o", str(home / "t.parquet")),
                 ("report", str(home / "t.parquet"), "--html", str(home / "r.html"))]:
        r = cli(*args, env=user.sudo_env)
        assert r.returncode == 0, r.stderr
    made = [p for p in home.rglob("*")]
    assert sorted(p.name for p in home.iterdir()) == ["csv", "r.html", "t.parquet", "t.pftrace"]
    assert {(p.stat().st_uid, p.stat().st_gid) for p in made} == {(user.uid, user.gid)}
    assert len(list((home / "csv").glob("*.csv"))) > 1


def test_a_root_only_capture_is_refused_with_what_to_run(user, base, capture):
    """Run by the user, report/export/merge cannot read root's capture: exit
    77 with the chown that gives it to them; a csv export leaves no
    directory to block the rerun, which then works."""
    cap = base / "root-capture"
    shutil.copytree(capture, cap)
    chown_tree(cap, type(user)("root", 0, 0))
    cap.chmod(0o700)
    csv = base / "home" / "csv"
    for args in [("report", str(cap)), ("export", str(cap), "--format", "csv", "-o", str(csv)),
                 ("merge", str(cap), "-o", str(base / "home" / "t.parquet"))]:
        r = cli(*args, env=user.sudo_env)
        assert r.returncode == 77, r.stderr
        assert one_error_line(r) == (
            f"pasta-trace: error: {cap}: cannot read (Permission denied) (under sudo pasta-trace reads as "
            f"{user.name}, not as root; to read a capture of root's, give it to {user.name} first: "
            f"`sudo chown -R {user.name} {cap}`)")
    assert os.listdir(base / "home") == []
    chown_tree(cap, user)
    r = cli("export", str(cap), "--format", "csv", "-o", str(csv), env=user.sudo_env)
    assert r.returncode == 0, r.stderr


def test_the_offline_verbs_have_the_users_supplementary_groups(user, base, capture):
    """The user is the user with their groups (getgrouplist): a capture root
    shares with a group of theirs (root:group 0750) reads; the same capture
    shared with a group they are not in is refused."""
    group = f"pt-g{os.getpid()}"
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        cap = base / "shared-capture"
        shutil.copytree(capture, cap)
        chown_tree(cap, type(user)("root", 0, 0))
        for p in [cap, *cap.rglob("*")]:
            shutil.chown(p, group=group)
            p.chmod(0o750 if p.is_dir() else 0o640)
        r = cli("report", str(cap), "--tool", "kernels", env=user.sudo_env)
        assert r.returncode == 77, r.stderr
        subprocess.run(["gpasswd", "-a", user.name, group], check=True, capture_output=True)
        r = cli("report", str(cap), "--tool", "kernels", env=user.sudo_env)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip()
    finally:
        subprocess.run(["groupdel", group], check=False, capture_output=True)


def test_an_interrupted_merge_exits_130_and_leaves_nothing(user, base):
    """Ctrl-C while the timeline is written: exit 130, no timeline, no temporary."""
    src = Path(tempfile.mkdtemp(prefix="pasta-big-"))
    try:
        src.chmod(0o755)
        synthetic.write_capture(src / "cap", synthetic.Spec(pids=1, launches=200_000, allocations=200,
                                                            accesses=200_000))
        chown_tree(src / "cap", user)
        home = base / "home"
        env = {**os.environ, "PYTHONPATH": str(ROOT), **user.sudo_env}
        p = subprocess.Popen([sys.executable, "-m", "pasta_trace.cli", "merge", str(src / "cap"), "-o",
                              str(home / "t.parquet")], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not any(n.startswith(".t.parquet.") for n in os.listdir(home)):  # the staged timeline
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else ""
            time.sleep(0.02)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=120)
        assert p.returncode == 130, err
        assert "Wrote" not in err and "Traceback" not in err
        assert os.listdir(home) == []
    finally:
        shutil.rmtree(src)


# ---------------------------------------------------------------- report --cluster

HOSTILE_WORKER = textwrap.dedent('''\
    """A Dask worker preload: every task fails with an exception whose
    unpickling runs a command wherever it is unpickled (the client)."""
    import os

    import distributed.worker as w

    MARK = os.environ["PASTA_TEST_MARK"]


    class Payload(Exception):
        # unpickled, it runs the command, then is an exception as Dask expects
        def __reduce__(self):
            command = f"echo $(id -u) $PPID >> {MARK}"
            return (eval, (f"(__import__('os').system({command!r}), RuntimeError('the payload ran'))[1]",))


    class _Raise:
        def __call__(self, data):
            raise Payload("from the user's worker")


    # Dask imports a preload file, then reloads it: wrap the real function once
    _real = w.__dict__.setdefault("_pasta_test_real", w._run_task_simple)


    def _hostile(task, data, time_delay):
        return _real(_Raise(), data, time_delay)


    w._run_task_simple = _hostile
    ''')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_report_on_the_users_dask_cluster_runs_as_the_user(user, base):
    """`report --cluster` under sudo: a scheduler and worker the user
    controls send back an exception whose unpickling runs a command; it runs
    in pasta-trace, as the user, never as root."""
    pytest.importorskip("distributed", reason="distributed (the cluster extra) is not installed")
    dask = Path(sys.executable).with_name("dask")
    if not dask.exists():
        pytest.skip("the dask command is not installed")
    home = base / "home"
    made = base / "made"  # root's own, then given to the user
    for n, seed in (("a", 1), ("b", 2)):
        synthetic.write_capture(made / n, synthetic.Spec(pids=2, launches=100, allocations=4, accesses=100,
                                                         collectives=20, seed=seed))
    merge.write_cluster([merge.load(made / "a"), merge.load(made / "b")], merge.timeline_output(made / "cl"),
                        sync_ns=10_000_000)
    (made / "cl").rename(home / "cl")
    (home / "hostile_worker.py").write_text(HOSTILE_WORKER)
    chown_tree(home, user)
    mark = home / "mark"
    port = _free_port()
    env = {"PATH": os.environ["PATH"], "HOME": str(home), "PYTHONPATH": str(ROOT), "PASTA_TEST_MARK": str(mark),
           "DASK_DISTRIBUTED__WORKER__DAEMON": "False"}
    as_user = {"user": user.uid, "group": user.gid, "extra_groups": [], "cwd": home, "env": env,
               "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    addr = f"tcp://127.0.0.1:{port}"
    procs = [subprocess.Popen([str(dask), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], **as_user)]
    try:
        procs.append(subprocess.Popen([str(dask), "worker", addr, "--nthreads", "1", "--no-dashboard",
                                       "--preload", str(home / "hostile_worker.py")], **as_user))
        p = subprocess.Popen([sys.executable, "-m", "pasta_trace.cli", "report", str(home / "cl"), "--tool", "hangs",
                              "--cluster", addr], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                                 **user.sudo_env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        _, err = p.communicate(timeout=240)
        lines = [line.split() for line in mark.read_text().splitlines()] if mark.exists() else []
        assert ["0"] not in [line[:1] for line in lines], lines  # never as root, anywhere
        assert [str(user.uid), str(p.pid)] in lines, (lines, err)  # it ran in pasta-trace, as the user
        assert p.returncode != 0 and "Traceback" not in err, err
    finally:
        for q in reversed(procs):
            q.terminate()
        for q in reversed(procs):
            try:
                q.wait(timeout=30)
            except subprocess.TimeoutExpired:
                q.kill()
                q.wait()


# ---------------------------------------------------------------- doctor

def test_doctor_reads_the_libraries_as_the_user(require_bpf, user, base):
    """doctor's library checks read what the environment names: under sudo a
    VIRTUAL_ENV inside a root-only directory shows the user nothing, where
    root's own doctor lists the library it holds."""
    lib = base / "root" / "venv" / "lib" / "python3.11" / "site-packages" / "torch" / "lib" / "libc10.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"not an ELF file")
    (base / "root" / "venv" / "bin").mkdir()
    env = {"VIRTUAL_ENV": str(base / "root" / "venv")}
    as_root = cli("doctor", env=env, timeout=300)
    assert f"{lib}" in as_root.stdout, as_root.stdout
    r = cli("doctor", env={**env, **user.sudo_env}, timeout=300)
    assert str(base / "root") not in r.stdout + r.stderr
    assert (f"ok   the checks below ran as uid {user.uid}, who ran sudo: they see only what that user may "
            "read") in r.stdout.splitlines()
    assert "ok   privileges (root): CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)" in r.stdout.splitlines()
