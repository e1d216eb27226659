"""Seeded synthetic captures: host events, names and processes, plus device
frames (schema.DEVICE_FRAMES) that agree with them, for tests, benchmarks and
for building the offline side before a GPU run exists.

The generator knows the truth: every access sample is drawn inside an
allocation instance live at its launch (or, for a known share, outside any),
every device launch belongs to a known host launch, and the GPU clock runs
with a known drift against CLOCK_MONOTONIC.  `Truth` carries what tests check.

Layout it mimics (what real multi-process captures look like): several processes on one GPU
with the same-looking address layouts, allocations in fixed slots whose
addresses are reused by later allocations of other sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from .. import schema
from . import synthetic_host, synthetic_nccl, synthetic_tensors

MONO0 = 5_000_000_000_000  # CLOCK_MONOTONIC at the capture's start: 83 min of uptime
GPU0 = 1_764_000_000_000_000_000  # %globaltimer: wall-clock-like
HEAP = 0x7F00_0000_0000  # where each process's device allocations start
SLOT = 1 << 22  # 4 MiB per allocation slot; instances in a slot reuse its base


@dataclass(frozen=True)
class Spec:
    pids: int = 4
    launches: int = 1_000  # host launch events, all processes together
    allocations: int = 100  # allocation instances, all processes together
    accesses: int = 10_000  # device access sample rows
    seed: int = 0
    threads: int = 2  # launching threads per process
    kernels: int = 8  # distinct kernels per process
    span_ns: int = 60_000_000_000  # capture length
    drift_ppm: float = 20.0  # GPU timer rate error against CLOCK_MONOTONIC
    outside_share: float = 0.01  # accesses to no allocation at all
    args_per_launch: int = 4  # allocation slots each launch touches (a kernel's buffer arguments)
    page_hist: bool = True  # also write page_hist and alloc_touch derived from the samples
    chunk_rows: int = 5_000_000  # access rows generated per chunk (bounds the generator's memory)
    syncs: int = 0  # cuStreamSynchronize calls, all processes together, each blocking 50 µs to 5 ms
    failed_allocs: int = 0  # cuMemAlloc_v2 calls that return CUDA_ERROR_OUT_OF_MEMORY
    stacks: bool = False  # every call carries a Python stack from CALL_PATHS (stacks.parquet)
    copies: int = 0  # h2d/d2h copies of a few host buffers (repeats), plus one storm of small copies; no stacks
    tensors: int = 0  # PyTorch tensors (tensor_alloc/tensor_free events, synthetic_tensors), all processes together
    collectives: int = 0  # NCCL AllReduce calls per process, each process a rank of one communicator (synthetic_nccl)


#: The Python stack of each kind of call when Spec.stacks is set, innermost
#: frame first: (function, file, line).  Syncs alternate between two sites.
CALL_PATHS: dict[str, list[tuple[str, str, int]]] = {
    "launch": [("Model.forward", "model.py", 41), ("Trainer.step", "train.py", 88), ("main", "train.py", 120)],
    "alloc": [("make_buffer", "buffers.py", 12), ("Trainer.__init__", "train.py", 30), ("main", "train.py", 115)],
    "alloc_managed": [("make_managed", "buffers.py", 20), ("Trainer.__init__", "train.py", 31),
                      ("main", "train.py", 115)],
    "free": [("Buffer.release", "buffers.py", 44), ("Trainer.step", "train.py", 95), ("main", "train.py", 120)],
    "sync": [("Trainer.step", "train.py", 90), ("main", "train.py", 120)],
    "sync_eval": [("evaluate", "eval.py", 7), ("main", "train.py", 125)],
    # tensors (Spec.tensors): the weights, the activations of each step, a cache that keeps growing
    "tensor_weights": [("Linear.__init__", "model.py", 10), ("Trainer.__init__", "train.py", 28),
                       ("main", "train.py", 115)],
    "tensor_activation": [("Model.forward", "model.py", 43), ("Trainer.step", "train.py", 88),
                          ("main", "train.py", 120)],
    "tensor_cache": [("Trainer.log_metrics", "train.py", 101), ("Trainer.step", "train.py", 97),
                     ("main", "train.py", 120)],
}
CUDA_ERROR_OUT_OF_MEMORY = 2


@dataclass
class Truth:
    accesses: int = 0
    attributed: int = 0  # accesses inside an allocation live at their launch
    #: pid, base, alloc_ts_ns, samples: samples that hit each allocation instance
    per_alloc: pl.DataFrame = field(default_factory=pl.DataFrame)


def _pid_list(n: int) -> np.ndarray:
    return (4242 + 17 * np.arange(n)).astype(np.uint32)


def _gpu_of(mono: np.ndarray, drift_ppm: float) -> np.ndarray:
    """%globaltimer value at host time `mono` (int64 arithmetic)."""
    d = mono.astype(np.int64) - MONO0
    return (GPU0 + d + np.rint(d * (drift_ppm * 1e-6)).astype(np.int64)).astype(np.uint64)


def _allocations(spec: Spec, rng: np.random.Generator, pids: np.ndarray) -> pl.DataFrame:
    """Instances per slot: alternating live and free periods along the span."""
    per_pid = max(1, spec.allocations // spec.pids)
    slots = max(1, per_pid // 4)
    n = per_pid * spec.pids
    pid = np.repeat(pids, per_pid)
    slot = np.tile(np.arange(per_pid) % slots, spec.pids)
    # instance k of a slot lives in the k-th of that slot's equal time shares
    k = np.tile(np.arange(per_pid) // slots, spec.pids)
    per_slot = (per_pid + slots - 1) // slots
    share = spec.span_ns // per_slot
    alloc_ts = MONO0 + k * share + rng.integers(0, share // 10, n)
    life = rng.integers(share // 2, share * 9 // 10, n)
    free_ts = alloc_ts + life
    # the last instance of some slots is never freed (a leak, or alive at the end)
    never = (k == per_slot - 1) & (rng.random(n) < 0.3)
    size = (rng.integers(1, 64, n) * 4096 + rng.integers(0, 2, n) * 512).astype(np.uint64)
    size = np.minimum(size, SLOT).astype(np.uint64)
    return pl.DataFrame({
        "pid": pid, "base": (HEAP + slot.astype(np.int64) * SLOT).astype(np.uint64), "size": size,
        "alloc_ts_ns": alloc_ts.astype(np.int64),
        "free_ts_ns": pl.Series(np.where(never, 0, free_ts).astype(np.int64)).replace(0, None),
        "slot": slot.astype(np.int64),
        "tid": np.repeat(pids, per_pid).astype(np.uint32) + 1,
        "managed": rng.random(n) < 0.2,
    }).sort(["pid", "slot", "alloc_ts_ns"])


def _launches(spec: Spec, rng: np.random.Generator, pids: np.ndarray) -> pl.DataFrame:
    n = spec.launches
    pid = pids[rng.integers(0, spec.pids, n)]
    # strictly increasing: two probes never fire in the same nanosecond (a uprobe alone costs ~1 us),
    # and a tie in one thread would put its device callback before its own launch
    ts = MONO0 + np.sort(rng.integers(spec.span_ns // 100, spec.span_ns, n)) + np.arange(n)
    tid = pid + 1 + rng.integers(0, spec.threads, n).astype(np.uint32)
    kernel = rng.integers(0, spec.kernels, n)
    df = pl.DataFrame({
        "ts_ns": ts.astype(np.int64), "pid": pid, "tid": tid.astype(np.uint32),
        "func": (0x5555_0000_0000 + kernel * 0x1000).astype(np.uint64),
        "grid_x": (2 ** rng.integers(4, 12, n)).astype(np.uint32), "block_x": np.full(n, 256, np.uint32),
        "stream": (0x7000_0000 + rng.integers(0, 2, n) * 0x100).astype(np.uint64),
        "dur_ns": rng.integers(2_000, 8_000, n).astype(np.int64),
    }).sort(["pid", "ts_ns"])
    # the device module's per-process counter, 1-based
    return df.with_columns((pl.int_range(pl.len()).over("pid") + 1).cast(pl.UInt64).alias("launch_id"))


def _extra_calls(spec: Spec, rng: np.random.Generator, pids: np.ndarray) -> pl.DataFrame:
    """Spec.syncs sync calls and Spec.failed_allocs failed allocations, spread over the span."""
    n = spec.syncs + spec.failed_allocs
    pid = pids[rng.integers(0, spec.pids, n)]
    sync = np.arange(n) < spec.syncs
    return pl.DataFrame({
        "ts_ns": (MONO0 + rng.integers(spec.span_ns // 100, spec.span_ns, n)).astype(np.int64),
        "dur_ns": np.where(sync, rng.integers(50_000, 5_000_000, n), 3_000).astype(np.int64),
        "pid": pid, "tid": (pid + 1).astype(np.uint32),
        "api": np.where(sync, "cuStreamSynchronize", "cuMemAlloc_v2"), "kind": np.where(sync, "sync", "alloc"),
        "ret": np.where(sync, 0, CUDA_ERROR_OUT_OF_MEMORY).astype(np.int32),
        "stream": np.where(sync, 0x7000_0000, 0).astype(np.uint64),
        "size": np.where(sync, 0, 1 << 34).astype(np.uint64),
        # which of the sync sites: every other sync is in evaluate()
        "site": np.where(sync, np.where(rng.random(n) < 0.5, "sync", "sync_eval"), "alloc"),
    }).with_columns(pl.when(pl.col("kind") == "sync").then(pl.lit(None)).otherwise("size").alias("size"))


def _stacks(pids: np.ndarray) -> pl.DataFrame:
    """CALL_PATHS for every process: stack_id = 1 + the process's index * 16 + the path's."""
    rows = [
        (int(pid), 1 + p * 16 + s, depth, fn, file, line)
        for p, pid in enumerate(pids)
        for s, path in enumerate(CALL_PATHS.values())
        for depth, (fn, file, line) in enumerate(path)
    ]
    cols = list(zip(*rows))
    return pl.DataFrame({
        "pid": cols[0], "stack_id": cols[1], "depth": cols[2], "kind": ["python"] * len(rows), "function": cols[3],
        "file": cols[4], "line": cols[5], "module": [None] * len(rows), "addr": [0] * len(rows),
        "truncated": [False] * len(rows),
    }, schema=schema.STACKS_SCHEMA)


def _stack_ids(ev: pl.DataFrame, pids: np.ndarray) -> pl.Expr:
    """Each event's stack id in _stacks(pids), from its site."""
    site_index = pl.DataFrame({"site": list(CALL_PATHS), "s": list(range(len(CALL_PATHS)))})
    pid_index = pl.DataFrame({"pid": pids, "p": np.arange(pids.size)}).cast({"pid": pl.UInt32})
    return ev.join(site_index, on="site", how="left").join(pid_index, on="pid", how="left").select(
        (1 + pl.col("p") * 16 + pl.col("s")).cast(pl.UInt64).alias("stack_id"))["stack_id"]


