"""The CUPTI collector in a running process: `pasta-trace -p PID --device cupti`.

At the attach, in each traced process: dlopen of libgpu_probes_cupti.so
(once: a later capture finds it loaded) and ``gp_cupti_attach_start(path,
&result)``, which enables kernel, memcpy and memset activity records into
``path`` from then on; at the end ``gp_cupti_attach_stop(&result)``, which
flushes and disables them and closes the file, leaving the library loaded
and inert.  Each call is a remote call (remote.py) on one thread; the others
run on.  ``result`` is gpu_probes/host/cupti_inject.cpp's AttachResult.

    dev = AttachedDevice(out, pids, say=print)    # refusals (exit 2 or 77) before anything is loaded
    dev.start(warn)                               # after the probes are attached
    dev.seen(events)                              # each drain's events: the late injections
    files = dev.finish()                          # stop in each process, files into capture_dir/device/

A process that has not loaded libcuda yet at the attach gets its collector
later, at the first driver call the probes see from it (``seen``, called
with each drain's events, in the drain loop's thread), never inside the
late-load stop at its open of libcuda: there the thread that opens it is
inside dlopen, holding the loader's lock, with the whole process stopped, and
the collector's own dlopen would wait for that lock forever.  A driver call
seen by a uprobe of libcuda means its dlopen has returned (its relocations and
constructors are done, and CUPTI finds a usable driver); the maps alone would
say only that libcuda is mapped, which it is from inside that dlopen on.  The
call may be seen a drain (5-20 ms) after it is made: the records from the
injection on are the ones kept, as for a process attached mid-run.  Under
``--aggregate`` no events are drained, so there the process must have loaded
libcuda at the attach.  A process that never makes a driver call gets a note
in the manifest instead of a device file.
"""

from __future__ import annotations

import os
import signal
import struct
from pathlib import Path
from typing import Callable

import numpy as np

from ...capture.procs import reach
from ...errors import PastaError, UsageError
from ...probes import catalog
from ...probes.elf import exported_symbols
from ...safe_output import OutputDir, invoking_user
from ..inject import DEFAULT_MANIFEST, DeviceSession, built_artefacts
from ..writer import device_file_name
from . import target as tg
from .remote import HeldThread, RemoteCallError, Step

RTLD_NOW = 2
#: struct AttachResult: int32 rc, uint32 started, char message[240]
RESULT = struct.Struct("<iI240s")
OK, BUSY, NO_FILE, NO_CUPTI, NOT_STARTED = 0, 1, 2, 3, 4
START, STOP = "gp_cupti_attach_start", "gp_cupti_attach_stop"


class AttachRefused(UsageError):
    pass


def collector_library(manifest: Path = DEFAULT_MANIFEST) -> Path:
    v = built_artefacts(manifest).get("cupti")
    if not isinstance(v, str) or not Path(v).is_file():
        raise PastaError("CUPTI injection library not built: run scripts/build_gpu_probes.sh")
    return Path(v)


def has_libcuda(mapped: list[tg.Mapping]) -> bool:
    return any(os.path.basename(m.path).startswith("libcuda.so") for m in mapped)


#: the probe catalog's ids of libcuda's calls (the events' ``api``)
DRIVER_APIS = np.array([i for i, a in enumerate(catalog.APIS) if a.family == "cuda"], dtype=np.uint16)


def _not_loaded_under_aggregate(pid: int) -> UsageError:
    return UsageError(f"PID {pid} has not loaded libcuda yet: with --aggregate, --device cupti -p needs a process "
                      "that has (its first driver call is seen in the events, which --aggregate does not read): "
                      "leave out --aggregate")


def check_aggregate(pids: list[int]) -> None:
    """--aggregate reads no events, so a process without libcuda would never
    get its collector: refused before anything is loaded or written."""
    for pid in pids:
        try:
            mapped = tg.maps(pid)
        except OSError:
            continue  # gone, or not readable: the attach says so in its own words
        if not has_libcuda(mapped):
            raise _not_loaded_under_aggregate(pid)


