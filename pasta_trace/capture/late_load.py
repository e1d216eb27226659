"""Libraries loaded after the capture starts, traced from their first call.

bpf/discover.bpf.c stops (SIGSTOP) a traced process whose open of a
libcuda.so* / libamdhip64.so* file succeeded, before the open returns, and
reports it here.  The watcher resolves the opened file through
/proc/PID/fd/<fd>, attaches the probes if its inode is new, records the path
as known (so the next open of it does not stop anyone) and resumes the process
with SIGCONT.  The same program reports forks, execs and exits of traced
processes.

Caveat (documented in docs/host-tracing.md): a process that was already
stopped by job control when it opened the library is resumed by our SIGCONT.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import schema
from .ringbuf import RingBuffer, open_table

PATH_LEN = schema.DISCOVER_PATH_LEN
DiscoverType = schema.DiscoverType
DISCOVER_EVENT = schema.DISCOVER_EVENT


def bpf_source_path() -> Path:
    """bpf/discover.bpf.c, from a source checkout or an installed package."""
    here = Path(__file__).resolve().parent.parent
    for cand in (here.parent / "bpf" / "discover.bpf.c", here / "bpf" / "discover.bpf.c"):
        if cand.exists():
            return cand
    raise FileNotFoundError("bpf/discover.bpf.c is missing from this installation")


def discover_text(*, filter_pids: bool, own_pid_filter: bool = False) -> str:
    """The discover program's C text, to append to the probes program (which
    already includes schema.bpf_c_header() and, when filtering, pid_filter).
    ``own_pid_filter`` declares pid_filter here, for use without the probes."""
    head = [
        f"#define PT_DISCOVER_FILTER {int(filter_pids)}",
        f"#define PT_PATH_LEN {PATH_LEN}",
        *(f"#define PT_DISCOVER_{t.name} {int(t)}" for t in DiscoverType),
        DISCOVER_EVENT.c_struct(),
    ]
    if own_pid_filter:
        head.append("BPF_HASH(pid_filter, u32, u8, 65536);")
    return "\n".join(head) + "\n" + bpf_source_path().read_text()


@dataclass
class OpenedLibrary:
    pid: int
    path: str  # as the process named it in open()
    ns_path: str  # the file's path inside the process's mount namespace
    attach_path: str  # reachable from the tracer
    dev: int
    inode: int


def resolve_open(pid: int, fd: int, path: str, proc: Path = Path("/proc")) -> OpenedLibrary | None:
    """The file behind ``fd`` in the stopped process (None if it is gone)."""
    fd_link = proc / str(pid) / "fd" / str(fd)
    try:
        st = os.stat(fd_link)
        ns_path = os.readlink(fd_link)
    except OSError:
        return None
    root_path = f"{proc}/{pid}/root{ns_path}"
    try:
        same = os.stat(root_path)
        attach = root_path if (same.st_dev, same.st_ino) == (st.st_dev, st.st_ino) else str(fd_link)
    except OSError:
        attach = str(fd_link)
    return OpenedLibrary(pid, path, ns_path, attach, st.st_dev, st.st_ino)


class LateLoadWatcher:
    """Drains discover events; calls back into the session for each."""

    def __init__(
        self,
        bpf,
        *,
        on_library: Callable[[OpenedLibrary], None],
        on_fork: Callable[[int, int, int], None],
        on_exec: Callable[[int, int], None],
        on_exit: Callable[[int, int], None],
    ):
        self._bpf = bpf
        self._ring: RingBuffer | None = open_table(bpf, "discover_events", DISCOVER_EVENT.dtype)
        self._known = bpf["known_paths"]
        self.on_library, self.on_fork, self.on_exec, self.on_exit = on_library, on_fork, on_exec, on_exit
        self._cfg = bpf["discover_cfg"]
        self._cfg[self._cfg.Key(0)] = self._cfg.Leaf(os.getpid())
        self._cfg[self._cfg.Key(1)] = self._cfg.Leaf(1)  # armed: we are here to resume what we stop
        self.stops = 0

    def disarm(self) -> None:
        """Stop stopping processes, then resume any stopped just before.

        Called before the tracer stops polling: the probes outlive the session
        for a while (their removal runs in the background), and a process that
        opened a library then must not wait for a SIGCONT that never comes."""
        if self._ring is None:
            return
        self._cfg[self._cfg.Key(1)] = self._cfg.Leaf(0)
        self.poll()

    def add_known(self, path: str) -> None:
        raw = path.encode()[: PATH_LEN - 1]
        key = self._known.Key()
        key.path = raw
        self._known[key] = self._known.Leaf(1)

    def poll(self) -> int:
        """Handle every pending notification; returns how many there were."""
        recs = self._ring.drain()
        for rec in recs:  # rare events (opens, forks, exits), not the event stream
            kind = int(rec["type"])
            pid = int(rec["pid"])
            if kind == DiscoverType.OPEN:
                self._opened(pid, int(rec["fd"]), bytes(rec["path"]).split(b"\0", 1)[0].decode("utf-8", "replace"))
            elif kind == DiscoverType.FORK:
                self.on_fork(pid, int(rec["ppid"]), int(rec["ts_ns"]))
            elif kind == DiscoverType.EXEC:
                self.on_exec(pid, int(rec["cgroup_id"]))
            elif kind == DiscoverType.EXIT:
                self.on_exit(pid, int(rec["ts_ns"]))
        return int(recs.size)

    def _opened(self, pid: int, fd: int, path: str) -> None:
        self.stops += 1
        try:
            lib = resolve_open(pid, fd, path)
            if lib is not None:
                self.on_library(lib)
            self.add_known(path)
        finally:
            # never leave a process stopped, whatever happened above
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        if self._ring is None:
            return
        self.disarm()
        self._ring.close()
        self._ring = None
