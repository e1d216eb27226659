"""Every counter of what a capture could not keep, and what cures it."""

from __future__ import annotations

from dataclasses import dataclass

from .stacks import NATIVE_STATS, PY_STATS


#: Probed calls one thread may have in flight at once (entered, not returned):
#: the frame stack bpf/pasta.h keeps per thread (a power of two).  A call
#: nested deeper is not recorded and is counted in lost_inflight.
INFLIGHT_DEPTH = 4

#: Rows (pid, API, kernel, shape, return code) the --aggregate map holds by
#: default, and at most: the kernel allocates them all when the program loads
#: (about 128 bytes each).
DEFAULT_AGGREGATE_MAX = 65536
MAX_AGGREGATE_MAX = 1 << 22


@dataclass(frozen=True)
class Loss:
    """A counter of what a capture could not keep, and what cures it.

    The manifest stores each under its ``name`` in ``counts`` (in
    ``counts[section]`` when ``section`` is set); the summary prints each that
    counted with its ``meaning`` and ``remedy``; every report's INCOMPLETE
    banner adds them all up.  ``counter`` is the per-CPU BPF array that counts
    it and ``index`` its slot there (the C side's ``PT_<NAME>``); a counter
    kept by the tracer's own code has ``counter`` "" and ``index`` -1.
    ``flag`` is the option that ``remedy`` raises, if any."""

    name: str
    counter: str
    index: int
    what: str  # what was lost, as counted: "events"
    meaning: str
    remedy: str
    flag: str | None = None
    section: str | None = None

    @property
    def c_define(self) -> str:
        return f"PT_{self.name.upper()}"

    def count_in(self, counts: dict) -> int:
        """Its value in a manifest's ``counts`` (0 when absent: an older capture, or not counted)."""
        holder = counts.get(self.section) if self.section else counts
        value = holder.get(self.name, 0) if isinstance(holder, dict) else 0
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


LOSSES: tuple[Loss, ...] = (
    Loss("lost_events", "lost", 0, "events", "the events ring buffer was full",
         "raise --buffer-pages", "--buffer-pages"),
    Loss("lost_names", "lost", 1, "kernel names", "the names ring buffer was full",
         "raise --buffer-pages: the names ring grows with it", "--buffer-pages"),
    Loss("lost_inflight", "lost", 2, "nested calls",
         f"more than {INFLIGHT_DEPTH} probed calls in flight on one thread",
         "a fixed limit of the probes: --buffer-pages does not change it"),
    Loss("lost_agg", "lost", 3, "aggregated calls", "the --aggregate map was full",
         "raise --aggregate-max", "--aggregate-max"),
    Loss("lost_stacks", "py_stats", PY_STATS["lost_stacks"], "Python stacks", "the stacks ring buffer was full",
         "raise --stack-buffer-pages", "--stack-buffer-pages", section="stacks"),
    Loss("unreadable_stacks", "py_stats", PY_STATS["unreadable_stacks"], "unreadable Python stacks",
         "frames changed or were freed while read",
         "no option changes it; their events are kept, without a stack", section="stacks"),
    Loss("lost_native_stacks", "native_stats", NATIVE_STATS["lost_native_stacks"], "native stacks",
         "the native stacks ring buffer was full", "raise --native-stack-buffer-pages",
         "--native-stack-buffer-pages", section="stacks"),
    Loss("unreadable_native_stacks", "native_stats", NATIVE_STATS["unreadable_native_stacks"],
         "unreadable native stacks", "not one byte of the user stack could be read",
         "no option changes it; their events keep their Python stack only", section="stacks"),
    # counted by the tracer (capture.stacks.native_collector): a library's unwind tables not built when the capture ended
    Loss("unresolved_native_stacks", "", -1, "unresolved native stacks",
         "a library's unwind tables were not ready when the capture ended",
         "no option changes it; their events keep their Python stack only", section="stacks"),
    Loss("unpaused_opens", "discover_lost", 0, "unpaused library opens",
         "too many processes waited for probes at once",
         "no option changes it; the first calls after those opens may be missing"),
    Loss("lost_notifications", "discover_lost", 1, "process notifications",
         "the fork/exec/exit ring buffer was full",
         "no option changes it; processes.parquet may miss those processes"),
    # drained from the ring, then dropped: the tracer's queue to its events
    # writer process was full (capture.output.writer_queue)
    Loss("lost_writer_behind", "", -1, "events", "the events writer fell behind",
         "use --aggregate or trace fewer processes"),
    # reached the events writer process but could not be written (a full disk)
    Loss("lost_unwritten", "", -1, "events", "they could not be written: the disk was full",
         "free space or choose another -o"),
    Loss("untraced_children", "discover_lost", 2, "untraced child processes",
         "the table of traced processes was full when they started",
         "no option changes it; trace fewer processes at once"),
    # counted by the tracer (capture.stacks.stack_collector): py_procs was full when they were registered
    Loss("unregistered_python_processes", "", -1, "Python processes without stacks",
         "more Python processes ran at once than the table of interpreters holds",
         "no option changes it; their events are kept, without a stack", section="stacks"),
    # handed to the events writer process, or drained, after it died (killed): not on disk (capture.output.writer)
    Loss("lost_writer_died", "", -1, "events", "the events writer process died before it wrote them",
         "no option changes it; the manifest's notes say how it died"),
    # drained by a tracer that died, and held back in its memory (native stacks not unwound yet): counted by
    # the events writer process, which wrote everything else (capture.output.takeover)
    Loss("lost_tracer_died", "", -1, "events", "the tracer died while it held them",
         "no option changes it; the manifest's notes say so"),
    # bpf/pasta.h pt_capture_join, pt_capture_record: the table of streams under capture, or of events
    # recorded under capture (per process), was full
    Loss("lost_captures", "lost", 4, "stream captures",
         "more streams or events were under capture at once than the probes' tables hold",
         "no option changes it; the launches, copies and memsets captured on those streams count as run"),
    # bpf/nccl.bpf.c pt_nccl_remember: the table of communicators' comm_ids (per process) was full
    Loss("lost_comm_ids", "lost", 5, "communicator ids",
         "more communicators were alive at once than the probes' table holds",
         "no option changes it; the communicators split from those have no comm_id"),
)