def preflight(pid: int, uid: int | None, *, late: bool = False) -> tg.Libc:
    """Every refusal that needs no stop: raises PastaError (exit 2 or 77).
    ``late``: a process without libcuda is not refused (its collector comes
    at its first driver call)."""
    if (why := reach.refusal(pid, uid)) is not None:
        raise why
    if (why := tg.refusal(pid)) is not None:
        raise why
    mapped = tg.maps(pid)
    if not late and not has_libcuda(mapped):
        raise UsageError(f"PID {pid} has not loaded libcuda yet: --device cupti -p attaches to a process that "
                         "has (run pasta-trace after its first CUDA call, or launch it with --device cupti -- CMD)")
    return tg.find_libc(pid, mapped)


def _library_base(pid: int, lib: Path) -> int | None:
    st = os.stat(lib)
    for m in tg.maps(pid):
        if m.offset == 0 and m.inode == st.st_ino and os.path.basename(m.path) == lib.name:
            return m.start
    return None


def _result(data: bytes) -> tuple[int, int, str]:
    rc, started, msg = RESULT.unpack_from(data)
    return rc, started, msg.split(b"\0", 1)[0].decode(errors="replace")


def call_collector(pid: int, lib: Path, entry: str, out_path: str | None, *, uid: int | None = None,
                   libc: tg.Libc | None = None, step: Step | None = None,
                   on_signal: Callable[[int], bool] | None = None) -> tuple[int, str]:
    """Load the collector into ``pid`` if it is not, and call ``entry`` there:
    (rc, message) of cupti_inject.cpp's AttachResult.  Raises PastaError when
    the call cannot be made (nothing is left changed or stopped)."""
    libc = libc or preflight(pid, uid)
    held = HeldThread(pid, libc, step=step, on_signal=on_signal)
    try:
        held.stop()
        if reach.foreign(pid, uid):  # it became another user's meanwhile (a setuid exec)
            raise reach.refusal(pid, uid) or PastaError(f"PID {pid} changed owner")
        base = _library_base(pid, lib)
        if base is None:
            if entry == STOP:
                return NOT_STARTED, "the collector is not loaded"
            held.call(libc.dlopen, (0, RTLD_NOW), os.fsencode(lib) + b"\0", data_args=(0,))
            base = _library_base(pid, lib)
            if base is None:
                raise PastaError(f"PID {pid} could not load {lib} (dlopen failed; is libcupti where its RUNPATH says?)")
        func = base + exported_symbols(str(lib))[entry].vaddr
        data = bytes(RESULT.size) + (os.fsencode(out_path) + b"\0" if out_path else b"")
        args = (RESULT.size, 0) if out_path else (0,)
        got = held.call(func, args, data, data_args=tuple(range(len(args))))
        rc, _, msg = _result(got.data)
        return rc, msg
    except RemoteCallError as e:
        raise PastaError(f"--device cupti -p: {e}") from None
    finally:
        held.release()


