"""Rows of processes.parquet: who each traced PID is and where it runs."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import polars as pl

from ... import schema
from .reach import may_trace

_CLK_TCK = os.sysconf("SC_CLK_TCK")

#: A container runtime's 64-hex id in a cgroup path: docker-<id>.scope,
#: cri-containerd-<id>.scope, libpod-<id>.scope, /docker/<id>, /kubepods/.../<id>.
_CONTAINER_ID = re.compile(r"(?:^|[/-])([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def container_id(cgroup: str) -> str | None:
    m = _CONTAINER_ID.search(cgroup)
    return m.group(1) if m else None


def cgroup2_root(mountinfo: Path = Path("/proc/self/mountinfo")) -> Path:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or .../unified on hybrid systems)."""
    try:
        for line in mountinfo.read_text().splitlines():
            fields = line.split(" - ", 1)
            if len(fields) == 2 and fields[1].split(" ", 1)[0] == "cgroup2":
                return Path(fields[0].split(" ")[4])
    except OSError:
        pass
    return Path("/sys/fs/cgroup")


def cgroup_path(cgroup_id: int, root: Path) -> str | None:
    """The cgroup v2 path whose id (its cgroupfs directory's inode) is ``cgroup_id``."""
    if root.stat().st_ino == cgroup_id:
        return "/"
    for d, subdirs, _ in os.walk(root):
        for sub in subdirs:
            full = Path(d) / sub
            try:
                if full.stat().st_ino == cgroup_id:
                    return "/" + str(full.relative_to(root))
            except OSError:
                continue
    return None


#: environment variables naming a process's place in a distributed job -> processes.parquet column
DISTRIBUTED_ENV = {"RANK": "rank", "LOCAL_RANK": "local_rank", "WORLD_SIZE": "world_size"}


def distributed(environ: bytes) -> dict[str, int | None]:
    """rank, local_rank, world_size from a /proc/PID/environ image (NUL-separated
    NAME=value); None for a variable that is unset or not an integer."""
    out: dict[str, int | None] = dict.fromkeys(DISTRIBUTED_ENV.values())
    for entry in environ.split(b"\0"):
        name, _, value = entry.partition(b"=")
        col = DISTRIBUTED_ENV.get(name.decode("ascii", "replace"))
        if col is not None:
            try:
                out[col] = int(value)
            except ValueError:
                pass
    return out


def _environ(base: Path) -> bytes:
    """The process's initial environment; empty when it cannot be read (another
    user's process without the privilege to read it: its rank stays unknown)."""
    try:
        return (base / "environ").read_bytes()
    except OSError:
        return b""