LOSS_BY_NAME = {loss.name: loss for loss in LOSSES}


@dataclass(frozen=True)
class Tally:
    """A count the probes keep of calls they handled without an event of
    their own, on purpose: not a loss.  The manifest stores each in
    ``counts`` under ``name``; ``index`` is its slot in the per-CPU BPF array
    ``tally`` (the C side's ``PT_TALLY_<NAME>``)."""

    name: str
    index: int
    meaning: str
    summary: str  # the capture summary's line, after the count

    @property
    def c_define(self) -> str:
        return f"PT_TALLY_{self.name.upper()}"


TALLIES: tuple[Tally, ...] = (
    # bpf/pasta.h pt_inner: a thread records each (runtime launch function,
    # driver handle) pair once, in the first nested driver launch that shows it
    Tally("folded_launches", 0,
          "driver launches made inside a runtime launch whose pair of runtime function and driver handle its "
          "thread had recorded already: counted by the runtime launch, written without a nested event",
          "driver launches folded into their runtime launch (kernel seen before)"),
)


#: Slots of the per-thread table that remembers which (runtime launch
#: function, driver handle) pairs a thread has written (bpf/pasta.h
#: pt_inner): direct-mapped by the function (fold_slot); a power of two.
FOLD_SLOTS = 64


def fold_slot(func: int) -> int:
    """The table slot of a runtime launch's function, as the probes compute it
    (pt_fold_slot): two launch functions with the same slot take it from each
    other, so neither's nested launches fold."""
    return ((func >> 4) ^ (func >> 12)) & (FOLD_SLOTS - 1)


def tally_c_defines() -> str:
    """``#define PT_TALLY_<NAME> <slot>`` for each tally, and ``PT_TALLY_N``."""
    out = [f"#define {t.c_define} {t.index}" for t in TALLIES]
    out.append(f"#define PT_TALLY_N {len(TALLIES)}")
    out.append(f"#define PT_FOLD_N {FOLD_SLOTS}")
    return "\n".join(out) + "\n"


def loss_counters(counter: str) -> tuple[Loss, ...]:
    """The losses one BPF array counts, in slot order."""
    return tuple(sorted((loss for loss in LOSSES if loss.counter == counter), key=lambda loss: loss.index))


def loss_c_defines(counter: str) -> str:
    """``#define PT_<NAME> <slot>`` for each loss ``counter`` counts, and
    ``PT_<COUNTER>_N``, the array's size."""
    rows = loss_counters(counter)
    out = [f"#define {loss.c_define} {loss.index}" for loss in rows]
    out.append(f"#define PT_{counter.upper()}_N {len(rows)}")
    return "\n".join(out) + "\n"


def loss_text(lost: dict[str, int]) -> str:
    """"5 events, 2 Python stacks": each loss that counted, in table order ("" when none)."""
    return ", ".join(f"{lost[loss.name]:,} {loss.what}" for loss in LOSSES if lost.get(loss.name))
