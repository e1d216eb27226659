"""Usage errors of the CLI, through pasta_trace.cli.main: one line on stderr
with the fix, the documented exit code, and nothing loaded, started or
written first."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pasta_trace import cli
from pasta_trace.capture.session import checks, session
from pasta_trace.capture.session.options import MAX_RING_PAGES
from pasta_trace.commands import doctor
from pasta_trace.errors import EXIT_NOPERM, EXIT_RUNTIME, EXIT_USAGE
from test_tools_capture import write_capture

ROOT = Path(__file__).resolve().parents[2]
NOBODY = 65534


def run(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert out == ""
    return rc, err


def error(text: str) -> str:
    return f"pasta-trace: error: {text}\n"


def _bcc_importable() -> bool:
    try:
        import bcc  # noqa: F401
    except ImportError:
        return False
    return True


needs_bcc = pytest.mark.skipif(not _bcc_importable(), reason="BCC (python3-bpfcc) is not importable")


# ---------------------------------------------------------------- verbs


def test_a_typo_of_a_verb_is_a_usage_error_with_a_suggestion(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "reprot", "cap/") == (
        EXIT_USAGE, error("unknown verb 'reprot' (did you mean `pasta-trace report cap/`?)"))
    assert list(tmp_path.iterdir()) == []  # no capture directory: nothing was launched


def test_a_word_that_is_no_verb_says_how_to_launch_a_command(capsys) -> None:
    assert run(capsys, "python", "train.py") == (EXIT_USAGE, error(
        "unknown verb 'python' (verbs: record, top, daemon, dump, doctor, merge, report, export; "
        "to launch a command: `pasta-trace -- python train.py`)"))


def test_a_first_flag_still_means_record(capsys) -> None:
    assert run(capsys, "-d", "1") == (
        EXIT_USAGE, error("say what to trace: exactly one of -p PID, -a, or -- CMD ARGS"))


def test_argparse_errors_are_one_line_pointing_at_the_verbs_help(capsys) -> None:
    assert run(capsys, "report") == (
        EXIT_USAGE, error("the following arguments are required: PATH (see `pasta-trace report --help`)"))
    assert run(capsys, "--bogus", "-p", "1") == (
        EXIT_USAGE, error("unrecognized arguments: --bogus (see `pasta-trace record --help`)"))
    assert run(capsys, "-p") == (
        EXIT_USAGE, error("argument -p/--pid: expected one argument (see `pasta-trace record --help`)"))


# ---------------------------------------------------------------- flag values


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--buffer-pages", "1000", "1000 is not a power of two: try 1024"),
    ("--buffer-pages", "0", "0 pages: give at least 1 (a power of two): try 4096"),
    ("--buffer-pages", "8589934592",
     f"8589934592 pages is more than a BPF ring buffer can hold (2 GiB): try {MAX_RING_PAGES}"),
    ("--stack-buffer-pages", str(2 * MAX_RING_PAGES),
     f"{2 * MAX_RING_PAGES} pages is more than a BPF ring buffer can hold (2 GiB): try {MAX_RING_PAGES}"),
    ("--buffer-pages", "lots", "not a number of pages: 'lots': try 4096"),
    ("-d", "nan", "nan is not a positive finite number of seconds: try 10"),
    ("-d", "inf", "inf is not a positive finite number of seconds: try 10"),
    ("-d", "0", "0 is not a positive finite number of seconds: try 10"),
    ("--stack-depth", "0", "0 is not in 1..256: try 1"),
])
def test_bad_flag_values_are_one_line_with_the_fix(capsys, flag: str, value: str, message: str) -> None:
    name = {"-d": "-d/--duration"}.get(flag, flag)
    assert run(capsys, "-p", "1", flag, value) == (EXIT_USAGE, error(f"argument {name}: {message}"))


def test_the_largest_ring_is_2_gib() -> None:
    assert MAX_RING_PAGES * os.sysconf("SC_PAGE_SIZE") == 1 << 31


def test_top_interval_nan_is_a_usage_error(capsys) -> None:
    assert run(capsys, "top", "-i", "nan") == (
        EXIT_USAGE, error("argument -i/--interval: nan is not a positive finite number of seconds: try 10"))


# ---------------------------------------------------------------- what to trace


def _kernel_thread() -> tuple[int, str]:
    for entry in sorted(Path("/proc").iterdir(), key=lambda p: (len(p.name), p.name)):
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[6]) & 0x00200000:
                return int(entry.name), stat[stat.find("(") + 1:stat.rfind(")")]
    pytest.skip("no kernel thread visible in this PID namespace")


def test_a_kernel_thread_is_refused_with_the_reason(capsys, tmp_path) -> None:
    pid, comm = _kernel_thread()
    line = error(f"{comm} (PID {pid}) is a kernel thread: it has no user memory to trace "
                 "(give the PID of a program, e.g. from `pgrep -f NAME`)")
    assert run(capsys, "-p", str(pid), "-o", str(tmp_path / "cap")) == (EXIT_USAGE, line)
    assert run(capsys, "--dry-run", "-p", str(pid)) == (EXIT_USAGE, line)
    assert not (tmp_path / "cap").exists()


def _sh(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=60)


def _as(prefix: list[str], *args: str) -> subprocess.CompletedProcess:
    """The CLI run under `prefix` (setpriv, unshare)."""
    return _sh([*prefix, sys.executable, "-m", "pasta_trace.cli", *args])


needs_setpriv = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                   reason="needs root and setpriv (util-linux) to run as another user")


@needs_setpriv
def test_a_process_of_another_user_says_whose_it_is_and_what_to_run(tmp_path) -> None:
    mine = subprocess.Popen(["sleep", "60"])  # root's, read by nobody
    try:
        r = _as(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"],
                "--dry-run", "-p", str(mine.pid))
    finally:
        mine.kill()
        mine.wait()
    rerun = checks.rerun_as_root([str(ROOT / "pasta_trace" / "cli.py"), "--dry-run", "-p", str(mine.pid)])
    assert (r.returncode, r.stdout) == (EXIT_NOPERM, "")
    assert r.stderr == error(f"cannot read the memory map of sleep (PID {mine.pid}): Permission denied: it runs "
                             f"as uid 0, not as you (uid {NOBODY}) (run it as root: `{rerun}`)")


_NOT_DUMPABLE = ("import ctypes, time; ctypes.CDLL(None).prctl(4, 0, 0, 0, 0); print('ready', flush=True); "
                 "time.sleep(60)")


@needs_setpriv
@needs_bcc
def test_root_without_cap_sys_ptrace_says_which_rule_denies_it(tmp_path) -> None:
    """Root with CAP_BPF/CAP_PERFMON but not CAP_SYS_PTRACE (a container's
    default): -p fails before anything is loaded, saying why."""
    no_ptrace = ["setpriv", "--inh-caps=-sys_ptrace", "--bounding-set=-sys_ptrace"]
    targets = {
        # root's, with every capability: more than a tracer without CAP_SYS_PTRACE holds
        "it holds capabilities this process lacks": subprocess.Popen(
            [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
            stdout=subprocess.PIPE, text=True),
        # root's, without capabilities, but not dumpable
        "it is not dumpable (a setuid program, or it called prctl(PR_SET_DUMPABLE, 0))": subprocess.Popen(
            ["setpriv", "--inh-caps=-all", "--bounding-set=-all", sys.executable, "-c", _NOT_DUMPABLE],
            stdout=subprocess.PIPE, text=True),
    }
    try:
        for why, proc in targets.items():
            assert proc.stdout.readline().strip() == "ready"
            probe = subprocess.run([*no_ptrace, "head", "-c1", f"/proc/{proc.pid}/maps"], capture_output=True)
            if probe.returncode == 0:
                pytest.skip("this kernel lets root without CAP_SYS_PTRACE read such a process's maps")
            out = tmp_path / f"cap{proc.pid}"
            r = _as(no_ptrace, "-p", str(proc.pid), "-o", str(out))
            comm = Path(f"/proc/{proc.pid}/comm").read_text().strip()
            assert (r.returncode, r.stdout) == (EXIT_NOPERM, "")
            assert r.stderr == error(
                f"cannot read the memory map of {comm} (PID {proc.pid}): Permission denied: {why}, and this "
                "process lacks CAP_SYS_PTRACE (grant CAP_SYS_PTRACE (in a container: --cap-add SYS_PTRACE))")
            assert not out.exists()
    finally:
        for proc in targets.values():
            proc.kill()
            proc.wait()


@needs_setpriv
@needs_bcc
def test_a_tracer_in_a_user_namespace_says_the_boundary_denies_it(tmp_path) -> None:
    """Root in a user namespace has every capability there, none over the
    processes outside it: -p fails before anything is loaded, saying why."""
    inside = ["unshare", "--user", "--map-root-user"]
    mine = subprocess.Popen(["sleep", "60"])
    try:
        if subprocess.run([*inside, "head", "-c1", f"/proc/{mine.pid}/maps"], capture_output=True).returncode == 0:
            pytest.skip("this kernel lets a user namespace read its parent's processes")
        out = tmp_path / "cap"
        r = _as(inside, "-p", str(mine.pid), "-o", str(out))
    finally:
        mine.kill()
        mine.wait()
    assert (r.returncode, r.stdout) == (EXIT_NOPERM, "")
    assert r.stderr == error(
        f"cannot read the memory map of sleep (PID {mine.pid}): Permission denied: a security module (AppArmor, "
        "SELinux) or a user namespace boundary denies it (look for the denial in `dmesg`; trace from the user "
        "namespace of the process or above it)")
    assert not out.exists()


@needs_setpriv
def test_a_process_hidden_by_hidepid_is_no_such_process_saying_why() -> None:
    """In a mount namespace of its own, a /proc mounted hidepid=2 hides root's
    processes from nobody: the message names the mount option."""
    mine = subprocess.Popen(["sleep", "60"])
    try:
        inner = (f"mount -t proc -o hidepid=2 proc /proc && exec setpriv --reuid={NOBODY} --regid={NOBODY} "
                 f"--clear-groups {sys.executable} -m pasta_trace.cli --dry-run -p {mine.pid}")
        r = _sh(["unshare", "-m", "--propagation", "private", "sh", "-c", inner])
    finally:
        mine.kill()
        mine.wait()
    if "unshare:" in r.stderr or "mount:" in r.stderr:
        pytest.skip(f"cannot mount a private /proc here: {r.stderr.strip()}")
    assert (r.returncode, r.stdout) == (EXIT_RUNTIME, "")
    assert r.stderr in (error(f"no such process: {mine.pid} (/proc is mounted with hidepid={value}: other users' "
                              "processes are hidden)") for value in ("invisible", "2"))


def test_a_missing_command_fails_before_the_bpf_compile(capsys, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(session, "load_program", lambda *_: pytest.fail("the BPF program was compiled"))
    out = tmp_path / "cap"
    assert run(capsys, "-o", str(out), "--", "/nonexistent/cmd") == (
        EXIT_USAGE, error("command not found: /nonexistent/cmd"))
    assert run(capsys, "-o", str(out), "--", "no-such-command-here") == (
        EXIT_USAGE, error("command not found: no-such-command-here"))
    data = tmp_path / "data.txt"
    data.write_text("not a program")
    assert run(capsys, "-o", str(out), "--", str(data)) == (
        EXIT_USAGE, error(f"cannot run {data}: not an executable file"))
    monkeypatch.chdir(tmp_path)
    assert run(capsys, "-o", str(out), "--", "data.txt") == (
        EXIT_USAGE, error("command not found: data.txt (it is not in PATH: give its path, ./data.txt)"))
    assert not out.exists()


# ---------------------------------------------------------------- the machine


@needs_bcc
def test_a_kernel_without_btf_is_refused(capsys, tmp_path, monkeypatch) -> None:
    fake = tmp_path / "sys"
    (fake / "bus/event_source/devices/uprobe").mkdir(parents=True)  # uprobes, no kernel/btf/vmlinux
    monkeypatch.setenv(checks.SYSFS_ENV, str(fake))
    out = tmp_path / "cap"
    assert run(capsys, "-p", str(os.getpid()), "-o", str(out)) == (EXIT_RUNTIME, error(
        "the kernel has no BTF (CONFIG_DEBUG_INFO_BTF): no /sys/kernel/btf/vmlinux (use a kernel built with "
        "CONFIG_BPF_SYSCALL, CONFIG_UPROBE_EVENTS and CONFIG_DEBUG_INFO_BTF (Debian's are))"))
    assert not out.exists()
    btf = next(c for c in doctor._kernel_checks() if "BTF" in c.what)
    assert btf.line() == ("FAIL kernel BTF (/sys/kernel/btf/vmlinux): the probes' task storage and struct offsets\n"
                          "     fix: a kernel with CONFIG_DEBUG_INFO_BTF=y")


def test_the_root_command_names_the_program_sudo_would_not_find(tmp_path, monkeypatch) -> None:
    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "pasta-trace").write_text("#!/bin/sh\n")
    sudo = "sudo " if shutil.which("sudo") else ""
    assert checks.rerun_as_root([str(venv_bin / "pasta-trace"), "-p", "1", "-o", "my cap"]) == (
        f"{sudo}{venv_bin}/pasta-trace -p 1 -o 'my cap'")
    monkeypatch.chdir(tmp_path)  # a relative path becomes absolute: sudo keeps the directory, not the PATH
    assert checks.rerun_as_root([".venv/bin/pasta-trace", "-a"]) == f"{sudo}{venv_bin}/pasta-trace -a"
    assert checks.rerun_as_root(["/x/pasta_trace/cli.py", "-a"]) == f"{sudo}{sys.executable} -m pasta_trace.cli -a"


@pytest.mark.skipif(os.geteuid() == 0, reason="checks the hint of a user without privileges")
def test_not_root_names_the_command_to_run(capsys, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/opt/venv/bin/pasta-trace", "-p", str(os.getpid())])
    rc, err = run(capsys, "-p", str(os.getpid()))
    assert rc == EXIT_NOPERM
    assert f"(run it as root: `{checks.rerun_as_root()}`, or grant CAP_BPF and CAP_PERFMON)\n" in err


# ---------------------------------------------------------------- outputs


def _read_only_dir(tmp_path: Path) -> Path:
    """A directory on a read-only bind mount (root only), unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount")
    src, mnt = tmp_path / "src", tmp_path / "ro"
    (src / "empty").mkdir(parents=True)
    mnt.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot bind-mount here")
    subprocess.run(["mount", "-o", "remount,ro,bind", str(mnt)], check=True)
    return mnt


