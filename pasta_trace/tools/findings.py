"""Key findings: the few facts a report opens with (the kernel with the most
GPU time, time blocked in syncs, the peak of live device memory, the peak of
tensor memory, a failed CUDA initialization, failed calls, leaks of driver memory and of tensors (those
freed only by the interpreter's finalization included), and with NCCL: hangs and the rank that
kept the others waiting most), each read from the table of the tool that has
the details."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from .sites import NO_STACK
from .render import human_bytes, human_ns, seconds_after
from .run import ToolResult


#: a subject cut shorter than this says little: the line wraps instead
SUBJECT_MIN = 30


@dataclass(frozen=True)
class Finding:
    topic: str  # "top kernel", "syncs", ...
    text: str  # the finding, one sentence without its subject
    tool: str  # the tool whose table has the details
    #: what the finding is about, when it has a name (a kernel, a call site):
    #: it takes the place of "{subject}" in the text, and is what gets cut when
    #: the line is too long (a kernel name at its end, a call site at its start)
    subject: str | None = None
    cut: str = "start"

    def line(self, width: int | None = None) -> str:
        """The text with its subject, cut so that the whole fits `width`."""
        if self.subject is None:
            return self.text
        subject = self.subject
        room = None if width is None else max(width - (len(self.text) - len("{subject}")), SUBJECT_MIN)
        if room is not None and len(subject) > room:
            subject = "…" + subject[len(subject) - room + 1:] if self.cut == "start" else subject[: room - 1] + "…"
        return self.text.replace("{subject}", subject)


def _n(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def _frame(by_name: dict[str, ToolResult], name: str) -> pl.DataFrame | None:
    r = by_name.get(name)
    return None if r is None or r.note else r.frame


def _top_site(by_name: dict[str, ToolResult], tool: str, weight: str) -> tuple[str, int] | None:
    """The call site (not NO_STACK) with the most `weight` in `tool`'s table."""
    f = _frame(by_name, tool)
    if f is None or weight not in f.columns:
        return None
    f = f.filter((pl.col("call_site") != NO_STACK) & pl.col(weight).is_not_null() & (pl.col(weight) > 0))
    if f.height == 0:
        return None
    row = f.sort(weight, descending=True, maintain_order=True).row(0, named=True)
    return row["call_site"], row[weight]


def _top_kernel(f: pl.DataFrame) -> Finding:
    if f.height == 0:
        return Finding("top kernel", "no kernel launches", "kernels")
    timed = f.filter(pl.col("gpu_ns").is_not_null()) if "gpu_ns" in f.columns else f.clear()
    if timed.height:
        row = timed.sort("gpu_ns", descending=True, maintain_order=True).row(0, named=True)
        share = row["gpu_ns"] / timed["gpu_ns"].sum()
        text = (f"{{subject}}: {human_ns(row['gpu_ns'])} on the GPU ({share:.0%} of all kernels), "
                f"{_n(row['launches'], 'launch', 'launches')}, pid {row['pid']}")
    else:
        row = f.sort("launches", descending=True, maintain_order=True).row(0, named=True)
        text = f"{{subject}}: {_n(row['launches'], 'launch', 'launches')}, pid {row['pid']} (GPU time needs device data)"
    return Finding("top kernel", text, "kernels", row["name"] or "?", cut="end")


def _syncs(f: pl.DataFrame, by_name: dict[str, ToolResult]) -> Finding:
    if f.height == 0:
        return Finding("syncs", "no sync calls", "sync")
    calls = int(f["calls"].sum())
    if f["blocked_ns"].null_count() == f.height:
        return Finding("syncs", f"{_n(calls, 'sync call', 'sync calls')}, time blocked not measured", "sync")
    text = f"{human_ns(f['blocked_ns'].sum())} blocked in {_n(calls, 'sync call', 'sync calls')}"
    top = _top_site(by_name, "call_sites", "blocked_ns")
    if top is None:
        row = f.row(0, named=True)  # the tool sorts by time blocked
        return Finding("syncs", f"{text}; most in {row['api']} ({human_ns(row['blocked_ns'] or 0)}, "
                                f"pid {row['pid']})", "sync")
    return Finding("syncs", f"{text}; most at {{subject}} ({human_ns(top[1])})", "sync", top[0])


