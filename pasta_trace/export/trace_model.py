"""What every trace exporter draws, prepared once as Polars frames.

Perfetto and Chrome JSON show the same things (docs/export.md): API calls on
thread tracks, kernel executions (and CUPTI memcpy/memset) on GPU-stream tracks
under their process, one arrow per launch from the API call to its execution,
and a live-device-memory counter per process.  This module computes those
frames column-wise; the writers only encode them.

`corr` ties a launch to its execution (the Chrome `correlation` arg and the
flow id in both formats).  It is numbered here, across processes, because CUPTI
correlation ids restart in every process; the device's own id is kept as
`cupti_correlation`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from .. import merge, schema
from ..call_result import done
from ..hexfmt import hex_series
from ..read import Capture
from ..tools.memory import memory_timeline

#: Categories of API calls, as PyTorch's profiler names them.
CAT_CUDA = "cuda_driver"
CAT_HIP = "cuda_runtime"  # PyTorch on ROCm files HIP runtime calls under this name
CAT_TENSOR = "pytorch_memory"  # tensor_alloc / tensor_free of PyTorch's allocators (libc10)

#: CUpti_ActivityMemcpyKind -> the name PyTorch traces give the copy
CUPTI_COPY_NAMES = {1: "Memcpy HtoD", 2: "Memcpy DtoH", 3: "Memcpy HtoA", 4: "Memcpy AtoH", 5: "Memcpy AtoA",
                    6: "Memcpy AtoD", 7: "Memcpy DtoA", 8: "Memcpy DtoD", 9: "Memcpy HtoH", 10: "Memcpy PtoP"}

#: Payload columns shown as arguments of an API call, in this order.
API_ARGS = ("stream", "func", "ptr", "size", "dst", "src", "copy_kind", "shmem",
            "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "aux")
#: Tensor events' own columns, shown as their arguments (`device` as tensor_device:
#: a name like "cuda:0", not the GPU index the device data calls `device`)
TENSOR_ARGS = ("tensor_device", "allocated_bytes", "reserved_bytes")


@dataclass
class TraceModel:
    #: pid, name, cmdline
    processes: pl.DataFrame
    #: pid, tid, name
    threads: pl.DataFrame
    #: pid, label ("GPU stream 0x..."): one row per GPU track
    streams: pl.DataFrame
    #: ts_ns, dur_ns (null: entry-only call), pid, tid, api, kind, cat, ret,
    #: API_ARGS and TENSOR_ARGS columns, stack_id (null: no stack), corr (launches only),
    #: coll_in, coll_out (NCCL collectives matched across ranks: the flow ids
    #: from the rank that entered before, to the rank that entered next)
    api: pl.DataFrame
    #: pid, label, stream, name, ts_ns, dur_ns (null: no device timing), corr,
    #: cupti_correlation, device (with device timing), grid_*/block_*,
    #: graph_id, graph_node_id (CUPTI's, of a kernel a graph launch ran),
    #: overlap_ns (see `serialized`)
    kernels: pl.DataFrame
    #: pid, label, stream (host handle, when CUPTI's stream id maps to one),
    #: stream_id (CUPTI's), cat (gpu_memcpy | gpu_memset), name ("Memcpy HtoD",
    #: "Memset"...), ts_ns, dur_ns, bytes, copy_kind (CUPTI's), cupti_correlation, device,
    #: overlap_ns
    memops: pl.DataFrame
    #: pid, label ("GPU memory"...), ts_ns, live_bytes: live device bytes
    #: after everything that happened at ts_ns
    memory: pl.DataFrame
    #: pid, stack_id, depth (0 = innermost), function, file, line: the frames
    #: of every stack an API call names
    stacks: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema={"pid": pl.UInt32, "stack_id": pl.UInt64, "depth": pl.UInt16, "function": pl.String,
                "file": pl.String, "line": pl.UInt32}))
    #: rank, local_rank, world_size of the distributed job the traced processes
    #: belong to, where one rank made every call (empty: unknown or several ranks)
    distributed: dict[str, int] = field(default_factory=dict)
    #: pid, tid, device ("cpu", "cuda:0"), ts_ns, ptr, delta_bytes (+ allocated, - freed: the event's bytes),
    #: allocated_bytes (the allocator's total where given, else the tensors seen live),
    #: reserved_bytes (0: none given): each tensor event, one source per process and
    #: device (tools.tensors), in time order: PyTorch profiler's "[memory]" events
    tensors: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(
        schema={"pid": pl.UInt32, "tid": pl.UInt32, "device": pl.String, "ts_ns": pl.Int64, "ptr": pl.UInt64,
                "delta_bytes": pl.Int64, "allocated_bytes": pl.Int64, "reserved_bytes": pl.Int64}))

    @property
    def n_events(self) -> int:
        return self.api.height + self.kernels.height + self.memops.height + self.memory.height + self.tensors.height


def _api_calls(cap: Capture) -> pl.DataFrame:
    calls = (
        cap.events.select(
            "ts_ns", "dur_ns", "pid", "tid",
            pl.col("api").cast(pl.Categorical),
            pl.col("kind").cast(pl.Categorical),
            "ret", *API_ARGS, "stack_id", pl.col("device").cast(pl.Categorical).alias("tensor_device"),
            "allocated_bytes", "reserved_bytes",
        )
        .with_columns(
            cat=pl.when(pl.col("kind").cat.starts_with("tensor_")).then(pl.lit(CAT_TENSOR))
            .when(pl.col("api").cat.starts_with("hip")).then(pl.lit(CAT_HIP)).otherwise(pl.lit(CAT_CUDA))
            .cast(pl.Categorical),
            copy_kind=pl.col("copy_kind").cast(pl.Categorical),
        )
        .collect()
    )
    return sorted_by(calls, "ts_ns", "pid", "tid")


def sorted_by(frame: pl.DataFrame, *keys: str, nulls_last: bool = False) -> pl.DataFrame:
    """`frame` sorted by `keys` (stable).  The order is found on the keys
    alone and the rows gathered only when it moves one: a capture's calls
    come in time order already, and sorting every column of them, even in
    order, costs as much as reading them."""
    order = frame.select(pl.arg_sort_by(*keys, maintain_order=True, nulls_last=nulls_last)).to_series().to_numpy()
    return frame if np.array_equal(order, np.arange(frame.height)) else frame[order]


#: Collective flow ids start here, far above the launch correlations (`corr`).
COLLECTIVE_FLOW_BASE = 1 << 48


def _collective_flows(cap: Capture, api: pl.DataFrame) -> pl.DataFrame:
    """pid, tid, ts_ns, coll_in, coll_out: each rank's entry into a
    collective (comm_id, seq) linked to the next rank's, in entry order, so
    the arrows run from the first rank in to the last."""
    key = ["comm_id", "seq"]
    flows = (
        merge.collective_entries(cap).select("pid", "tid", "ts_ns", *key)
        .sort(*key, "ts_ns", "pid", "tid")
        .with_row_index("_i")
        .with_columns(_first=pl.col("_i").min().over(key), _last=pl.col("_i").max().over(key))
        .select("pid", "tid", "ts_ns",
                coll_in=pl.when(pl.col("_i") > pl.col("_first")).then(pl.col("_i") - 1 + COLLECTIVE_FLOW_BASE),
                coll_out=pl.when(pl.col("_i") < pl.col("_last")).then(pl.col("_i") + COLLECTIVE_FLOW_BASE))
        .unique(["pid", "tid", "ts_ns"], keep="first")
    )
    if not (api["kind"] == "collective").any():  # none among the calls: no second read of the events to find none
        return pl.DataFrame(schema=flows.collect_schema())
    return flows.collect()


#: the columns of merge.kernel_executions the trace draws (the rest, device
#: counters among them, are never read: left out before the merge computes them)
KERNEL_COLUMNS = ("pid", "launch_seq", "ts_ns", "stream", "name", "gpu_start_ns", "gpu_end_ns", "correlation_id",
                  "device", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "via_graph", "ret",
                  "graph_id", "graph_node_id")


def _launch_rows(api: pl.DataFrame, ex: pl.DataFrame) -> pl.Series:
    """Per row of `ex`: the row of `api` holding its launch (null: none), the
    launches numbered as merge.host_launches numbers them (by pid, ts_ns, tid,
    stable: 1:1 even when two calls share a timestamp).  Numbered with a
    stable numpy sort and looked up by position, not sorted and joined in
    Polars: on 10^7 launches each of those costs seconds."""
    keys = ("pid", "ts_ns", "tid")
    if any(api[k].null_count() for k in keys) or ex["pid"].null_count():
        launches = (
            api.lazy().with_row_index("_row").filter(pl.col("kind") == "launch")
            .sort(*keys, maintain_order=True)
            .select("_row", "pid", launch_seq=pl.int_range(pl.len(), dtype=pl.Int64).over("pid"))
        )
        return ex.lazy().select("pid", "launch_seq").join(
            launches, on=["pid", "launch_seq"], how="left", maintain_order="left").collect()["_row"]
    rows = np.flatnonzero((api["kind"] == "launch").fill_null(False).to_numpy())
    pid, ts, tid = (api[k].to_numpy()[rows] for k in keys)
    if _in_order(ts, pid, tid):
        # (the model's calls are): a stable sort by pid alone gives (pid, ts_ns, tid), and pids,
        # numbered densely, sort in linear time where a lexsort of three keys takes seconds
        pids, dense = np.unique(pid, return_inverse=True)
        order = np.argsort(dense.astype(np.uint16) if len(pids) <= 1 << 16 else dense, kind="stable")
    else:
        order = np.lexsort((tid, ts, pid))  # stable: calls with equal keys keep their order in api
    by_pid, rows = pid[order], rows[order]
    first = np.searchsorted(by_pid, ex["pid"].to_numpy(), side="left")
    count = np.searchsorted(by_pid, ex["pid"].to_numpy(), side="right") - first
    seq = ex["launch_seq"].fill_null(-1).to_numpy()
    found = (seq >= 0) & (seq < count)
    at = np.where(found, first + np.where(found, seq, 0), 0)
    return pl.Series("_row", rows[at] if len(rows) else np.zeros(len(at), dtype=np.int64)).set(
        pl.Series(~found), None).cast(pl.UInt32)


def _in_order(*keys: np.ndarray) -> bool:
    """Whether rows are sorted by `keys` (the first the most significant)."""
    ok = np.ones(max(len(keys[0]) - 1, 0), dtype=bool)
    for k in reversed(keys):
        ok = (k[1:] > k[:-1]) | ((k[1:] == k[:-1]) & ok)
    return bool(ok.all())


def _kernels(api: pl.DataFrame, ex: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Kernel executions with a `corr` shared with their launch; returns
    (api with corr, kernels)."""
    # a kernel a graph launch ran has no launch call of its own: the launch calls are numbered
    # among the other rows (the graph launch call is drawn, not tied to each of its kernels)
    direct = ex.select("pid", pl.when(~pl.col("via_graph").fill_null(False)).then(
        pl.col("launch_seq") - pl.col("via_graph").fill_null(False).cast(pl.Int64).cum_sum().over(
            "pid", order_by="launch_seq")).alias("launch_seq")) if ex["via_graph"].any() else ex
    # a failed launch call ran no kernel: no kernel slice, no flow from its call
    ex = sorted_by(ex.with_columns(_launch_rows(api, direct)), "_row", "ts_ns", nulls_last=True).filter(
        done()).with_row_index("corr", offset=1)
    # put in place by row number: a join would copy every column of the API calls
    corr_of_row = ex.filter(pl.col("_row").is_not_null()).select("_row", "corr")
    corr = np.zeros(api.height, dtype=np.uint32)
    has = np.zeros(api.height, dtype=bool)
    corr[corr_of_row["_row"].to_numpy()] = corr_of_row["corr"].to_numpy()
    has[corr_of_row["_row"].to_numpy()] = True
    api = api.with_columns(pl.Series("corr", corr, dtype=ex.schema["corr"]).set(pl.Series(~has), None))
    has_gpu = pl.col("gpu_start_ns").is_not_null() & pl.col("gpu_end_ns").is_not_null()
    kernels = ex.with_columns(label=hex_series(ex["stream"], "GPU stream ")).select(
        "pid",
        label=pl.col("label").fill_null(pl.lit("GPU stream (unknown)")),
        stream="stream",
        name=pl.col("name").cast(pl.Categorical),  # as _kernel_rows gives it
        ts_ns=pl.when(has_gpu).then(pl.col("gpu_start_ns")).otherwise(pl.col("ts_ns")),
        dur_ns=pl.when(has_gpu).then(pl.col("gpu_end_ns") - pl.col("gpu_start_ns")),
        corr="corr",
        cupti_correlation="correlation_id",
        device=pl.when(has_gpu).then(pl.col("device")),
        grid_x="grid_x", grid_y="grid_y", grid_z="grid_z",
        block_x="block_x", block_y="block_y", block_z="block_z",
        graph_id="graph_id", graph_node_id="graph_node_id",
    )
    return api, kernels


