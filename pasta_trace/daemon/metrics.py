"""The daemon's Prometheus metrics (docs/daemon.md, "Metrics"): what every
traced process did since the daemon saw it first, counted from the drained
events, labelled by process (pid, comm) and container (container, pod).

The main loop hands over each drained batch (``add_names``, then ``add``: a
copy of the few columns counted, no per-event Python) and folds them in once
a second (``update``: Polars group-bys into one long table of totals), or
sooner once PENDING_EVENTS wait.  The
HTTP server's thread reads only what ``update`` published, whole frames
swapped in at once, so a scrape never sees half an update.

Bounds, for a daemon that runs for weeks: a process's kernels get a series
each for the first KERNELS_PER_PROCESS names seen (a counter's series must
never go away or shrink while its process lives), later ones are summed
under ``kernel="(other)"``; every series of a process goes EXITED_KEEP_S
after the daemon notices its exit (checked every CHECK_EXITED_S), long
enough for the last value to be scraped and for rate() to see the end.
"""

from __future__ import annotations

import errno
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from .. import schema
from ..call_result import error_name
from ..capture.output.decode import names_frame
from ..capture.procs.processes import container_id
from ..errors import PastaError
from ..hexfmt import hex_expr
from ..lifetimes import kind_from_api, memory
from .window import Window

#: kernels with a series of their own, per process; the rest are summed under OTHER_KERNELS
KERNELS_PER_PROCESS = 20
OTHER_KERNELS = "(other)"
#: how long the series of a process that exited stay (seconds after its exit was noticed)
EXITED_KEEP_S = 300.0
#: events waiting for the next fold at most (their columns take 52 bytes an event: 7 MB)
PENDING_EVENTS = 1 << 17
#: how often the processes counted are looked up in /proc
CHECK_EXITED_S = 10.0
#: NCCL call durations: the histogram's upper bounds (seconds), 10 us to a minute
NCCL_BUCKETS_S = (1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 60.0)
#: labels every per-process series has
PROCESS_LABELS = ("pid", "comm", "container", "pod")


@dataclass(frozen=True)
class Spec:
    """One metric: its name (exported as pasta_<name>), type and labels beyond the process's."""

    name: str
    type: str  # counter | gauge | histogram
    labels: tuple[str, ...]
    help: str


SPECS: tuple[Spec, ...] = (
    Spec("launches", "counter", (), "kernel launches that returned success (rate() gives launches/s)"),
    Spec("kernel_launches", "counter", ("kernel",),
         f"launches by kernel name (the handle in hex where no name was seen); the first {KERNELS_PER_PROCESS} "
         f"kernels of a process each, the rest under kernel=\"{OTHER_KERNELS}\""),
    Spec("allocations", "counter", ("layer", "memory"), "successful allocations"),
    Spec("allocated_bytes", "counter", ("layer", "memory"), "bytes allocated by successful allocations"),
    Spec("live_bytes", "gauge", ("layer", "memory"),
         "bytes allocated since the daemon saw the process first and not freed yet"),
    Spec("copies", "counter", ("direction",), "memory copies that returned success"),
    Spec("copied_bytes", "counter", ("direction",), "bytes those copies moved"),
    Spec("syncs", "counter", (), "synchronisations (stream, context, event, device) that returned success"),
    Spec("sync_seconds", "counter", (), "time the process was blocked in those synchronisations"),
    Spec("failed_calls", "counter", ("api", "error"), "calls that returned an error, by API and error code"),
    Spec("nccl_calls", "counter", ("op",), "NCCL collectives and sends/receives that returned success"),
    Spec("nccl_bytes", "counter", ("op",), "bytes those NCCL calls were given"),
    Spec("nccl_call_seconds", "histogram", ("op",), "time in each of those NCCL calls (enqueue to return)"),
    Spec("triggers", "counter", ("kind",), "dumps and their triggers fired, by kind (hang suspects included)"),
)
#: the daemon's own series (no process labels)
DAEMON_SPECS: tuple[Spec, ...] = (
    Spec("lost", "counter", ("counter",), "what the probes could not record (schema.LOSSES), by counter"),
    Spec("events", "counter", (), "events drained from the ring buffer"),
    Spec("window_dropped_events", "counter", (), "events that left the window (older than it, or past its bytes)"),
    Spec("window_events", "gauge", (), "events the window holds now"),
    Spec("window_bytes", "gauge", (), "bytes the window's events take now"),
)

