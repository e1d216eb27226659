"""manifest.json of a capture directory (docs/formats.md).

Written twice: once at the start with ``complete: false`` (so a killed tracer
still leaves a description of what it traced), and once at the end with the
counts and ``complete: true``.  Each write goes to a new temporary file and
is renamed into place (safe_output), so a reader never sees half a manifest.
"""

from __future__ import annotations

import json
import platform
import socket
import threading
import time
from dataclasses import asdict, dataclass, field

from ... import __version__, schema
from ...safe_output import OutputDir

NAME = "manifest.json"


@dataclass
class ClockSample:
    """CLOCK_REALTIME bracketed by two CLOCK_MONOTONIC reads: wall time of a
    monotonic instant to within (mono_after - mono_before)."""

    mono_before_ns: int
    realtime_ns: int
    mono_after_ns: int

    @classmethod
    def now(cls) -> "ClockSample":
        a = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        r = time.clock_gettime_ns(time.CLOCK_REALTIME)
        b = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        return cls(a, r, b)


@dataclass
class LibraryEntry:
    path: str
    attach_path: str
    dev: int
    inode: int
    build_id: str | None
    family: str
    symbols_attached: list[str] = field(default_factory=list)
    symbols_missing: list[str] = field(default_factory=list)
    #: symbol -> offset from the symbol where the probe sits (0 = at the symbol)
    placements: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: probed symbols not attached because their events come from another:
    #: the same address, or a function that only jumps to it (symbol -> it)
    aliases: dict[str, str] = field(default_factory=dict)


@dataclass
class Manifest:
    command_line: list[str]
    mode: str  # pid | system | launch
    start: ClockSample
    pids: list[int] = field(default_factory=list)
    libraries: list[LibraryEntry] = field(default_factory=list)
    launched: dict | None = None  # {"argv": [...], "pid": N, "exit_code": N}
    aggregate: bool = False
    aggregate_max: int | None = None  # rows of the --aggregate map; None without --aggregate
    buffer_pages: int = 0
    end: ClockSample | None = None
    counts: dict = field(default_factory=dict)
    #: the --device backend asked for (None: none); with no device_files it recorded nothing
    device: str | None = None
    device_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: stack settings and, per Python process, its interpreter or why it has no stacks; None: --no-stacks
    stacks: dict | None = None
    #: per PID with driver launches no run-time lookup named: what the driver-object scan found (attach_names)
    attach_names: dict | None = None
    #: a daemon's dump (pasta_trace.daemon.dump): what triggered it and the window it holds; None otherwise
    trigger: dict | None = None

    def to_json(self, complete: bool) -> dict:
        uname = platform.uname()
        return {
            "format_version": ".".join(map(str, schema.CAPTURE_FORMAT_VERSION)),
            "tool": "pasta-trace",
            "tool_version": __version__,
            "command_line": self.command_line,
            "host": socket.gethostname(),
            "kernel_release": uname.release,
            "machine": uname.machine,
            "mode": self.mode,
            "clock": {
                "domain": "CLOCK_MONOTONIC",
                "start_ns": self.start.mono_before_ns,
                "end_ns": self.end.mono_after_ns if self.end else None,
                "start_sample": asdict(self.start),
                "end_sample": asdict(self.end) if self.end else None,
            },
            "pids": self.pids,
            "launched": self.launched,
            "aggregate": self.aggregate,
            "aggregate_max": self.aggregate_max,
            "buffer_pages": self.buffer_pages,
            "libraries": [asdict(lib) for lib in self.libraries],
            "counts": self.counts,
            "device": self.device,
            "device_files": self.device_files,
            "notes": self.notes,
            "stacks": self.stacks,
            "attach_names": self.attach_names,
            "trigger": self.trigger,
            "complete": complete,
        }

    def write(self, out: OutputDir, *, complete: bool) -> None:
        out.write_bytes(NAME, (json.dumps(self.to_json(complete), indent=2) + "\n").encode())


class FileProblems:
    """Files a traced process made the tracer read (a library, an executable,
    a fatbin, unwind or line tables) that were skipped: not a regular file,
    damaged, or past a bound.  Path -> why, the first reason kept; filled
    from the drain's workers and the end's naming, shown as the manifest's
    notes.  One capture runs per tracer process, so one instance serves it."""

    MAX = 1000  # files named; past it, counted

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._why: dict[str, str] = {}
        self._more = 0

    def add(self, path: str, why: str) -> None:
        with self._lock:
            if path in self._why:
                return
            if len(self._why) >= self.MAX:
                self._more += 1
                return
            self._why[path] = why.removeprefix(f"{path}: ")

    def take(self) -> list[str]:
        """The notes, and forget them (the next capture starts empty)."""
        with self._lock:
            out = [f"{path}: skipped: {why}" for path, why in self._why.items()]
            if self._more:
                out.append(f"{self._more} more files skipped")
            self._why.clear()
            self._more = 0
            return out


#: the files skipped during this process's capture
FILE_PROBLEMS = FileProblems()


def counts(
    *, events: int, names: int, lost: dict[str, int], by_kind: dict[str, int], known_full: int = 0,
    stacks: dict | None = None, tallies: dict[str, int] | None = None,
) -> dict:
    """The manifest's `counts` object.  Each loss counter (schema.LOSSES) is
    stored by its name, in its section (`stacks`) where it has one; the
    readers add them all up (read.Capture.losses)."""
    out: dict = {"events": events, "names": names}
    if stacks is not None:
        out["stacks"] = dict(stacks)
    for name, n in lost.items():
        section = schema.LOSS_BY_NAME[name].section
        (out.setdefault(section, {}) if section else out)[name] = n
    # library files with probes that the kernel's known-files table could not
    # hold: each later open of one paused its process (not a loss)
    out["known_full"] = known_full
    # calls the probes handled without an event of their own (schema.TALLIES):
    # not losses
    out.update(tallies or {})
    out["by_kind"] = by_kind
    return out
