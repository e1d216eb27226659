"""Root must not write through anyone else's links.  Each attack on the
output directory, played by a real unprivileged user made for the test
against the real CLI running as root: the target file stays unchanged and
root's, and the attacker gets a one-line refusal (exit 2) or nothing.

Under sudo everything is made as the user (pasta_trace.privilege): the
capture is theirs from the start, so the command they launch may spoil its
own capture, and nothing else (test_sudo_outputs.py has the rest)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from cli_run import cli, one_error_line  # tests/fixtures/cli_run.py
from users import unavailable  # tests/fixtures/users.py

from pasta_trace.testing import synthetic

pytestmark = [pytest.mark.live, pytest.mark.skipif(unavailable() is not None, reason=unavailable() or "")]

SECRET = b"root's secret\n"



@pytest.fixture
def base():
    """A directory everyone can pass through (like /tmp, unlike pytest's 0700
    tmp_path), holding a root-only directory with the file to protect."""
    d = Path(tempfile.mkdtemp(prefix="pasta-sec-"))
    d.chmod(0o755)
    (d / "rootonly").mkdir(mode=0o700)
    (d / "rootonly" / "victim").write_bytes(SECRET)
    (d / "rootonly" / "victim").chmod(0o600)
    yield d
    shutil.rmtree(d)


def assert_victim_untouched(base: Path) -> None:
    victim = base / "rootonly" / "victim"
    st = victim.stat()
    assert (victim.read_bytes(), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (SECRET, 0, 0, 0o600)
    st = (base / "rootonly").stat()
    assert (sorted(os.listdir(base / "rootonly")), st.st_uid, stat.S_IMODE(st.st_mode)) == (["victim"], 0, 0o700)


def users_link(user, link: Path, target: Path) -> None:
    link.symlink_to(target)
    os.lchown(link, user.uid, user.gid)


def users_dir(user, path: Path, mode: int = 0o755) -> Path:
    path.mkdir(mode=mode)
    path.chmod(mode)
    os.chown(path, user.uid, user.gid)
    return path


@pytest.fixture
def users_sleeper(user):
    """A process of the user's to point -p at (under sudo only those may be traced)."""
    p = subprocess.Popen(["sleep", "60"], user=user.uid, group=user.gid, extra_groups=[])
    yield p
    p.kill()
    p.wait()