_K = schema.Kind
_FIELDS = ("pid", "api", "kind", "flags", "ret", "valid", "copy_kind", "func", "ptr", "size", "dur_ns")
#: the columns counting each kind of call reads, beyond pid, kind, api and whether it failed
_NEEDS: dict[int, tuple[str, ...]] = {
    _K.launch: ("func",), _K.free: ("ptr",), _K.tensor_free: ("ptr",), _K.alloc: ("ptr", "size", "valid"),
    _K.tensor_alloc: ("ptr", "size", "valid"), _K.memcpy: ("size", "valid", "copy_kind"), _K.sync: ("dur_ns",),
    _K.collective: ("size", "valid", "dur_ns"), _K.p2p: ("size", "valid", "dur_ns"),
}
_BIT = {k: 1 << v for k, v in schema.PAYLOAD_BITS.items()}
_BOUNDS_S = np.array(NCCL_BUCKETS_S, dtype=np.float64)
#: (kubepods) pod UIDs in a cgroup path: /kubepods/burstable/pod<uid>/..., kubepods-pod<uid with _>.slice
_POD = re.compile(r"kubepods.*?pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")
_TOTALS = {"metric": pl.String, "pid": pl.UInt32, "a": pl.String, "b": pl.String, "value": pl.Float64}
_LIVE = {"pid": pl.UInt32, "tensor": pl.Boolean, "ptr": pl.UInt64, "pinned": pl.Boolean, "size": pl.UInt64}


def parse_address(text: str) -> tuple[str, int] | None:
    """--metrics: HOST:PORT, [IPv6]:PORT, PORT (loopback) or `off` (None)."""
    if text.strip().lower() == "off":
        return None
    m = re.fullmatch(r"\s*(?:\[([0-9a-fA-F:.]+)\]|([^:\s]*)):([0-9]+)\s*|\s*([0-9]+)\s*", text)
    port = int(m.group(3) or m.group(4)) if m else -1
    if not 0 < port < 65536:
        raise ValueError(f"not an address: {text!r}: try 127.0.0.1:9464, [::1]:9464, 9464 or off")
    return (m.group(1) or m.group(2) or "127.0.0.1") if m.group(3) else "127.0.0.1", port


@dataclass
class Process:
    """The labels of a process counted, and what says whether it is still the same one."""

    comm: str
    container: str
    pod: str
    start: str | None  # /proc/PID/stat's start time: a PID reused later is another process
    exited_at: float | None = None

    def labels(self, pid: int) -> tuple[str, ...]:
        return str(pid), self.comm, self.container, self.pod


