"""Files another user can make the tracer read during `-a`, and an
executable it launches: none stalls or ends the capture.

Another (real) user opens, under the name `libcuda.so.1`, a FIFO (with
O_RDONLY|O_NONBLOCK, as the report had it), a character device, a copy of
the stub library whose .dynsym claims 5 million symbols in a sparse file, one
whose .dynsym runs past its end, and runs an executable whose .symtab is a
PROGBITS section.  Each opener times its own open (the stop the tracer puts
it in lies inside it): under a second.  The capture completes, its manifest
names each file and what was wrong, and the tracer's peak RSS is measured."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import hostile_files as hf
from pasta_trace.read import open_capture
from users import temporary_user, unavailable

pytestmark = [pytest.mark.live, pytest.mark.usefixtures("require_bpf")]

PYTHON = "/usr/bin/python3"  # the system interpreter: one another user can run
#: the opener: times its own open of argv[1] (flags argv[2]) with its own clock, prints the seconds
OPENER = ("import os, sys, time\n"
          "flags = {'rd': os.O_RDONLY, 'nb': os.O_RDONLY | os.O_NONBLOCK}[sys.argv[2]]\n"
          "t = time.monotonic()\n"
          "fd = os.open(sys.argv[1], flags)\n"
          "print(time.monotonic() - t)\n"
          "os.close(fd)\n")
MAX_STOP_S = 1.0


class PeakRss:
    """The VmHWM of a running process, sampled until it exits (the last sample before its exit)."""

    def __init__(self, pid: int):
        self.pid, self.peak_kib, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status = Path(f"/proc/{self.pid}/status").read_text()
            except OSError:
                return
            for line in status.splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_kib = max(self.peak_kib, int(line.split()[1]))
            time.sleep(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak_kib


@pytest.fixture
def user():
    why = unavailable()
    if why:
        pytest.skip(why)
    with temporary_user() as u:
        yield u


@pytest.fixture
def zoo(families):
    """A directory the other user can reach, one hostile `libcuda.so.1` per subdirectory."""
    d = Path(tempfile.mkdtemp(prefix="pasta-hostile-"))
    d.chmod(0o755)
    stub = families[0].stub
    files = {
        "fifo": d / "fifo" / "libcuda.so.1",
        "device": d / "device" / "libcuda.so.1",
        "sparse": hf.sparse_table(stub, d / "sparse" / "libcuda.so.1", 5_000_000),
        "past_end": hf.table_past_end(stub, d / "past_end" / "libcuda.so.1"),
    }
    files["device"].parent.mkdir()
    os.mknod(files["device"], 0o644 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
    src = d / "prog.c"
    src.write_text("#include <unistd.h>\nstatic int helper(int x) { return x + 1; }\n"
                   "int main(void) { usleep(200000); return helper(-1); }\n")
    prog = d / "prog"
    subprocess.run(["cc", "-O1", "-o", str(prog), str(src)], check=True)
    files["wrong_symtab"] = hf.wrong_type_symtab(prog, d / "wrong_symtab" / "prog")
    files["wrong_symtab"].chmod(0o755)
    for p in d.rglob("*"):
        if p.is_dir():
            p.chmod(0o755)
    yield d, files
    shutil.rmtree(d, ignore_errors=True)


def _as(user, argv: list[str], **kw) -> subprocess.Popen:
    return subprocess.Popen(argv, user=user.uid, group=user.gid, extra_groups=[], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/", **kw)


@pytest.mark.machine_wide
def test_hostile_files_during_system_wide_capture(zoo, user, tmp_path, tracer):
    d, files = zoo
    files["fifo"].parent.mkdir()
    files["fifo"].parent.chmod(0o755)
    # the user makes the FIFO: their own file, in their own directory
    os.chown(files["fifo"].parent, user.uid, user.gid)
    subprocess.run(["mkfifo", "-m", "0644", str(files["fifo"])], user=user.uid, group=user.gid, extra_groups=[],
                   check=True)
    t = tracer(["-a", "-o", str(tmp_path / "cap")])
    t.wait_ready(timeout=120)
    rss = PeakRss(t.proc.pid)
    openers = {
        "fifo": _as(user, [PYTHON, "-c", OPENER, str(files["fifo"]), "nb"]),
        "device": _as(user, [PYTHON, "-c", OPENER, str(files["device"]), "rd"]),
        "sparse": _as(user, [PYTHON, "-c", OPENER, str(files["sparse"]), "rd"]),
        "past_end": _as(user, [PYTHON, "-c", OPENER, str(files["past_end"]), "rd"]),
    }
    took = {}
    for name, p in openers.items():
        out, err = p.communicate(timeout=30)
        assert p.returncode == 0, (name, err)
        took[name] = float(out)
    ran = _as(user, [str(files["wrong_symtab"])])
    ran.communicate(timeout=30)
    assert ran.returncode == 0
    time.sleep(0.5)  # the exec notification is handled
    assert t.stop(timeout=120) == 0, t.stderr()
    peak_mib = rss.stop() / 1024
    print(f"opens, each timed by its opener: {json.dumps({k: round(v, 4) for k, v in took.items()})}; "
          f"tracer peak RSS {peak_mib:.0f} MiB")
    assert {k: v < MAX_STOP_S for k, v in took.items()} == {k: True for k in took}
    cap = open_capture(tmp_path / "cap")
    assert cap.complete, cap.problems
    notes = cap.manifest["notes"]
    reasons = {
        "fifo": "not a regular file",
        "device": "not a regular file",
        "sparse": ".dynsym is 120000000 bytes, more than the 64 MiB read of one",
        "past_end": "runs past the end of the file",
        "wrong_symtab": "skipped: .symtab is a SHT_PROGBITS section, not a symbol table",
    }
    for name, why in reasons.items():
        named = [n for n in notes if n.startswith(f"{files[name]}: ") and why in n]
        assert len(named) == 1, (name, why)
    assert peak_mib < 1024


def test_launched_executable_with_a_symtab_of_the_wrong_type(zoo, tmp_path, tracer):
    """As the launched command it once deadlocked on its own exec stop; now it runs, and the capture completes."""
    _, files = zoo
    start = time.monotonic()
    t = tracer(["-o", str(tmp_path / "cap"), "--", str(files["wrong_symtab"])])
    assert t.finish(timeout=120) == 0, t.stderr()
    cap = open_capture(tmp_path / "cap")
    assert cap.complete, cap.problems
    assert cap.manifest["launched"]["exit_code"] == 0
    print(f"launched run: {time.monotonic() - start:.1f} s")