def test_the_launched_command_cannot_redirect_roots_writes(require_bpf, user, base):
    """The command runs as the user while the capture is written into a
    directory of theirs: links it plants under the temporary and final names
    must not be written through or chowned; what it leaves there is its own."""
    out = users_dir(user, base / "home") / "cap"
    victim = base / "rootonly" / "victim"
    plant = "; ".join(f"ln -s {victim} {out}/{name}" for name in (
        ".manifest.json.tmp", ".names.parquet.tmp", ".processes.parquet.tmp", ".libraries.parquet.tmp",
        ".events-00000.parquet.tmp", "names.parquet", "evil"))
    r = cli("-o", str(out), "--", "sh", "-c", f"{plant} 2>/dev/null; ls {out} 2>/dev/null; exit 0",
            env=user.sudo_env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert_victim_untouched(base)
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["launched"]["exit_code"] == 0
    planted = {".manifest.json.tmp", ".names.parquet.tmp", ".processes.parquet.tmp", ".libraries.parquet.tmp",
               ".events-00000.parquet.tmp", "evil"}
    entries = set(os.listdir(out))
    # libraries.parquet only where the ld.so cache has a GPU library to attach to at launch
    assert entries - planted - {"libraries.parquet"} == {"manifest.json", "names.parquet", "processes.parquet",
                                                         "stacks.parquet"}
    # the user's from the start, and only the user's to read
    st = out.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (user.uid, user.gid, 0o700)
    for name in entries - planted:  # names.parquet's planted link was replaced, not written through
        st = (out / name).lstat()
        assert (stat.S_ISREG(st.st_mode), st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == \
            (True, user.uid, user.gid, 0o600), name
    for name in entries & planted:  # the user's own links, left as they are
        st = (out / name).lstat()
        assert (stat.S_ISLNK(st.st_mode), st.st_uid) == (True, user.uid), name


@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("under_sudo", [False, True])
def test_an_output_that_is_a_users_link_is_refused(user, base, sleeper, users_sleeper, force, under_sudo):
    """Root's own use follows no link of a user's.  Under sudo the walk is the
    user's (privilege.as_user): their link leads only where they may go, and
    the root-only directory stops it."""
    link = base / "x"
    users_link(user, link, base / "rootonly")
    traced = users_sleeper if under_sudo else sleeper
    r = cli("-p", str(traced.pid), "-o", str(link), "-d", "1", *(["--force"] if force else []),
            env=user.sudo_env if under_sudo else None)
    assert r.returncode == 2
    assert one_error_line(r) == (f"pasta-trace: error: cannot open {link}: Permission denied" if under_sudo else
                                 f"pasta-trace: error: refusing {link}: {link} is a symbolic link owned by uid "
                                 f"{user.uid} (as root only root's links are followed: give the path it points to)")
    assert_victim_untouched(base)


@pytest.mark.parametrize("under_sudo", [False, True])
def test_an_output_through_a_users_link_is_refused(user, base, sleeper, users_sleeper, under_sudo):
    users_link(user, base / "x", base / "rootonly")
    traced = users_sleeper if under_sudo else sleeper
    r = cli("-p", str(traced.pid), "-o", str(base / "x" / "cap"), "-d", "1",
            env=user.sudo_env if under_sudo else None)
    assert r.returncode == 2
    assert one_error_line(r) == (
        f"pasta-trace: error: cannot open {base / 'rootonly'}: Permission denied" if under_sudo else
        f"pasta-trace: error: refusing {base / 'x' / 'cap'}: {base / 'x'} is a symbolic link owned by uid "
        f"{user.uid} (as root only root's links are followed: give the path it points to)")
    assert_victim_untouched(base)


def test_under_sudo_the_users_own_link_to_their_own_directory_is_followed(require_bpf, user, base, users_sleeper):
    theirs = users_dir(user, base / "theirs")
    users_link(user, base / "x", theirs)
    r = cli("-p", str(users_sleeper.pid), "-o", str(base / "x" / "cap"), "-d", "1", env=user.sudo_env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert json.loads((theirs / "cap" / "manifest.json").read_text())["complete"] is True
    assert {p.stat().st_uid for p in [theirs / "cap", *(theirs / "cap").iterdir()]} == {user.uid}
    assert_victim_untouched(base)


@pytest.mark.parametrize("force", [False, True])
def test_a_directory_of_another_user_is_refused(user, base, sleeper, force):
    """Without sudo the invoking user is root: the other user's directory
    (which they could rearrange under us) is not written in, nor taken over."""
    theirs = base / "theirs"
    theirs.mkdir()
    os.chown(theirs, user.uid, user.gid)
    for target in (theirs, theirs / "cap"):
        r = cli("-p", str(sleeper.pid), "-o", str(target), "-d", "1", *(["--force"] if force else []))
        assert r.returncode == 2
        assert one_error_line(r) == (f"pasta-trace: error: refusing {target}: {theirs} belongs to uid "
                                     f"{user.uid}, neither root nor you")
    assert os.listdir(theirs) == [] and theirs.stat().st_uid == user.uid


def test_the_invoking_users_own_directory_is_fine_and_stays_theirs(require_bpf, user, base, users_sleeper):
    theirs = users_dir(user, base / "theirs", 0o750)
    r = cli("-p", str(users_sleeper.pid), "-o", str(theirs), "-d", "1", env=user.sudo_env, timeout=300)
    assert r.returncode == 0, r.stderr
    st = theirs.stat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (user.uid, 0o750)  # never taken over
    assert {(p.stat().st_uid, p.stat().st_gid, stat.S_IMODE(p.stat().st_mode)) for p in theirs.iterdir()} == \
        {(user.uid, user.gid, 0o600)}


@pytest.fixture(scope="module")
def capture(user):
    """A capture the user may read (under sudo the offline verbs read as the user)."""
    d = Path(tempfile.mkdtemp(prefix="pasta-src-"))
    d.chmod(0o755)
    path = d / "cap"
    synthetic.write_capture(path, synthetic.Spec(pids=1, launches=20, allocations=4, accesses=100))
    for p in [path, *path.rglob("*")]:
        os.chown(p, user.uid, user.gid)
    yield path
    shutil.rmtree(d)


@pytest.mark.parametrize("verb", [
    ("report", "{cap}", "--html", "{out}", "--force"),
    ("export", "{cap}", "--format", "perfetto", "-o", "{out}", "--force"),
    ("export", "{cap}", "--format", "chrome", "-o", "{out}", "--force"),
    ("merge", "{cap}", "-o", "{out}", "--force"),
], ids=["report-html", "export-perfetto", "export-chrome", "merge"])
def test_every_verb_refuses_a_users_link_as_its_output(user, base, capture, verb):
    """Under sudo these verbs are the user: the link is theirs to follow, and
    the kernel stops them at the root-only directory."""
    out = base / "out"
    users_link(user, out, base / "rootonly" / "victim")
    r = cli(*(a.format(cap=capture, out=out) for a in verb), env=user.sudo_env)
    assert r.returncode == 2
    assert one_error_line(r) == f"pasta-trace: error: cannot open {base / 'rootonly'}: Permission denied"
    assert_victim_untouched(base)


@pytest.mark.parametrize("verb", [
    ("report", "{cap}", "--html", "{out}", "--force"),
    ("export", "{cap}", "--format", "chrome", "-o", "{out}", "--force"),
    ("merge", "{cap}", "-o", "{out}", "--force"),
], ids=["report-html", "export-chrome", "merge"])
def test_as_root_every_verb_refuses_a_users_link_as_its_output(user, base, capture, verb):
    """Root's own use: a link of anyone else's is never followed."""
    out = base / "out"
    users_link(user, out, base / "rootonly" / "victim")
    r = cli(*(a.format(cap=capture, out=out) for a in verb))
    assert r.returncode == 2
    assert one_error_line(r) == (f"pasta-trace: error: refusing {out}: {out} is a symbolic link owned by uid "
                                 f"{user.uid} (as root only root's links are followed: give the path it points to)")
    assert_victim_untouched(base)


def test_files_written_under_sudo_belong_to_the_user_and_only_they_read_them(user, base, capture):
    os.chown(base, user.uid, user.gid)  # the user's own directory, as under sudo in $HOME
    r = cli("report", str(capture), "--html", str(base / "r.html"), env=user.sudo_env)
    assert r.returncode == 0, r.stderr
    r = cli("merge", str(capture), "-o", str(base / "t.parquet"), env=user.sudo_env)
    assert r.returncode == 0, r.stderr
    st = (base / "r.html").stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (user.uid, user.gid, 0o600)
    owners = {p.stat().st_uid for p in [base / "t.parquet", *(base / "t.parquet").rglob("*")]}
    assert owners == {user.uid}
    assert stat.S_IMODE((base / "t.parquet").stat().st_mode) == 0o700
    assert sorted(p.name for p in base.iterdir()) == ["r.html", "rootonly", "t.parquet"]  # no temporaries left