KERNEL_SCHEMA = schema.TIMELINE_FRAMES["kernels"]


def _host_kernels(cap: Capture, api: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """`_kernels` of a capture without device data: each launch call is its
    kernel's only execution, in call order, without device timing, named as
    merge.kernel_executions names it.  Taken from the calls in memory: the
    merge would read the launches again and number, sort and match them all
    to find the same rows (a quarter of an export's time on 10^7 calls)."""
    # a failed launch call ran no kernel: no kernel slice, no flow from its call
    rows = np.flatnonzero(((api["kind"] == "launch") & api.select(done())["ret"]).fill_null(False).to_numpy())
    # the columns first, then the rows: gathering every column of the calls costs seconds at 10^7
    launches = api.select(
        *(pl.col(c).cast(KERNEL_SCHEMA[c]) for c in ("pid", "stream", "func", "ts_ns")),
        *(pl.col(c).cast(KERNEL_SCHEMA[c]) for c in KERNEL_COLUMNS if c.startswith(("grid_", "block_"))))[rows]
    corr = np.zeros(api.height, dtype=np.uint32)
    corr[rows] = np.arange(1, len(rows) + 1, dtype=np.uint32)
    has = np.zeros(api.height, dtype=bool)
    has[rows] = True
    api = api.with_columns(pl.Series("corr", corr, dtype=pl.UInt32).set(pl.Series(~has), None))
    kernels = _kernel_rows(cap, launches, 0)
    return api, pl.concat([kernels, _graph_kernels(cap, kernels, len(rows))], how="vertical")


def _graph_kernels(cap: Capture, kernels: pl.DataFrame, first_corr: int) -> pl.DataFrame:
    """The kernels CUDA graph launches ran (merge.graphs), shaped as `kernels`:
    on the graph launch's stream at its time, named as merge.kernel_executions
    names them; no launch call of their own (corr past the launch calls')."""
    cols = {c: KERNEL_SCHEMA[c] for c in ("pid", "stream", "func", "ts_ns", "grid_x", "grid_y", "grid_z", "block_x",
                                          "block_y", "block_z")}
    graph = merge.graph_kernel_launches(cap, cols)
    if not graph.height:
        return kernels.clear()
    return _kernel_rows(cap, graph, first_corr).select(kernels.columns).cast(kernels.schema)


def _kernel_rows(cap: Capture, launches: pl.DataFrame, first_corr: int) -> pl.DataFrame:
    """Kernel rows without device timing, one per launch row (pid, stream, func,
    ts_ns, grid, block), on its stream's track, named as merge.kernel_executions
    names them, numbered from `first_corr` + 1."""
    named = merge.kernel_names(cap, launches.lazy().select("pid", "func", "ts_ns").with_row_index("_i")).sort(
        "_i").collect()["name"]
    name = named.fill_null(hex_series(launches["func"], "unknown@").cast(pl.Categorical)) if named.null_count() \
        else named
    return launches.select(
        "pid",
        label=hex_series(launches["stream"], "GPU stream ").fill_null("GPU stream (unknown)"),
        stream="stream",
        name=name,  # a categorical: 10^7 launches share a few names (the encoders look each up once)
        ts_ns="ts_ns",
        dur_ns=pl.lit(None, dtype=pl.Int64),
        corr=pl.int_range(first_corr + 1, first_corr + 1 + pl.len(), dtype=pl.UInt32),
        cupti_correlation=pl.lit(None, dtype=KERNEL_SCHEMA["correlation_id"]),
        device=pl.lit(None, dtype=KERNEL_SCHEMA["device"]),
        grid_x="grid_x", grid_y="grid_y", grid_z="grid_z",
        block_x="block_x", block_y="block_y", block_z="block_z",
        graph_id=pl.lit(None, dtype=KERNEL_SCHEMA["graph_id"]),
        graph_node_id=pl.lit(None, dtype=KERNEL_SCHEMA["graph_node_id"]),
    )


def _memops(cap: Capture, ex: pl.LazyFrame) -> pl.DataFrame:
    """CUPTI memcpy/memset records, on the track of the host stream whose kernels
    carry the same CUPTI stream id (else a track named after that id)."""
    stream_of = (
        ex.filter(pl.col("correlation_id").is_not_null())
        .join(cap.device["cupti_kernels"].select("pid", "correlation_id", "stream_id"),
              on=["pid", "correlation_id"])
        .group_by("pid", "stream_id")
        .agg(pl.col("stream").first())
    )
    parts = [
        cap.device[frame].with_columns(cat=pl.lit(cat))
        for frame, cat in (("cupti_memcpy", "gpu_memcpy"), ("cupti_memset", "gpu_memset"))
    ]
    ops = (
        pl.concat(parts)
        .join(stream_of, on=["pid", "stream_id"], how="left")
        .sort("start", "pid")
        .collect()
    )
    return ops.with_columns(label=hex_series(ops["stream"], "GPU stream ")).select(
        "pid",
        label=pl.col("label").fill_null(pl.format("GPU stream #{}", pl.col("stream_id"))),
        stream="stream",
        stream_id="stream_id",
        cat="cat",
        name=pl.when(pl.col("cat") == "gpu_memset").then(pl.lit("Memset")).otherwise(
            pl.col("copy_kind").replace_strict(CUPTI_COPY_NAMES, default="Memcpy", return_dtype=pl.String)),
        ts_ns=pl.col("start").cast(pl.Int64),
        dur_ns=(pl.col("end").cast(pl.Int64) - pl.col("start").cast(pl.Int64)),
        bytes="bytes",
        copy_kind="copy_kind",
        cupti_correlation="correlation_id",
        device="device",
    )


def _memory(cap: Capture) -> pl.DataFrame:
    """Live device bytes after each allocation and free, one counter track per
    process (and device, when the merge knows it)."""
    tl = memory_timeline(cap)
    label = pl.lit("GPU memory")
    if "device" in tl.columns:
        label = pl.format("GPU memory (device {})", "device").fill_null(label)
    return (
        tl.select("pid", label=label, ts_ns="ts_ns", live_bytes="live_bytes")
        .unique(["pid", "label", "ts_ns"], keep="last", maintain_order=True)
    )


def _tensors(cap: Capture) -> pl.DataFrame:
    """TraceModel.tensors: the tensor memory timeline with each event's thread."""
    from ..tools.tensors import tensor_events, tensor_timeline

    tl = tensor_timeline(cap)
    tids = tensor_events(cap).select("pid", "device", "ts_ns", "ptr", "kind", "tid").unique(
        ["pid", "device", "ts_ns", "ptr", "kind"], keep="first").collect()
    return (tl.join(tids, on=["pid", "device", "ts_ns", "ptr", "kind"], how="left", maintain_order="left")
            .select("pid", pl.col("tid").fill_null(pl.col("pid")), "device", "ts_ns", "ptr",
                    # the event's own bytes, signed as PyTorch's profiler writes them (a free of a
                    # tensor from before the capture too); the timeline's delta where it has none
                    pl.when(pl.col("kind") == "tensor_alloc").then(pl.col("size").cast(pl.Int64))
                    .otherwise(-pl.col("size").cast(pl.Int64)).fill_null(pl.col("delta_bytes")).alias("delta_bytes"),
                    pl.col("held_bytes").alias("allocated_bytes"),
                    pl.col("reserved_bytes").cast(pl.Int64).fill_null(0)))


def _memory_with_tensors(cap: Capture, tensors: pl.DataFrame) -> pl.DataFrame:
    """`_memory`, and a counter per process and device of the tensor bytes held
    ("tensor memory (cuda:0)"), from the same timeline as the [memory] events."""
    driver = _memory(cap)
    held = (tensors.select("pid", label=pl.format("tensor memory ({})", "device"), ts_ns="ts_ns",
                           live_bytes="allocated_bytes")
            .unique(["pid", "label", "ts_ns"], keep="last", maintain_order=True))
    return pl.concat([driver, held.cast(dict(driver.schema))]) if held.height else driver


def _processes(cap: Capture, api: pl.DataFrame) -> pl.DataFrame:
    """pid, name, cmdline; in a cluster timeline the name leads with the
    process's node and rank, one process group per rank."""
    from_events = cap.events.group_by("pid").agg(comm=pl.col("comm").cast(pl.String).first())
    pids = pl.concat([api.lazy().select("pid"), cap.processes.select("pid")]).unique()
    name = pl.coalesce("comm", "comm_ev", pl.format("pid {}", "pid"))
    procs = (pids.join(cap.processes.unique("pid", keep="last").select("pid", "comm", "cmdline"), on="pid", how="left")
             .join(from_events, on="pid", how="left", suffix="_ev"))
    if "ranks" in cap.cluster:
        procs = procs.join(cap.cluster["ranks"].select("pid", "node", "rank", "host_pid"), on="pid", how="left")
        name = pl.when(pl.col("node").is_not_null()).then(pl.format(
            "{} rank {}: {} {}", "node", pl.col("rank").cast(pl.String).replace("-1", "?"), name,
            "host_pid")).otherwise(name)
    return procs.select("pid", name=name, cmdline=pl.col("cmdline")).sort("pid").collect()


def _distributed(cap: Capture, api: pl.DataFrame) -> dict[str, int]:
    """The job coordinates shared by every process that made a call; a key is
    left out where they differ or are unknown (a trace file stands for one rank
    in trace-analysis tools, so a capture of several ranks names none)."""
    cols = ("rank", "local_rank", "world_size")
    callers = cap.processes.join(api.lazy().select("pid").unique(), on="pid", how="semi")
    seen = callers.select(pl.col(c).drop_nulls().unique().implode() for c in cols).collect().row(0)
    known = {c: v[0] for c, v in zip(cols, seen) if len(v) == 1}
    return known if "rank" in known else {}


def _threads(cap: Capture) -> pl.DataFrame:
    return (
        cap.events.group_by("pid", "tid")
        .agg(name=pl.col("comm").cast(pl.String).first())
        .with_columns(pl.col("name").fill_null(pl.format("tid {}", "tid")))
        .sort("pid", "tid")
        .collect()
    )


def serialized(frame: pl.DataFrame) -> pl.DataFrame:
    """Work on one stream runs one item at a time, but clock conversion can
    leave neighbours overlapping by a few ns, which trace viewers draw as one
    nested in the other.  Each timed item starts no earlier than the previous
    one on its track ended; `overlap_ns` says by how much it was moved."""
    if frame["dur_ns"].null_count() == frame.height:  # no device timing: nothing to move
        return frame.with_columns(overlap_ns=pl.lit(None, dtype=frame.schema["ts_ns"]))
    end = pl.col("ts_ns") + pl.col("dur_ns")
    prev_end = end.cum_max().forward_fill().shift(1).over("pid", "label", order_by="ts_ns")
    moved = pl.when(pl.col("dur_ns").is_not_null() & (prev_end > pl.col("ts_ns"))).then(prev_end - pl.col("ts_ns"))
    return frame.with_columns(overlap_ns=moved).with_columns(
        ts_ns=pl.col("ts_ns") + pl.col("overlap_ns").fill_null(0),
        dur_ns=(pl.col("dur_ns") - pl.col("overlap_ns").fill_null(0)).clip(lower_bound=0),
    )


def build(cap: Capture) -> TraceModel:
    api = _api_calls(cap)
    if "kernels" in cap.merged or cap.has_device_data:
        ex = merge.kernel_executions(cap).select(KERNEL_COLUMNS).collect()  # used twice: computed once
        api, kernels = _kernels(api, ex)
        ex = ex.lazy()
    else:
        api, kernels = _host_kernels(cap, api)
        ex = pl.LazyFrame(schema={k: KERNEL_SCHEMA[k] for k in ("pid", "stream", "correlation_id")})
    # joined on the three key columns only (flows are unique per key: one row per call), and
    # put beside the calls: joining the calls themselves would copy every column of them
    key = ["pid", "tid", "ts_ns"]
    collectives = _collective_flows(cap, api)
    if collectives.height:
        flows = api.select(key).join(collectives, on=key, how="left", maintain_order="left")
        api = api.with_columns(flows["coll_in"], flows["coll_out"])
    else:  # no collective: no join of every call's keys to find none
        api = api.with_columns(pl.lit(None, dtype=collectives.schema[c]).alias(c) for c in ("coll_in", "coll_out"))
    kernels = serialized(kernels)
    memops = serialized(_memops(cap, ex))
    # a label names one host stream (or CUPTI stream id): the distinct keys first, not 10^7 strings hashed
    streams = (
        pl.concat([f.unique(keys).select("pid", "label")
                   for f, keys in ((kernels, ["pid", "stream"]), (memops, ["pid", "stream", "stream_id"]))])
        .unique(maintain_order=True)
        .sort("pid", "label")
    )
    tensors = _tensors(cap)
    return TraceModel(
        processes=_processes(cap, api),
        threads=_threads(cap),
        streams=streams,
        api=api,
        kernels=kernels,
        memops=memops,
        memory=_memory_with_tensors(cap, tensors),
        stacks=cap.stacks.select("pid", "stack_id", "depth", "function", "file", "line").collect(),
        distributed=_distributed(cap, api),
        tensors=tensors,
    )