def _peak(f: pl.DataFrame, t0: int | None, by_name: dict[str, ToolResult]) -> Finding | None:
    f = f.filter(pl.col("api") == "all")
    if f.height == 0:
        return Finding("peak memory", "no device allocations", "memory_peaks")
    row = f.sort("peak_bytes", descending=True, maintain_order=True).row(0, named=True)
    text = f"{human_bytes(row['peak_bytes'])} live on the device, pid {row['pid']} at {seconds_after(row['peak_ts_ns'], t0)} s"
    top = _top_site(by_name, "peak_call_sites", "live_bytes")
    if top is None:
        return Finding("peak memory", text, "memory_peaks")
    return Finding("peak memory", f"{text}; most from {{subject}} ({human_bytes(top[1])})", "memory_peaks", top[0])


def _tensor_peak(f: pl.DataFrame, t0: int | None, by_name: dict[str, ToolResult]) -> Finding | None:
    """The largest tensor memory peak of any (process, device); none without tensor events."""
    if f.height == 0:
        return None
    row = f.sort("peak_bytes", descending=True, maintain_order=True).row(0, named=True)
    reserved = row["reserved_at_peak_bytes"]
    text = (f"{human_bytes(row['peak_bytes'])} held on {row['device']}"
            + (f" ({human_bytes(reserved)} reserved)" if reserved is not None else "")
            + f", pid {row['pid']} at {seconds_after(row['peak_ts_ns'], t0)} s")
    sites = _frame(by_name, "tensor_peak_call_sites")
    if sites is not None:
        sites = sites.filter((pl.col("pid") == row["pid"]) & (pl.col("device") == row["device"])
                             & pl.col("tensors").is_not_null() & (pl.col("call_site") != NO_STACK))
    if sites is None or sites.height == 0:
        return Finding("tensors", text, "tensor_peaks")
    top = sites.row(0, named=True)  # the tool sorts by bytes
    return Finding("tensors", f"{text}; most from {{subject}} ({human_bytes(top['live_bytes'])})", "tensor_peaks",
                   top["call_site"])


def _errors(f: pl.DataFrame) -> Finding:
    if f.height == 0:
        return Finding("errors", "no failed calls", "api_errors")
    row = f.sort("failed", descending=True, maintain_order=True).row(0, named=True)
    text = f"{_n(int(f['failed'].sum()), 'failed call', 'failed calls')}; most: {row['failed']} of {row['calls']} {row['api']} ({row['error']})"
    return Finding("errors", text, "api_errors")


#: the driver's and the runtime's first calls: their failure means no GPU work at all
INIT_APIS = ("cuInit", "cudaGetDeviceCount", "cudaSetDevice")


def _init_failed(f: pl.DataFrame) -> Finding | None:
    """Processes whose CUDA initialization failed (a job that "does not see
    the GPU"): by code, the processes that got it.  Only when there are any."""
    f = f.filter(pl.col("api").is_in(INIT_APIS))
    if f.height == 0:
        return None
    per = (f.group_by("api", "error", "ret").agg(pl.col("pid").unique().sort())
           .sort(pl.col("api").replace_strict({a: i for i, a in enumerate(INIT_APIS)}, return_dtype=pl.Int32), "ret"))
    parts = [f"{api} failed with {error} ({ret}) in {_n(len(pids), 'process', 'processes')} "
             f"(pid {', '.join(str(p) for p in pids)})" for api, error, ret, pids in per.iter_rows()]
    return Finding("init", "; ".join(parts), "api_errors")