def _events(launches: pl.DataFrame, allocs: pl.DataFrame, extra: pl.DataFrame, pids: np.ndarray,
            stacks: bool) -> pl.DataFrame:
    launch_ev = launches.select(
        "ts_ns", "dur_ns", "pid", "tid", pl.lit("cuLaunchKernel").alias("api"), pl.lit("launch").alias("kind"),
        pl.lit(0, pl.Int32).alias("ret"), "stream", "func", "grid_x", pl.lit(1, pl.UInt32).alias("grid_y"),
        pl.lit(1, pl.UInt32).alias("grid_z"), "block_x", pl.lit(1, pl.UInt32).alias("block_y"),
        pl.lit(1, pl.UInt32).alias("block_z"), pl.lit(0, pl.UInt32).alias("shmem"),
    )
    api = pl.when(pl.col("managed")).then(pl.lit("cuMemAllocManaged")).otherwise(pl.lit("cuMemAlloc_v2"))
    alloc_ev = allocs.select(
        "alloc_ts_ns", pl.lit(1500, pl.Int64).alias("dur_ns"), "pid", "tid", api.alias("api"),
        pl.lit("alloc").alias("kind"), pl.lit(0, pl.Int32).alias("ret"), pl.col("base").alias("ptr"), "size",
    ).rename({"alloc_ts_ns": "ts_ns"})
    free_ev = allocs.filter(pl.col("free_ts_ns").is_not_null()).select(
        "free_ts_ns", pl.lit(900, pl.Int64).alias("dur_ns"), "pid", "tid", pl.lit("cuMemFree_v2").alias("api"),
        pl.lit("free").alias("kind"), pl.lit(0, pl.Int32).alias("ret"), pl.col("base").alias("ptr"),
    ).rename({"free_ts_ns": "ts_ns"})
    ev = pl.concat([launch_ev.with_columns(pl.lit("launch").alias("site")),
                    alloc_ev.with_columns(pl.when(pl.col("api") == "cuMemAllocManaged").then(pl.lit("alloc_managed"))
                                          .otherwise(pl.lit("alloc")).alias("site")),
                    free_ev.with_columns(pl.lit("free").alias("site")), extra], how="diagonal_relaxed")
    ev = ev.sort(["ts_ns", "pid", "tid"], maintain_order=True)
    if stacks:
        ev = ev.with_columns(_stack_ids(ev, pids))
    return ev.with_columns(pl.lit("worker").alias("comm")).select(
        [pl.col(c).cast(t) if c in ev.columns or c == "comm" else pl.lit(None, t).alias(c)
         for c, t in schema.EVENTS_SCHEMA.items()]
    ).sort("ts_ns")