@pytest.fixture
def read_only(tmp_path: Path):
    mnt = _read_only_dir(tmp_path)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_an_empty_directory_on_a_read_only_mount_is_refused_first(capsys, tmp_path, read_only) -> None:
    empty = read_only / "empty"
    cap = write_capture(tmp_path / "cap")
    line = error(f"cannot write in {empty}: Read-only file system (choose another output)")
    assert run(capsys, "export", str(cap), "--format", "csv", "-o", str(empty), "--force") == (EXIT_USAGE, line)
    if _bcc_importable():  # record refuses it before the BPF compile
        assert run(capsys, "-p", str(os.getpid()), "-o", str(empty)) == (EXIT_USAGE, line)
    assert list(empty.iterdir()) == []


def test_a_device_backend_that_recorded_nothing_says_so_in_the_report(capsys, tmp_path) -> None:
    cap = write_capture(tmp_path / "cap")
    manifest = json.loads((cap / "manifest.json").read_text())
    (cap / "manifest.json").write_text(json.dumps({**manifest, "device": "cupti", "device_files": []}))
    rc = cli.main(["report", str(cap), "--tool", "kernels"])
    out = capsys.readouterr().out
    assert rc == 0
    assert " device data  none: --device cupti recorded nothing\n" in out
    assert cli.main(["report", str(cap), "--json", "--tool", "kernels"]) == 0
    assert json.loads(capsys.readouterr().out)["capture"]["device_backend"] == "cupti"


def test_the_summary_says_what_the_device_backend_recorded() -> None:
    from pasta_trace.capture.session.summary import device_line

    assert device_line(None, []) is None
    assert device_line("sanitizer", []) == (
        "device (--device sanitizer): nothing recorded (the command made no GPU work the backend saw, "
        "or the backend did not load in it)")
    assert device_line("cupti", ["device/a.bin", "device/b.bin"]) == "device (--device cupti): 2 files in device/"


def test_no_internal_words_in_the_help_or_the_code() -> None:
    for path in [*sorted((ROOT / "pasta_trace").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md")),
                 ROOT / "README.md"]:
        text = path.read_text()
        for word in ("issue 4", "issue's", "the issue", "helper session", "coordinator"):
            assert word not in text, f"{path}: {word!r}"
