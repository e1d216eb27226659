"""Each user error of `pasta-trace record`: the real CLI in a subprocess, one
line on stderr, the documented exit code (0 ok, 1 runtime, 2 usage, 77 no
privileges), and the cases that are not errors at all."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from cli_run import ROOT, cli, one_error_line  # tests/fixtures/cli_run.py
from pasta_trace.capture.session import checks
from pasta_trace.device.inject import DEFAULT_MANIFEST, built_artefacts

NOBODY = 65534


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root (runs the tracer, drops privileges itself)"
    try:
        import bcc  # noqa: F401
    except ImportError:
        return "BCC (python3-bpfcc) is not importable"
    if shutil.which("setpriv") is None:
        return "setpriv (util-linux) is missing"
    return None


pytestmark = [pytest.mark.live, pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]


def test_not_root_is_exit_77_with_the_command_to_run_and_the_capabilities(sleeper, tmp_path):
    args = ["-p", str(sleeper.pid), "-o", str(tmp_path / "cap")]
    r = cli(*args, prefix=("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"))
    assert r.returncode == 77
    # sudo would not find a venv's pasta-trace (nor this python): the hint names what to run, by path
    rerun = checks.rerun_as_root([str(ROOT / "pasta_trace" / "cli.py"), *args])
    assert rerun.endswith(f"{sys.executable} -m pasta_trace.cli {' '.join(args)}")
    assert one_error_line(r) == ("pasta-trace: error: tracing needs CAP_BPF and CAP_PERFMON (not root) "
                                 f"(run it as root: `{rerun}`, or grant CAP_BPF and CAP_PERFMON)")
    assert not (tmp_path / "cap").exists()


def test_root_without_capabilities_is_exit_77_naming_them(sleeper, tmp_path):
    r = cli("-p", str(sleeper.pid), "-o", str(tmp_path / "cap"),
            prefix=("setpriv", "--inh-caps=-all", "--bounding-set=-all"))
    assert r.returncode == 77
    assert "tracing needs CAP_BPF and CAP_PERFMON (root without the needed capabilities)" in one_error_line(r)


def test_no_such_pid_is_exit_1(tmp_path):
    gone = subprocess.Popen(["true"])
    gone.wait()  # a PID that existed a moment ago and does not now
    r = cli("-p", str(gone.pid), "-o", str(tmp_path / "cap"))
    assert r.returncode == 1
    assert one_error_line(r) == f"pasta-trace: error: no such process: {gone.pid}"


def test_existing_output_directory_is_usage_error_2_and_force_overwrites(tmp_path, sleeper):
    out = tmp_path / "cap"
    out.mkdir()
    (out / "events-00000.parquet").write_bytes(b"old")
    (out / "mine.txt").write_text("keep")
    r = cli("-p", str(sleeper.pid), "-o", str(out))
    assert r.returncode == 2
    assert one_error_line(r) == (f"pasta-trace: error: output directory {out} already exists "
                                 "(use --force to overwrite it)")
    r = cli("-p", str(sleeper.pid), "-o", str(out), "-d", "1", "--force")
    assert r.returncode == 0, r.stderr
    assert (out / "mine.txt").read_text() == "keep"  # --force removes capture files only
    assert not (out / "events-00000.parquet").exists()  # the old file; the idle process made no events
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_no_mode_is_usage_error_2():
    r = cli("-d", "1")
    assert r.returncode == 2
    assert one_error_line(r) == "pasta-trace: error: say what to trace: exactly one of -p PID, -a, or -- CMD ARGS"


def test_kernel_without_uprobes_is_exit_1(tmp_path, sleeper):
    # The only way to show this message on a kernel that has uprobes: point the
    # check at an empty sysfs (PASTA_TRACE_SYSFS_ROOT exists for this test).
    fake = tmp_path / "sys"
    fake.mkdir()
    r = cli("-p", str(sleeper.pid), "-o", str(tmp_path / "cap"), env={"PASTA_TRACE_SYSFS_ROOT": str(fake)})
    assert r.returncode == 1
    line = one_error_line(r)
    assert "the kernel has no uprobes (CONFIG_UPROBE_EVENTS)" in line
    assert "CONFIG_UPROBE_EVENTS" in line


def test_bcc_missing_says_how_to_install_it(tmp_path, sleeper):
    # a real Python without Debian's dist-packages: a venv without system site
    # packages that sees only our venv's packages and the source tree
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3*/site-packages"))
    ours = next((ROOT / ".venv" / "lib").glob("python3*/site-packages"), None) or Path(
        [p for p in sys.path if p.endswith("site-packages") and "dist-packages" not in p][0])
    (site / "pasta.pth").write_text(f"{ours}\n{ROOT}\n")
    check = subprocess.run([str(venv / "bin/python"), "-c", "import bcc"], capture_output=True)
    assert check.returncode != 0  # the premise: bcc really is absent
    r = cli("-p", str(sleeper.pid), "-o", str(tmp_path / "cap"), python=str(venv / "bin/python"))
    assert r.returncode == 1
    line = one_error_line(r)
    assert "BCC is not available" in line
    assert "apt-get install python3-bpfcc" in line


def _maps_gpu_runtime(tmp_path: Path) -> subprocess.Popen:
    """A process that maps a library named libcublas.so.12 (a renamed libz)
    and none that is traced: like a CUDA program before it loads the runtime."""
    libz = next(Path(p) for p in ("/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1")
                if Path(p).exists())
    fake = tmp_path / "libcublas.so.12"
    shutil.copy(libz, fake)
    p = subprocess.Popen([sys.executable, "-c", f"import ctypes, time; ctypes.CDLL({str(fake)!r}); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_pid_without_either_library_is_not_an_error_it_waits(tmp_path):
    proc = _maps_gpu_runtime(tmp_path)
    try:
        out = tmp_path / "cap"
        r = cli("-p", str(proc.pid), "-o", str(out), "-d", "2")
    finally:
        proc.kill()
        proc.wait()
    assert r.returncode == 0, r.stderr
    assert (f"PID {proc.pid} has not loaded libcuda.so, libcudart.so, libamdhip64.so, libc10.so or libnccl.so yet "
            "(it maps libcublas.so.12): waiting for it to load one; its first call will be traced") in r.stderr
    assert f"Wrote {out}" in r.stderr
    assert r.stdout == ""  # messages on stderr only
    m = json.loads((out / "manifest.json").read_text())
    assert m["complete"] is True and m["pids"] == [proc.pid] and m["counts"]["events"] == 0


def test_traced_process_exiting_mid_trace_is_recorded_not_an_error(tmp_path):
    # a rank of a distributed job, as torchrun starts one: processes.parquet says which
    short = subprocess.Popen(["sleep", "120"], env={**os.environ, "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4"})
    out = tmp_path / "cap"
    tracer = subprocess.Popen([sys.executable, "-m", "pasta_trace.cli", "-p", str(short.pid), "-o", str(out),
                               "-d", "100"], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                              stderr=subprocess.PIPE, text=True)
    try:
        lines = []
        while not any(line.startswith("Tracing ") for line in lines):
            lines.append(tracer.stderr.readline())
            assert lines[-1], "the tracer ended before its banner: " + "".join(lines)
        t0 = time.monotonic()
        short.terminate()
        short.wait()
        _, rest = tracer.communicate(timeout=60)
    finally:
        short.kill()
        tracer.kill()
    stderr = "".join(lines) + rest
    assert tracer.returncode == 0, stderr
    assert time.monotonic() - t0 < 30  # it stopped on the exit, not at the duration
    assert f"PID {short.pid} exited\n" in stderr
    assert "all traced processes exited\n" in stderr
    procs = pl.read_parquet(out / "processes.parquet")
    row = procs.filter(pl.col("pid") == short.pid).row(0, named=True)
    assert row["comm"] == "sleep" and row["exit_ns"] is not None and row["exit_ns"] > row["start_ns"]
    assert (row["rank"], row["local_rank"], row["world_size"]) == (2, 0, 4)
    assert json.loads((out / "manifest.json").read_text())["complete"] is True


def test_device_without_a_command_is_usage_error_2(sleeper):
    """Only CUPTI attaches to a running process (docs/device.md, "Attaching to a running process")."""
    r = cli("-p", str(sleeper.pid), "--device", "sanitizer")
    assert r.returncode == 2
    assert one_error_line(r) == ("pasta-trace: error: --device sanitizer needs a launched command (-- CMD ARGS): "
                                 "only cupti attaches to a running process (-p)")


def test_print_bpf_and_dry_run_need_no_root(tmp_path):
    as_nobody = ("setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups")
    r = cli("--print-bpf", "-a", prefix=as_nobody)
    assert r.returncode == 0, r.stderr
    assert "RAW_TRACEPOINT_PROBE(sys_enter)" in r.stdout and "BPF_RINGBUF_OUTPUT(events" in r.stdout
    assert "#define PT_DISCOVER_FILTER 0" in r.stdout
    mine = subprocess.Popen(["sleep", "30"], user=NOBODY, group=NOBODY)
    try:
        r = cli("--dry-run", "-p", str(mine.pid), prefix=as_nobody)
    finally:
        mine.kill()
        mine.wait()
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0] == (f"PID {mine.pid}: no libcuda/libcudart/libamdhip64/libc10/libnccl mapped yet "
                                        "(no GPU library); would wait for one")


def test_launch_under_sudo_runs_as_the_invoking_user_who_owns_the_files(tmp_path):
    # under sudo the capture goes where the user may write: a directory of theirs
    # (pytest's tmp_path is root's 0700)
    import tempfile

    theirs = Path(tempfile.mkdtemp(prefix="pasta-nobody-"))
    theirs.chmod(0o755)
    os.chown(theirs, NOBODY, NOBODY)
    try:
        _launch_under_sudo(theirs / "cap")
    finally:
        shutil.rmtree(theirs)


def _launch_under_sudo(out: Path) -> None:
    r = cli("-o", str(out), "--", "sh", "-c", "id -u; id -g; exit 3",
            env={"SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY)})
    assert r.returncode == 0, r.stderr  # the capture succeeded; the command's code is reported
    assert r.stdout.splitlines() == [str(NOBODY), str(NOBODY)]  # the command's own output
    assert "sh -c id -u; id -g; exit 3 exited with code 3" in r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert m["mode"] == "launch" and m["launched"]["exit_code"] == 3 and m["complete"] is True
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [out, *out.iterdir()]}
    assert owners == {(NOBODY, NOBODY)}


@pytest.mark.skipif(not (built_artefacts(DEFAULT_MANIFEST).get("sanitizer") or ""),
                    reason="the sanitizer backend is not built (scripts/build_gpu_probes.sh)")
def test_start_and_end_say_what_happens_and_an_empty_device_backend_says_so(tmp_path):
    out = tmp_path / "cap"
    r = cli("-o", str(out), "--device", "sanitizer", "--", "true")
    assert r.returncode == 0, r.stderr
    m = json.loads((out / "manifest.json").read_text())
    assert (m["device"], m["device_files"]) == ("sanitizer", [])
    probed = [lib for lib in m["libraries"] if lib["symbols_attached"]]
    functions = sum(len(lib["symbols_attached"]) for lib in probed)
    ready = (f"{functions} functions ready in {len(probed)} librar{'y' if len(probed) == 1 else 'ies'}" if probed
             else "no libcuda/libcudart/libamdhip64/libc10/libnccl found yet: attaching when it loads one")
    lines = r.stderr.splitlines()
    expected = [
        "compiling the BPF program...",
        f"attaching probes to {len(m['libraries'])} librar{'y' if len(m['libraries']) == 1 else 'ies'} "
        "the command can load...",
        f"Tracing command true (PID {m['launched']['pid']}): {ready}... Ctrl-C to end.",
        "writing 0 events, the names and the process table...",
        f"removing {functions} probes...",
        "device (--device sanitizer): nothing recorded (the command made no GPU work the backend saw, "
        "or the backend did not load in it)",
        f"Wrote {out}",
    ]
    assert [line for line in lines if line in expected] == expected, r.stderr
    r = cli("report", str(out), "--tool", "kernels")
    assert r.returncode == 0, r.stderr
    assert " device data  none: --device sanitizer recorded nothing\n" in r.stdout