def _start_time(proc: Path, pid: int) -> str | None:
    try:
        return (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _where(proc: Path, pid: int) -> tuple[str, str]:
    """(container id, pod UID) from /proc/PID/cgroup, "" where its path names none."""
    try:
        cgroup = (proc / str(pid) / "cgroup").read_text()
    except OSError:
        return "", ""
    pod = _POD.search(cgroup)
    return container_id(cgroup) or "", pod.group(1).replace("_", "-") if pod else ""


@dataclass(frozen=True)
class Published:
    """What a scrape reads: per-process totals (metric, pid, a, b, value), the labels of each pid, the daemon's own."""

    totals: pl.DataFrame
    processes: dict[int, tuple[str, ...]]
    daemon: dict[tuple[str, str], float]


class Metrics:
    def __init__(self, api_names: list[str], *, proc: Path = Path("/proc"),
                 clock: Callable[[], float] = time.monotonic, keep_exited_s: float = EXITED_KEEP_S):
        self._api_names = api_names
        #: api index -> name, the last for an index past the table (never from our program)
        self._api_label = pl.col("api").replace_strict(list(range(len(api_names) + 1)), [*api_names, "(unknown api)"],
                                                       return_dtype=pl.String)
        #: per api index: whether a driver allocation by it is pinned host memory (else device memory)
        self._pinned = pl.select(memory(kind_from_api(pl.Series([*api_names, "?"], dtype=pl.String)))
                                 == "pinned host").to_series().to_numpy()
        self._proc = proc
        self._clock = clock
        self.keep_exited_s = keep_exited_s
        self._pending: list[dict[str, np.ndarray]] = []
        self._pending_events = 0
        self._pending_names: list[np.ndarray] = []
        self._totals = pl.DataFrame(schema=_TOTALS)
        self._live = pl.DataFrame(schema=_LIVE)
        self._names = pl.DataFrame(schema={"pid": pl.UInt32, "func": pl.UInt64, "kernel": pl.String})
        self._admitted = pl.DataFrame(schema={"pid": pl.UInt32, "a": pl.String})
        self.processes: dict[int, Process] = {}
        self._lock = threading.Lock()  # triggered() may come from any thread
        self._triggers: list[tuple[int, str]] = []
        self._daemon: dict[tuple[str, str], float] = {}
        self._next_check = clock() + CHECK_EXITED_S
        self.published = Published(self._totals, {}, {})

    # ------------------------------------------------------------------ input (main thread)

    def add(self, recs: np.ndarray) -> None:
        """A drained batch of schema.HOST_EVENT records (after the names drained with it): the columns counted are copied now, while the
        drain's records are in the cache (a third of the fold's cost, measured, against copying them
        at the fold), and folded early past PENDING_EVENTS, so what waits stays bounded."""
        if not recs.size:
            return
        self._pending.append({f: np.array(recs[f]) for f in _FIELDS})
        self._pending_events += recs.size
        pids, first = np.unique(self._pending[-1]["pid"], return_index=True)
        for pid, i in zip(pids.tolist(), first.tolist()):  # per process, never per event
            known = self.processes.get(pid)
            if known is None or known.exited_at is not None:
                self._new_process(pid, bytes(recs["comm"][i]).split(b"\0", 1)[0].decode(errors="replace"))
        if self._pending_events >= PENDING_EVENTS:
            self._fold()

    def add_names(self, recs: np.ndarray) -> None:
        """A drained batch of schema.HOST_NAME records."""
        if recs.size:
            self._pending_names.append(recs)

    def triggered(self, kind: str, pid: int | None) -> None:
        """A trigger of ``kind`` fired for ``pid`` (None: for every process): counted in pasta_triggers_total."""
        with self._lock:
            self._triggers.append((0 if pid is None else pid, kind))

    def _new_process(self, pid: int, comm: str) -> None:
        if pid in self.processes:  # it exited and the PID came back: the old series go now
            self._drop([pid])
        container, pod = _where(self._proc, pid)
        self.processes[pid] = Process(comm, container, pod, _start_time(self._proc, pid))

    # ------------------------------------------------------------------ folding (main thread)

    def update(self, lost: dict[str, int], window: Window | None = None) -> None:
        """Fold the batches added since the last update into the totals, and publish."""
        with self._lock:
            triggers, self._triggers = self._triggers, []
        for pid, _ in triggers:
            if pid and pid not in self.processes:
                self._new_process(pid, _comm(self._proc, pid))
        # idle (nothing drained, fired or gone since the last update), the per-process series stand as
        # published: only the daemon's own values are new (the frames' rebuild was most of an idle second)
        changed = bool(self._pending or self._pending_names or triggers)
        known = len(self.processes)
        self._fold()
        if triggers:
            self._add_totals(pl.DataFrame({"metric": "triggers", "pid": [p for p, _ in triggers],
                                           "a": [k for _, k in triggers], "b": "", "value": 1.0}, schema=_TOTALS))
        if self._clock() >= self._next_check:
            self._next_check = self._clock() + CHECK_EXITED_S
            self._check_exited()
        self._daemon = {("lost", name): float(n) for name, n in lost.items()}
        if window is not None:
            self._daemon.update({("events", ""): float(window.drained), ("window_dropped_events", ""):
                                 float(window.dropped), ("window_events", ""): float(window.held),
                                 ("window_bytes", ""): float(window.bytes)})
        if not changed and len(self.processes) == known:
            self.published = Published(self.published.totals, self.published.processes, dict(self._daemon))
            return
        live = self._live_rows()
        self.published = Published(pl.concat([self._totals, live]),
                                   {pid: p.labels(pid) for pid, p in self.processes.items()}, dict(self._daemon))

    def _fold(self) -> None:
        """Count the batches added since the last fold into the totals."""
        if self._pending_names:  # first: the launches of this fold are named by what came with them
            self._fold_names(np.concatenate(self._pending_names))
            self._pending_names = []
        if self._pending:
            ev, present = self._events()
            self._pending, self._pending_events = [], 0
            self._add_totals(self._count(ev, present))

    def _add_totals(self, new: pl.DataFrame) -> None:
        self._totals = pl.concat([self._totals, new]).group_by("metric", "pid", "a", "b").agg(pl.col("value").sum())

    def _events(self) -> tuple[pl.DataFrame, set[int]]:
        """The batches since the last fold, in the columns the kinds of call they hold need (a flood
        of launches: five), and those kinds.  No text yet: labels are made per group, not per event."""
        kind = np.concatenate([b["kind"] for b in self._pending])
        present = set(np.flatnonzero(np.bincount(kind)).tolist())
        fields = {"pid", "api", "flags", "ret"}.union(*(_NEEDS.get(k, ()) for k in present))
        cols = {f: np.concatenate([b[f] for b in self._pending]) for f in sorted(fields)}
        cols["kind"] = kind
        cols["api"] = np.minimum(cols["api"], len(self._api_names))
        flags = cols.pop("flags")
        cols["ok"] = ((flags & schema.FLAG_HAS_RET) == 0) | (cols["ret"] == 0)
        if "dur_ns" in cols:
            cols["timed"] = (flags & schema.FLAG_HAS_DUR) != 0
            cols["seconds"] = np.where(cols["timed"], cols.pop("dur_ns") / 1e9, 0.0)
        valid = cols.pop("valid", None)
        if "size" in cols:
            cols["size"] = np.where(valid & _BIT["size"], cols["size"], 0)
        if "copy_kind" in cols:
            unknown = int(schema.CopyKind.unknown)
            cols["copy_kind"] = np.where(valid & _BIT["copy_kind"], np.minimum(cols["copy_kind"], unknown), unknown)
        if present & {_K.alloc, _K.tensor_alloc}:
            cols["pinned"] = self._pinned[cols["api"]]
        # a call nested in a traced call of a higher layer is that call's; a launch captured into a graph ran nothing
        counted = ~np.isin(kind, [int(_K.nested), int(_K.captured)])
        if not counted.all():
            cols = {k: v[counted] for k, v in cols.items()}
        return pl.DataFrame(cols), present

    def _count(self, ev: pl.DataFrame, present: set[int]) -> pl.DataFrame:
        """This fold's counts as totals rows: grouped by numbers, then labelled per group.  Only the
        kinds of call the fold holds are looked at: a flood of launches costs two group-bys, not twelve."""
        kind, ok, none, api = pl.col("kind"), pl.col("ok"), pl.lit(""), self._api_label
        size, seconds = pl.col("size").sum(), pl.col("seconds").sum()

        def rows(frame: pl.DataFrame, metric: str, by: tuple[str, ...], a: pl.Expr, b: pl.Expr,
                 value: pl.Expr = pl.len()) -> pl.DataFrame:
            return frame.group_by("pid", *by).agg(value.cast(pl.Float64).alias("value")).select(
                pl.lit(metric).alias("metric"), "pid", a.alias("a"), b.alias("b"), "value")

        def of(*kinds: _K) -> pl.DataFrame | None:
            return ev.filter(kind.is_in([int(k) for k in kinds]) & ok) if present & set(kinds) else None

        out = [pl.DataFrame(schema=_TOTALS)]
        if (launches := of(_K.launch)) is not None:
            out += [rows(launches, "launches", (), none, none), self._kernels(launches)]
        if (mem := of(_K.alloc, _K.tensor_alloc)) is not None:
            tensor = pl.col("kind") == int(_K.tensor_alloc)
            layer = pl.when(tensor).then(pl.lit("tensor")).otherwise(pl.lit("driver"))
            memory_kind = pl.when(tensor).then(none).when(pl.col("pinned")).then(pl.lit("pinned")).otherwise(
                pl.lit("device"))
            out += [rows(mem, "allocations", ("kind", "pinned"), layer, memory_kind),
                    rows(mem, "allocated_bytes", ("kind", "pinned"), layer, memory_kind, size)]
        if present & {_K.alloc, _K.free, _K.tensor_alloc, _K.tensor_free}:
            self._track_live(ev)
        if (copies := of(_K.memcpy)) is not None:
            direction = pl.col("copy_kind").replace_strict(list(range(len(schema.COPY_KIND_NAMES))),
                                                           schema.COPY_KIND_NAMES, return_dtype=pl.String)
            out += [rows(copies, "copies", ("copy_kind",), direction, none),
                    rows(copies, "copied_bytes", ("copy_kind",), direction, none, size)]
        if (syncs := of(_K.sync)) is not None:
            out += [rows(syncs, "syncs", (), none, none), rows(syncs, "sync_seconds", (), none, none, seconds)]
        if not ev["ok"].all():
            out.append(rows(ev.filter(~ok), "failed_calls", ("api", "ret"), api, error_name(api, pl.col("ret"))))
        if (nccl := of(_K.collective, _K.p2p)) is not None:
            timed = nccl.filter(pl.col("timed"))
            timed = timed.with_columns(bucket=pl.Series(
                np.searchsorted(_BOUNDS_S, timed["seconds"].to_numpy(), side="left").astype(np.uint8)))
            out += [rows(nccl, "nccl_calls", ("api",), api, none), rows(nccl, "nccl_bytes", ("api",), api, none, size),
                    rows(timed, "nccl_call_seconds_sum", ("api",), api, none, seconds),
                    rows(timed, "nccl_call_seconds_bucket", ("api", "bucket"), api, pl.col("bucket").cast(pl.String))]
        return pl.concat(out).cast(_TOTALS)

    def _kernels(self, launches: pl.DataFrame) -> pl.DataFrame:
        """Launches by (pid, kernel label), the labels past a process's cap summed under OTHER_KERNELS."""
        by = launches.group_by("pid", "func").len().join(self._names, on=["pid", "func"], how="left").with_columns(
            a=pl.coalesce("kernel", hex_expr(pl.col("func")))).group_by("pid", "a").agg(pl.col("len").sum())
        fresh = by.join(self._admitted, on=["pid", "a"], how="anti")
        if fresh.height:
            held = self._admitted.group_by("pid").len("held")
            admit = (fresh.join(held, on="pid", how="left").sort("len", "a", descending=[True, False])
                     .with_columns(rank=pl.int_range(pl.len()).over("pid") + pl.col("held").fill_null(0))
                     .filter(pl.col("rank") < KERNELS_PER_PROCESS).select("pid", "a"))
            self._admitted = pl.concat([self._admitted, admit])
        kept = by.join(self._admitted.with_columns(keep=pl.lit(True)), on=["pid", "a"], how="left")
        return kept.with_columns(a=pl.when(pl.col("keep")).then(pl.col("a")).otherwise(pl.lit(OTHER_KERNELS))).group_by(
            "pid", "a").agg(pl.col("len").sum().cast(pl.Float64).alias("value")).select(
            pl.lit("kernel_launches").alias("metric"), "pid", "a", pl.lit("").alias("b"), "value")

    def _fold_names(self, recs: np.ndarray) -> None:
        """handle -> kernel name, the latest of each; a CUfunction that aliases a CUkernel
        (cuKernelGetFunction) named in an earlier update takes that name too."""
        named = names_frame(recs, self._api_names).select(
            "pid", pl.col("handle").alias("func"), pl.col("name").alias("kernel"))
        self._names = pl.concat([self._names, named]).unique(["pid", "func"], keep="last", maintain_order=True)
        aliases = recs[(recs["alias"] != 0) & (recs["name"] == b"")]
        if aliases.size:
            late = pl.DataFrame({"pid": aliases["pid"], "func": aliases["handle"], "alias": aliases["alias"]}).join(
                self._names.rename({"func": "alias"}), on=["pid", "alias"]).select("pid", "func", "kernel")
            self._names = pl.concat([self._names, late]).unique(["pid", "func"], keep="last", maintain_order=True)

    def _track_live(self, ev: pl.DataFrame) -> None:
        """Each (pid, tensor or driver, address)'s last allocation or free of the update
        decides whether it is held: a free names no size (nor, for the driver, which memory)."""
        kind = pl.col("kind")
        ops = ev.filter(kind.is_in([int(_K.alloc), int(_K.free), int(_K.tensor_alloc), int(_K.tensor_free)])
                        & pl.col("ok") & (pl.col("ptr") != 0)).with_row_index("seq")
        last = ops.with_columns(
            tensor=kind.is_in([int(_K.tensor_alloc), int(_K.tensor_free)]),
            alloc=kind.is_in([int(_K.alloc), int(_K.tensor_alloc)]),
        ).group_by("pid", "tensor", "ptr").agg(pl.col("alloc", "pinned", "size").sort_by("seq").last())
        kept = self._live.join(last.select("pid", "tensor", "ptr"), on=["pid", "tensor", "ptr"], how="anti")
        self._live = pl.concat([kept, last.filter(pl.col("alloc")).select(list(_LIVE)).cast(_LIVE)])

    def _live_rows(self) -> pl.DataFrame:
        """live_bytes of every (pid, layer, memory) that ever allocated: 0 once all is freed."""
        keys = self._totals.filter(pl.col("metric") == "allocated_bytes").select("pid", "a", "b")
        tensor = pl.col("tensor")
        held = self._live.group_by("pid", "tensor", "pinned").agg(pl.col("size").sum().cast(pl.Float64).alias("value"))
        held = held.select(
            "pid", pl.when(tensor).then(pl.lit("tensor")).otherwise(pl.lit("driver")).alias("a"),
            pl.when(tensor).then(pl.lit("")).when(pl.col("pinned")).then(pl.lit("pinned")).otherwise(pl.lit("device"))
            .alias("b"), "value").group_by("pid", "a", "b").agg(pl.col("value").sum())
        return keys.join(held, on=["pid", "a", "b"], how="left").select(
            pl.lit("live_bytes").alias("metric"), "pid", "a", "b", pl.col("value").fill_null(0.0)).cast(_TOTALS)

    # ------------------------------------------------------------------ exited processes

    def _check_exited(self) -> None:
        now = self._clock()
        for pid, p in self.processes.items():
            if p.exited_at is None and (p.start is None or _start_time(self._proc, pid) != p.start):
                p.exited_at = now
        self._drop([pid for pid, p in self.processes.items()
                    if p.exited_at is not None and now - p.exited_at >= self.keep_exited_s])

    def _drop(self, pids: list[int]) -> None:
        """Every series of these processes goes."""
        if not pids:
            return
        for pid in pids:
            del self.processes[pid]
        gone = ~pl.col("pid").is_in(pids)
        self._totals, self._live = self._totals.filter(gone), self._live.filter(gone)
        self._names, self._admitted = self._names.filter(gone), self._admitted.filter(gone)


def _comm(proc: Path, pid: int) -> str:
    try:
        return (proc / str(pid) / "comm").read_text().rstrip("\n")
    except OSError:
        return ""


def collect(metrics: Metrics, prefix: str = "pasta_") -> Iterator:
    """The metric families of what ``metrics`` published last (prometheus_client's collector protocol)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

    pub = metrics.published
    family = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}
    rows: dict[str, list[tuple]] = {}
    for metric, pid, a, b, value in pub.totals.sort("metric", "pid", "a", "b").iter_rows():
        rows.setdefault(metric, []).append((pid, a, b, value))
    empty = ("",) * len(PROCESS_LABELS)
    for spec in SPECS:
        fam = family[spec.type](prefix + spec.name, spec.help, labels=[*PROCESS_LABELS, *spec.labels])
        if spec.type == "histogram":
            _histograms(fam, rows.get(spec.name + "_bucket", []), rows.get(spec.name + "_sum", []), pub.processes)
        else:
            for pid, a, b, value in rows.get(spec.name, []):
                fam.add_metric([*pub.processes.get(pid, empty), *(a, b)[:len(spec.labels)]], value)
        yield fam
    for spec in DAEMON_SPECS:
        fam = family[spec.type](prefix + spec.name, spec.help, labels=list(spec.labels))
        for (name, label), value in pub.daemon.items():
            if name == spec.name:
                fam.add_metric([label] if spec.labels else [], value)
        yield fam


def _histograms(fam, buckets: list[tuple], sums: list[tuple], processes: dict[int, tuple[str, ...]]) -> None:
    counts: dict[tuple[int, str], np.ndarray] = {}
    for pid, op, bucket, n in buckets:
        counts.setdefault((pid, op), np.zeros(len(NCCL_BUCKETS_S) + 1))[int(bucket)] += n
    total = {(pid, op): s for pid, op, _, s in sums}
    bounds = [*(f"{b:g}" for b in NCCL_BUCKETS_S), "+Inf"]
    for (pid, op), n in counts.items():
        if pid in processes:
            fam.add_metric([*processes[pid], op], list(zip(bounds, np.cumsum(n).tolist())), total.get((pid, op), 0.0))


class Server:
    """/metrics over HTTP (prometheus_client's server, a thread of its own): the
    counts above, and the daemon's own CPU, memory and open files
    (prometheus_client's process collector: process_cpu_seconds_total, process_resident_memory_bytes, ...)."""

    def __init__(self, metrics: Metrics, host: str, port: int):
        from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server

        registry = CollectorRegistry()
        ProcessCollector(registry=registry)
        registry.register(_Collector(metrics))
        try:
            self._httpd, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as e:
            why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be listened on: {e.strerror or e}"
            raise PastaError(f"--metrics {_show(host, port)} {why}",
                             hint="give another with --metrics HOST:PORT, or --metrics off") from None
        self.address = _show(host, self._httpd.server_address[1])

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


class _Collector:
    def __init__(self, metrics: Metrics):
        self._metrics = metrics

    def collect(self) -> Iterator:
        return collect(self._metrics)


def _show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