def _boot_offset_ns() -> int:
    """CLOCK_MONOTONIC - CLOCK_BOOTTIME: /proc/PID/stat start times count from
    boot including suspend; the events' clock does not."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) - time.clock_gettime_ns(time.CLOCK_BOOTTIME)


def process_row(pid: int, proc: Path = Path("/proc"), uid: int | None = None) -> dict | None:
    """One processes.parquet row, or None if the process is gone or (with
    ``uid``, under sudo) not that user's, before or after it was read: a
    process that became another user's meanwhile leaves nothing of its
    command line here."""
    if not may_trace(pid, uid, proc):
        return None
    base = proc / str(pid)
    try:
        stat = (base / "stat").read_text()
        cmdline = (base / "cmdline").read_bytes()
        cgroup_lines = (base / "cgroup").read_text().splitlines()
        mnt_ns = os.stat(base / "ns" / "mnt").st_ino
    except OSError:
        return None
    if not may_trace(pid, uid, proc):
        return None
    # comm may contain spaces and parentheses: it ends at the last ')'
    comm = stat[stat.index("(") + 1 : stat.rindex(")")]
    rest = stat[stat.rindex(")") + 2 :].split()
    ppid = int(rest[1])
    start_ticks = int(rest[19])
    # cgroup v2 has one "0::/path" line; v1 several: prefer the unified one
    cgroup = next((ln.split(":", 2)[2] for ln in cgroup_lines if ln.startswith("0::")), None)
    if cgroup is None and cgroup_lines:
        cgroup = cgroup_lines[0].split(":", 2)[2]
    return {
        "pid": pid,
        "ppid": ppid,
        "comm": comm,
        "cmdline": cmdline.rstrip(b"\0").replace(b"\0", b" ").decode("utf-8", "replace"),
        "cgroup": cgroup,
        "container_id": container_id(cgroup or ""),
        "mnt_ns": mnt_ns,
        "start_ns": start_ticks * 1_000_000_000 // _CLK_TCK + _boot_offset_ns(),
        "exit_ns": None,
        **distributed(_environ(base)),
    }


class ProcessTable:
    """Processes seen during a capture, with their exit times."""

    def __init__(self, uid: int | None = None) -> None:
        #: under sudo, the only uid whose processes are recorded (capture.procs.reach)
        self._uid = uid
        self._rows: dict[int, dict] = {}
        #: cgroup ids from exec notifications of processes not in the table yet: one
        #: that is first seen in events after it has exited still gets its cgroup
        self._exec_cgroups: dict[int, tuple[int, Path | None]] = {}
        self.changed = False

    def __contains__(self, pid: int) -> bool:
        return pid in self._rows

    def add(self, pid: int, proc: Path = Path("/proc")) -> bool:
        """Record ``pid`` if it is new and alive; True if added."""
        if pid in self._rows:
            return False
        row = process_row(pid, proc, self._uid)
        if row is None:
            return False
        self._exec_cgroups.pop(pid, None)  # alive: /proc told its cgroup
        self._rows[pid] = row
        self.changed = True
        return True

    def add_minimal(self, pid: int, comm: str) -> None:
        """A process seen only in events (it exited before /proc was read)."""
        if pid not in self._rows and not self.add(pid):
            self._rows[pid] = {**dict.fromkeys(schema.PROCESSES_SCHEMA), "pid": pid, "comm": comm}
            self.changed = True
            self._apply_cgroup(pid, *self._exec_cgroups.pop(pid, (0, None)))

    def refresh(self, pid: int, proc: Path = Path("/proc"), cgroup_id: int = 0,
                cgroup_root: Path | None = None) -> None:
        """Re-read a process after exec (new comm and cmdline).  When it is
        already gone, its cgroup still comes from the id the kernel gave with
        the exec notification (a process may join a cgroup just before exec)."""
        if pid not in self._rows:
            if cgroup_id:
                self._exec_cgroups[pid] = (cgroup_id, cgroup_root)
            return
        row = process_row(pid, proc, self._uid)
        if row is not None:
            row["exit_ns"] = self._rows[pid]["exit_ns"]
            self._rows[pid] = row
            self.changed = True
            return
        self._apply_cgroup(pid, cgroup_id, cgroup_root)

    def _apply_cgroup(self, pid: int, cgroup_id: int, cgroup_root: Path | None) -> None:
        path = cgroup_path(cgroup_id, cgroup_root or cgroup2_root()) if cgroup_id else None
        if path is not None and path != self._rows[pid]["cgroup"]:
            self._rows[pid].update(cgroup=path, container_id=container_id(path))
            self.changed = True

    def exited(self, pid: int, ts_ns: int) -> None:
        row = self._rows.get(pid)
        if row is not None and row["exit_ns"] is None:
            row["exit_ns"] = ts_ns
            self.changed = True

    def exited_pids(self) -> list[int]:
        return [p for p, r in self._rows.items() if r["exit_ns"] is not None]

    def pids(self) -> list[int]:
        return list(self._rows)

    def forget(self, pid: int) -> None:
        """Drop ``pid``'s row (the daemon: it exited and its events left the window)."""
        self._rows.pop(pid, None)
        self._exec_cgroups.pop(pid, None)

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(list(self._rows.values()), schema=schema.PROCESSES_SCHEMA, orient="row")