class AttachedDevice(DeviceSession):
    """The CUPTI collector of a -p capture: started in each process at the
    attach (or, in one that had not loaded libcuda, at its first driver call),
    stopped at the end; its files are collected as a launched command's
    (DeviceSession.finish)."""

    def __init__(self, out: OutputDir, pids: list[int], *, manifest: Path | None = None,
                 say: Callable[[str], None] = print, late: bool = True) -> None:
        self.backend, self.out, self.command = "cupti", out, None
        self.say = say
        self.lib = collector_library(manifest or DEFAULT_MANIFEST)
        self.uid = reach.traced_uid()
        self.libcs = {pid: preflight(pid, self.uid, late=True) for pid in pids}
        #: processes without libcuda at the attach: their collector waits for their first driver call
        self.pending = [pid for pid in pids if not has_libcuda(tg.maps(pid))]
        if self.pending and not late:
            raise _not_loaded_under_aggregate(self.pending[0])
        owner = invoking_user()
        if owner is None and pids:  # root's own capture: the process writes as its own user
            st = os.stat(f"/proc/{pids[0]}")
            owner = (st.st_uid, st.st_gid)
        self.staging, self._staging_fd = out.staging(owner)
        self.started: list[int] = []
        self._on_signal: Callable[[int], bool] | None = None
        self._poll: Callable[[], int] | None = None
        self._warn: Callable[[str], None] = lambda msg: self.say(f"warning: {msg}")

    def env(self) -> dict[str, str]:
        return {}

    def start(self, warn: Callable[[str], None], poll: Callable[[], int] | None = None) -> None:
        """Start recording in every process that has loaded libcuda; CUPTI unable to run there
        (no GPU) is a warning.  ``poll`` handles the capture's own stops at a library load
        (Session.poll): the collector's libraries are probed and the process resumed as any
        library's."""
        self._warn = warn
        if poll is not None:
            self._poll = poll

            def late_load_stop(sig: int) -> bool:
                if sig != signal.SIGSTOP:
                    return False
                try:
                    return poll() > 0
                except Exception:  # noqa: BLE001 - the watcher closed (the capture's end): deliver it
                    return False

            self._on_signal = late_load_stop
        for pid in self.libcs:
            if pid in self.pending:
                self.say(f"PID {pid} has not loaded libcuda yet: its CUPTI collector is loaded at its first "
                         "driver call")
            else:
                self._start_one(pid)

    def seen(self, recs: np.ndarray) -> None:
        """The events of one drain: a waiting process with a driver call among them gets its collector now."""
        if not self.pending or not recs.size:
            return
        calls = recs["pid"][np.isin(recs["api"], DRIVER_APIS)]
        ready = [pid for pid in self.pending if (calls == pid).any()]
        if not ready:
            return
        if self._poll is not None:
            try:
                self._poll()  # first, resume whatever the capture holds stopped at a library load
            except Exception:  # noqa: BLE001 - the watcher closed (the capture's end): nothing is held
                pass
        for pid in ready:
            self.pending.remove(pid)
            try:
                self._start_one(pid, late=True)
            except PastaError as e:  # the capture goes on without it
                self._warn(f"no device timeline for PID {pid}: {e}")

    def _start_one(self, pid: int, *, late: bool = False) -> None:
        if not os.path.isdir(f"/proc/{pid}"):
            self._warn(f"no device timeline for PID {pid}: it exited before its collector was started")
            return
        path = str(self.staging / device_file_name(pid, "cupti"))
        rc, msg = call_collector(pid, self.lib, START, path, uid=self.uid, libc=self.libcs[pid],
                                 on_signal=self._on_signal)
        if rc == OK:
            self.started.append(pid)
            when = "from its first driver call on" if late else "from now on"
            self.say(f"Recording kernel, memcpy and memset activity of PID {pid} {when} (CUPTI)")
        elif rc == NO_CUPTI:
            self._warn(f"no device timeline for PID {pid}: {msg} (no GPU, or a driver CUPTI cannot use)")
        else:
            self._warn(f"no device timeline for PID {pid}: {msg}")

    def finish(self) -> list[Path]:
        for pid in self.pending:
            self._warn(f"the device collector was never injected: PID {pid} never loaded libcuda"
                       if not _maps_libcuda(pid) else
                       f"the device collector was never injected: PID {pid} loaded libcuda but made no "
                       "driver call that the probes saw")
        self.pending = []
        for pid in self.started:
            try:
                rc, msg = call_collector(pid, self.lib, STOP, None, uid=self.uid, libc=self.libcs[pid],
                                         on_signal=self._on_signal)
            except PastaError as e:
                self.say(f"warning: PID {pid}: the CUPTI collector was not stopped: {e}")
                continue
            if rc != OK:
                self.say(f"warning: PID {pid}: the CUPTI collector was not stopped: {msg}")
        self.started = []
        return super().finish()


def _maps_libcuda(pid: int) -> bool:
    """Whether ``pid`` has libcuda mapped now (False once it has exited: it never called it while traced)."""
    try:
        return has_libcuda(tg.maps(pid))
    except OSError:
        return False