def _device_launches(spec: Spec, rng: np.random.Generator, launches: pl.DataFrame) -> dict[str, pl.DataFrame]:
    n = launches.height
    # the device callback runs inside the launch call: before that thread's next call
    room = launches.select(
        (pl.col("ts_ns").shift(-1).over(["pid", "tid"], order_by="ts_ns") - pl.col("ts_ns")).fill_null(10**6)
    ).to_series().to_numpy()
    begin = launches["ts_ns"].to_numpy() + np.minimum(rng.integers(200, 2_000, n), room - 1)
    start = begin + rng.integers(5_000, 50_000, n)
    end = start + rng.integers(10_000, 200_000, n)
    dev = launches.select(
        "pid", "launch_id",
        pl.Series(begin.astype(np.uint64)).alias("host_mono_begin"),
        pl.Series((begin + 3_000).astype(np.uint64)).alias("host_mono_end"),
        pl.lit(0xC0, pl.UInt64).alias("ctx"), "stream", "func",
        (pl.col("launch_id").cast(pl.Int64) * 4 + pl.col("pid").cast(pl.Int64)).alias("grid_id"),
        "grid_x", pl.lit(1, pl.UInt32).alias("grid_y"), pl.lit(1, pl.UInt32).alias("grid_z"),
        "block_x", pl.lit(1, pl.UInt32).alias("block_y"), pl.lit(1, pl.UInt32).alias("block_z"),
        pl.lit(0, pl.UInt32).alias("device"), pl.lit(0, pl.UInt32).alias("correlation_id"),
        pl.lit(0, pl.UInt32).alias("name_id"), "tid",
        pl.format("kernel_{}", ((pl.col("func") - 0x5555_0000_0000) // 0x1000)).alias("name"),
    )
    summaries = launches.select(
        "pid", "launch_id",
        pl.Series(_gpu_of(start, spec.drift_ppm)).alias("gpu_t_first"),
        pl.Series(_gpu_of(end, spec.drift_ppm)).alias("gpu_t_last"),
        *[pl.lit(0, pl.UInt64).alias(c) for c in ("warp_instrs", "thread_instrs")],
        pl.Series(rng.integers(1, 1 << 20, n).astype(np.uint64)).alias("gld"),
        pl.Series(rng.integers(1, 1 << 19, n).astype(np.uint64)).alias("gst"),
        *[pl.lit(0, pl.UInt64).alias(c) for c in ("gatom", "gld_warp", "gst_warp", "gatom_warp", "bytes",
                                                    "shared", "local")],
        (pl.col("grid_x").cast(pl.UInt64)).alias("blocks_in"), (pl.col("grid_x").cast(pl.UInt64)).alias("blocks_out"),
        pl.lit(0, pl.UInt64).alias("dropped"),
    )
    # one CLOCK_SYNC round per second per process: 4 brackets, 1-20 us wide
    pids = launches["pid"].unique().sort().to_numpy()
    rounds = np.arange(0, spec.span_ns, 1_000_000_000)
    t = np.tile(np.repeat(rounds, 4), pids.size) + MONO0
    pid = np.repeat(pids, rounds.size * 4)
    width = rng.integers(1_000, 20_000, t.size)
    read = t + rng.integers(0, width + 1)
    sync = pl.DataFrame({
        "pid": pid.astype(np.uint32), "host_mono_before": t.astype(np.uint64),
        "gpu_globaltimer": _gpu_of(read, spec.drift_ppm), "host_mono_after": (t + width).astype(np.uint64),
        "device": np.zeros(t.size, np.uint32),
    })
    return {"launches": dev, "kernel_summaries": summaries, "clock_sync": sync}


def _access_chunk(spec: Spec, rng: np.random.Generator, n: int, launches: pl.DataFrame,
                  allocs: pl.DataFrame, inst_key: np.ndarray, per_pid_slots: int) -> tuple[pl.DataFrame, np.ndarray]:
    """n access samples and, per row, the index of the instance it hit (-1: none)."""
    li = rng.integers(0, launches.height, n)
    pid = launches["pid"].to_numpy()[li]
    lid = launches["launch_id"].to_numpy()[li]
    t = launches["ts_ns"].to_numpy()[li]
    pidx = np.searchsorted(np.unique(launches["pid"].to_numpy()), pid)
    # each launch reads and writes a few buffers: its argument slots, fixed per launch
    arg = rng.integers(0, spec.args_per_launch, n).astype(np.int64)
    slot = (lid.astype(np.int64) * 2_654_435_761 + pidx * 97 + arg * 40_503) % per_pid_slots
    gslot = pidx.astype(np.int64) * per_pid_slots + slot
    key = (gslot << 40) | (t - MONO0)
    inst = np.searchsorted(inst_key, key, side="right") - 1
    inst_c = np.maximum(inst, 0)
    a_slot = (inst_key[inst_c] >> 40)
    free = allocs["free_ts_ns"].fill_null(np.iinfo(np.int64).max).to_numpy()
    size = allocs["size"].to_numpy().astype(np.int64)
    live = (inst >= 0) & (a_slot == gslot) & (t < free[inst_c])
    outside = rng.random(n) < spec.outside_share
    hit = live & ~outside
    off = (rng.random(n) * np.where(hit, size[inst_c], SLOT)).astype(np.int64) & ~np.int64(3)
    base = HEAP + slot * SLOT
    addr = np.where(outside, HEAP - (1 << 30) + off, base + off).astype(np.uint64)
    lanes = np.where(rng.random(n) < 0.8, 0xFFFF_FFFF, rng.integers(1, 1 << 32, n)).astype(np.uint32)
    df = pl.DataFrame({
        "pid": pid.astype(np.uint32), "launch_id": lid.astype(np.uint64), "address": addr,
        "gpu_time": _gpu_of(t + 20_000, spec.drift_ppm), "block": rng.integers(0, 1024, n).astype(np.uint32),
        "warp": rng.integers(0, 8, n).astype(np.uint16), "size": np.full(n, 4, np.uint8),
        "flags": (rng.random(n) < 0.3).astype(np.uint8), "lanes": lanes,
    })
    return df, np.where(hit, inst, -1)


def _write_processes(p: Path, pids: np.ndarray) -> None:
    """processes.parquet: one python worker per pid, one rank each, as torchrun starts them."""
    pl.DataFrame({
        "pid": pids, "ppid": np.ones(pids.size, np.uint32), "comm": ["worker"] * pids.size,
        "cmdline": ["python train.py"] * pids.size, "cgroup": ["/"] * pids.size, "container_id": [None] * pids.size,
        "mnt_ns": np.zeros(pids.size, np.uint64), "start_ns": np.full(pids.size, MONO0 - 10**9, np.int64),
        "exit_ns": [None] * pids.size,
        "rank": np.arange(pids.size, dtype=np.int32), "local_rank": np.arange(pids.size, dtype=np.int32),
        "world_size": np.full(pids.size, pids.size, np.int32),
    }, schema=schema.PROCESSES_SCHEMA).write_parquet(p / "processes.parquet")


def write_capture(path: str | Path, spec: Spec = Spec()) -> Truth:
    """Write a capture directory with device frames under device/*.parquet."""
    p = Path(path)
    (p / "device").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    pids = _pid_list(spec.pids)
    allocs = _allocations(spec, rng, pids)
    launches = _launches(spec, rng, pids)
    nccl = None
    if spec.collectives:
        nccl = synthetic_nccl.calls(spec.collectives, pids, MONO0, spec.span_ns, np.random.default_rng([spec.seed, 3]))
        launches = pl.concat([launches.drop("launch_id"), nccl[1]]).sort(["pid", "ts_ns"]).with_columns(
            (pl.int_range(pl.len()).over("pid") + 1).cast(pl.UInt64).alias("launch_id"))
    # their own generator: the other frames stay what they were without them
    extra = _extra_calls(spec, np.random.default_rng([spec.seed, 1]), pids)
    events = _events(launches, allocs, extra, pids, spec.stacks)
    if nccl is not None:
        events = pl.concat([events, nccl[0]]).sort("ts_ns")
        nccl[2].write_parquet(p / "communicators.parquet")
    if spec.copies:
        copies = synthetic_host.copies(spec.copies, pids, spec.span_ns, MONO0, np.random.default_rng([spec.seed, 2]))
        events = pl.concat([events, copies]).sort("ts_ns")
    if spec.tensors:
        tensors = synthetic_tensors.tensors(spec.tensors, pids, spec.span_ns, MONO0,
                                            np.random.default_rng([spec.seed, 3]))
        if spec.stacks:
            tensors = tensors.with_columns(_stack_ids(tensors, pids))
        events = pl.concat([events, tensors.select(
            [pl.col(c).cast(t) if c in tensors.columns else pl.lit(None, t).alias(c)
             for c, t in schema.EVENTS_SCHEMA.items()])]).sort("ts_ns")
    events.write_parquet(p / "events-00000.parquet")
    if spec.stacks:
        _stacks(pids).write_parquet(p / "stacks.parquet")
    funcs = launches.select("pid", "func").unique().sort(["pid", "func"])
    funcs.select(
        "pid", pl.col("func").alias("handle"),
        pl.format("kernel_{}", ((pl.col("func") - 0x5555_0000_0000) // 0x1000)).alias("name"),
        pl.lit("module_get_function").cast(pl.Enum(schema.NAME_SOURCE_NAMES)).alias("source"),
        pl.lit(MONO0, pl.Int64).alias("ts_ns"), pl.lit("cuModuleGetFunction").cast(pl.Categorical).alias("api"),
    ).write_parquet(p / "names.parquet")
    _write_processes(p, pids)
    for name, df in _device_launches(spec, rng, launches).items():
        df.cast(schema.DEVICE_FRAMES[name]).write_parquet(p / "device" / f"{name}.parquet")

    per_pid_slots = int(allocs["slot"].max()) + 1
    pidx = np.searchsorted(pids, allocs["pid"].to_numpy())
    inst_key = ((pidx.astype(np.int64) * per_pid_slots + allocs["slot"].to_numpy()) << 40) | (
        allocs["alloc_ts_ns"].to_numpy() - MONO0)
    truth = Truth()
    hits = np.zeros(allocs.height, np.int64)
    writer = None
    pages: list[pl.DataFrame] = []
    touch: list[pl.DataFrame] = []
    samples_path = p / "device" / "access_samples.parquet"
    try:
        import pyarrow.parquet as pq

        left = spec.accesses
        while left > 0:
            n = min(left, spec.chunk_rows)
            left -= n
            df, inst = _access_chunk(spec, rng, n, launches, allocs, inst_key, per_pid_slots)
            df = df.cast(schema.DEVICE_FRAMES["access_samples"])
            hits += np.bincount(inst[inst >= 0], minlength=allocs.height)
            table = df.to_arrow()
            if writer is None:
                writer = pq.ParquetWriter(samples_path, table.schema, compression="zstd")
            writer.write_table(table, row_group_size=1 << 20)
            if spec.page_hist:
                lanes = pl.col("lanes").bitwise_count_ones().cast(pl.UInt64)
                pages.append(df.group_by("pid", "launch_id", (pl.col("address") // 65536).alias("page"))
                             .agg(lanes.sum().alias("count")))
                touch.append(df.with_columns(pl.Series("inst", inst)).filter(pl.col("inst") >= 0)
                             .group_by("pid", "launch_id", "inst")
                             .agg(lanes.sum().alias("touches"), (lanes * 4).sum().alias("bytes"),
                                  (pl.col("address") // 65536).n_unique().alias("unique_pages")))
    finally:
        if writer is not None:
            writer.close()
    if spec.page_hist and pages:
        pl.concat(pages).group_by("pid", "launch_id", "page").agg(pl.col("count").sum()).with_columns(
            pl.lit(16, pl.UInt32).alias("page_shift")
        ).cast(schema.DEVICE_FRAMES["page_hist"]).select(list(schema.DEVICE_FRAMES["page_hist"])).sort(
            ["pid", "launch_id", "page"]).write_parquet(p / "device" / "page_hist.parquet")
        bases = allocs.with_row_index("inst").select(pl.col("inst").cast(pl.Int64), pl.col("base").alias("alloc_base"))
        pl.concat(touch).group_by("pid", "launch_id", "inst").agg(
            pl.col("touches").sum(), pl.col("bytes").sum(), pl.col("unique_pages").max()
        ).join(bases, on="inst").cast(
            schema.DEVICE_FRAMES["alloc_touch"]).select(list(schema.DEVICE_FRAMES["alloc_touch"])).sort(
            ["pid", "launch_id", "alloc_base"]).write_parquet(p / "device" / "alloc_touch.parquet")
    truth.accesses = spec.accesses
    truth.attributed = int(hits.sum())
    truth.per_alloc = allocs.select("pid", "base", "alloc_ts_ns").with_columns(
        pl.Series("samples", hits.astype(np.uint32))).filter(pl.col("samples") > 0)
    manifest = {
        "format_version": ".".join(map(str, schema.CAPTURE_FORMAT_VERSION)), "tool": "pasta-trace synthetic",
        "command": ["synthetic", json.dumps(spec.__dict__)], "host": "synthetic", "pids": [int(x) for x in pids],
        "start_ns": MONO0, "end_ns": MONO0 + spec.span_ns,
        "clock": {"domain": "CLOCK_MONOTONIC", "start_ns": MONO0, "end_ns": MONO0 + spec.span_ns},
        "counts": {"events": events.height, "lost_events": 0, "lost_names": 0},
        "complete": True,
    }
    (p / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return truth


# --------------------------------------------------------------------------- --aggregate captures

#: The rows an --aggregate capture holds (schema.AGGREGATE_SCHEMA without the
#: timestamps): pid, api, kind, func, grid_x, block_x, ret, count, bytes.
#: Failed calls (ret not 0) are their own rows and moved no bytes.
AGGREGATE_ROWS: list[tuple] = [
    (4242, "cuLaunchKernel", "launch", 0x5555_0000_0000, 128, 256, 0, 1_000, 0),
    (4242, "cuLaunchKernel", "launch", 0x5555_0000_0000, 64, 256, 0, 500, 0),
    (4242, "cuLaunchKernel", "launch", 0x5555_0000_1000, 32, 128, 0, 250, 0),
    (4242, "cuLaunchKernel", "launch", 0x5555_0000_1000, 32, 128, 1, 2, 0),
    (4242, "cuMemAlloc_v2", "alloc", 0, 0, 0, 0, 10, 10 << 20),
    (4242, "cuMemAlloc_v2", "alloc", 0, 0, 0, 2, 3, 0),
    (4242, "cuMemAllocHost_v2", "alloc", 0, 0, 0, 0, 2, 1 << 20),
    (4242, "cuMemcpyHtoD_v2", "memcpy", 0, 0, 0, 0, 40, 4 << 20),
    (4242, "cuStreamSynchronize", "sync", 0, 0, 0, 0, 100, 0),
    (4259, "hipModuleLaunchKernel", "launch", 0x6666_0000_0000, 8, 64, 0, 7, 0),
    (4259, "hipMalloc", "alloc", 0, 0, 0, 0, 1, 4096),
]
#: names of the kernels the aggregate rows launch (4259's stays unnamed)
AGGREGATE_NAMES = [(4242, 0x5555_0000_0000, "kernel_0"), (4242, 0x5555_0000_1000, "kernel_1")]


def write_aggregate_capture(path: str | Path, *, lost_agg: int = 0, span_ns: int = 10_000_000_000) -> Path:
    """An --aggregate capture directory (no events; aggregate.parquet with
    AGGREGATE_ROWS, each row's calls spread over the first `span_ns`)."""
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    cols = ["pid", "api", "kind", "func", "grid_x", "block_x", "ret", "count", "bytes"]
    rows = pl.DataFrame([dict(zip(cols, r)) for r in AGGREGATE_ROWS])
    n = rows.height
    rows.with_columns(
        *(pl.lit(1, pl.UInt32).alias(c) for c in ("grid_y", "grid_z", "block_y", "block_z")),
        (MONO0 + pl.int_range(n) * 1_000).alias("first_ts_ns"),
        (MONO0 + span_ns - pl.int_range(n) * 1_000).alias("last_ts_ns"),
    ).select([pl.col(c).cast(t) for c, t in schema.AGGREGATE_SCHEMA.items()]).write_parquet(p / "aggregate.parquet")
    pl.DataFrame({
        "pid": [r[0] for r in AGGREGATE_NAMES], "handle": [r[1] for r in AGGREGATE_NAMES],
        "name": [r[2] for r in AGGREGATE_NAMES], "source": ["module_get_function"] * len(AGGREGATE_NAMES),
        "ts_ns": [MONO0] * len(AGGREGATE_NAMES), "api": ["cuModuleGetFunction"] * len(AGGREGATE_NAMES),
    }).cast({k: v for k, v in schema.NAMES_SCHEMA.items() if k != "reason"}).write_parquet(p / "names.parquet")
    pids = sorted({r[0] for r in AGGREGATE_ROWS})
    _write_processes(p, np.array(pids, np.uint32))
    manifest = {
        "format_version": ".".join(map(str, schema.CAPTURE_FORMAT_VERSION)), "tool": "pasta-trace synthetic",
        "command_line": ["pasta-trace", "--aggregate", "-a"], "host": "synthetic", "mode": "system",
        "pids": pids, "aggregate": True, "aggregate_max": schema.DEFAULT_AGGREGATE_MAX,
        "clock": {"domain": "CLOCK_MONOTONIC", "start_ns": MONO0, "end_ns": MONO0 + span_ns},
        "counts": {"events": 0, "names": len(AGGREGATE_NAMES), "lost_events": 0, "lost_names": 0,
                   "lost_inflight": 0, "lost_agg": lost_agg, "by_kind": {k: 0 for k in schema.KIND_NAMES}},
        "complete": True,
    }
    (p / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return p