def _leaks(f: pl.DataFrame, by_name: dict[str, ToolResult]) -> Finding | None:
    if f.height == 0:
        if _frame(by_name, "tensors_never_freed") is not None:
            return None  # a tensor capture: "tensor leaks" says what was left, from its own table
        return Finding("leaks", "no allocation left unfreed", "leaks")
    text = f"{_n(f.height, 'allocation', 'allocations')} never freed, {human_bytes(f['size'].sum())}"
    top = _top_site(by_name, "leak_call_sites", "leaked_bytes")
    if top is None:
        return Finding("leaks", text, "leaks")
    return Finding("leaks", f"{text}; most from {{subject}} ({human_bytes(top[1])})", "leaks", top[0])


def _tensor_leaks(f: pl.DataFrame) -> Finding:
    """From tensors_never_freed, the table the leak tools show: tensors left
    at the end, those the interpreter freed only at exit included."""
    if f.height == 0:
        return Finding("tensor leaks", "no tensor left unfreed", "tensors_never_freed")
    n, k = f.height, int(f["freed_at_exit"].sum())
    at_exit = "" if k == 0 else " (freed only at exit)" if k == n else f" ({k} freed only at exit)"
    text = f"{_n(n, 'tensor', 'tensors')} never freed{at_exit}, {human_bytes(f['size'].sum())}"
    sites = (f.filter(pl.col("call_site").is_not_null()).group_by("call_site").agg(pl.col("size").sum())
             .sort(["size", "call_site"], descending=[True, False]))
    if sites.height == 0:
        return Finding("tensor leaks", text, "tensors_never_freed")
    site, size = sites.row(0)
    return Finding("tensor leaks", f"{text}; most from {{subject}} ({human_bytes(size)})", "tensors_never_freed",
                   site)


def _hangs(f: pl.DataFrame) -> Finding | None:
    """Only when there is one: captures without NCCL say nothing about it."""
    if f.height == 0:
        return None
    row = f.row(0, named=True)  # the tool sorts by communicator and seq: the first collective that hung
    ranks = row["missing_ranks"]
    text = (f"{_n(f.height, 'collective', 'collectives')} not entered by every rank; first: {row['api']} "
            f"#{row['seq']} of communicator 0x{row['comm_id']:x}, rank{'s' if ',' in ranks else ''} {ranks} "
            f"(pid {row['missing_pids']}) never came, the others waited {human_ns(row['waiting_ns'] or 0)}")
    return Finding("hangs", text, "hangs")


def _straggler(f: pl.DataFrame) -> Finding | None:
    f = f.filter(pl.col("late_ns") > 0)
    if f.height == 0:
        return None
    row = f.row(0, named=True)  # the tool sorts by the waits caused
    text = (f"rank {row['rank']} (pid {row['pid']}) entered {row['times_last']} of {row['collectives']} "
            f"collectives last, {human_ns(row['late_ns'])} of waiting caused; worst #{row['worst_seq']} "
            f"({human_ns(row['max_late_ns'])})")
    return Finding("straggler", text, "straggler_ranks")


def key_findings(results: list[ToolResult], t0: int | None) -> list[Finding]:
    """The findings whose tools ran and had something to read (an --aggregate
    capture has no per-call durations, a --tool filter may leave tools out)."""
    by_name = {r.tool.name: r for r in results}
    out: list[Finding | None] = []
    if (f := _frame(by_name, "kernels")) is not None:
        out.append(_top_kernel(f))
    if (f := _frame(by_name, "sync")) is not None:
        out.append(_syncs(f, by_name))
    if (f := _frame(by_name, "memory_peaks")) is not None:
        out.append(_peak(f, t0, by_name))
    if (f := _frame(by_name, "tensor_peaks")) is not None:
        out.append(_tensor_peak(f, t0, by_name))
    if (f := _frame(by_name, "api_errors")) is not None:
        out.append(_init_failed(f))
        out.append(_errors(f))
    if (f := _frame(by_name, "leaks")) is not None:
        out.append(_leaks(f, by_name))
    if (f := _frame(by_name, "tensors_never_freed")) is not None:
        out.append(_tensor_leaks(f))
    if (f := _frame(by_name, "hangs")) is not None:
        out.append(_hangs(f))
    if (f := _frame(by_name, "straggler_ranks")) is not None:
        out.append(_straggler(f))
    return [x for x in out if x is not None]
