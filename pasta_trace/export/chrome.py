"""Chrome trace-event JSON writer, named the way PyTorch's profiler names things,
so chrome://tracing, ui.perfetto.dev and trace-analysis tools built for PyTorch
traces (HTA and others) read it.

  API calls        ph X, cat cuda_driver (CUDA) / cuda_runtime (HIP), on the calling thread;
                   tensor events (PyTorch) ph i, cat pytorch_memory, with device and the allocator's totals
  kernels          ph X, cat kernel, on a "GPU stream 0x..." thread of the process
  copies, memsets  ph X, cat gpu_memcpy / gpu_memset (CUPTI records only)
  launch -> kernel ph s / f, cat and name ac2g, id = args.correlation on both ends
  live memory      ph C, one counter per process (and device): the driver's live bytes, and the
                   tensor bytes held per device ("tensor memory (cuda:0)")
  tensor memory    "[memory]" instants as PyTorch's profiler writes them (ph i, cat cpu_instant_event,
                   args Total Allocated, Total Reserved, Bytes, Addr, Device Type, Device Id), so tools
                   made for PyTorch traces (HTA's memory views) read the curve
  names            ph M process_name / thread_name
  caller stacks    "stackFrames" (one node per frame, "function file:line", parent = its caller)
                   and "sf" on each API call that has a stack

Timestamps and durations are µs written with exactly three decimals (ns
precision).  The lines are formatted column-wise by Polars and written in chunks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

import polars as pl

from .. import schema
from ..hexfmt import hex_series
from .trace_model import TraceModel

#: Above this many events chrome://tracing becomes slow or runs out of memory.
LARGE_EVENTS = 1_000_000
#: Stream tracks are threads of their process; numbered above any real tid
#: (Linux pid_max is at most 2^22).
STREAM_TID_BASE = 1 << 30
CHUNK_ROWS = 200_000
#: API call arguments that are handles or addresses: "0x..." strings
HANDLES = ("stream", "func", "ptr", "dst", "src")

def json_strings(s: pl.Series) -> pl.Series:
    """Each string as a JSON string literal; escaped once per distinct value."""
    s = s.cast(pl.String)  # the trace model holds names as categoricals
    uniq = s.unique().drop_nulls()
    table = pl.DataFrame({"v": uniq, "j": [json.dumps(v) for v in uniq.to_list()]},
                         schema={"v": pl.String, "j": pl.String})
    return s.to_frame("v").join(table, on="v", how="left", maintain_order="left")["j"]


def _us(ns: pl.Expr) -> pl.Expr:
    """ns -> µs as a JSON number with three decimals, without float rounding."""
    return pl.format("{}.{}", ns // 1000, (ns % 1000).cast(pl.String).str.zfill(3))


def _arg(name: str, value: pl.Expr) -> pl.Expr:
    """`"name":value`, null where value is null."""
    return pl.concat_str(pl.lit(f'"{name}":'), value)


def _num(col: str) -> pl.Expr:
    return _arg(col, pl.col(col).cast(pl.String))


def _hexarg(col: str, name: str | None = None) -> pl.Expr:
    return _arg(name or col, pl.concat_str(pl.lit('"'), pl.col(f"{col}_hex"), pl.lit('"')))


def _dim3(name: str) -> pl.Expr:
    return _arg(name, pl.format("[{},{},{}]", pl.col(f"{name}_x"), pl.col(f"{name}_y"), pl.col(f"{name}_z")))


def _object(*pieces: pl.Expr) -> pl.Expr:
    """A JSON object of `"key":value` pieces; null pieces are left out."""
    return pl.concat_str([pl.lit("{"), pl.concat_str(list(pieces), separator=",", ignore_nulls=True), pl.lit("}")])


def _event(ph: str, extra: list[pl.Expr]) -> pl.Expr:
    return _object(pl.lit(f'"ph":"{ph}"'), *extra)


def _name_object(col: str) -> pl.Expr:
    return _arg("args", _object(_arg("name", pl.col(col))))


def _with_hex(frame: pl.DataFrame, cols: tuple[str, ...]) -> pl.DataFrame:
    return frame.with_columns(hex_series(frame[c]).alias(f"{c}_hex") for c in cols if c in frame.columns)


def _common() -> list[pl.Expr]:
    return [_arg("pid", pl.col("pid").cast(pl.String)), _arg("tid", pl.col("tid").cast(pl.String))]


Part = tuple[pl.DataFrame, pl.Expr]  # rows, and the expression that makes each row's line (null: none)


def _metadata(model: TraceModel, streams: pl.DataFrame) -> list[Part]:
    procs = model.processes.with_columns(j=json_strings(model.processes["name"]))
    threads = pl.concat([
        model.threads.select("pid", pl.col("tid").cast(pl.Int64), "name"),
        streams.select("pid", "tid", name="label"),
    ])
    threads = threads.with_columns(j=json_strings(threads["name"]))
    return [
        (procs, _event("M", [pl.lit('"name":"process_name"'), _arg("pid", pl.col("pid").cast(pl.String)),
                             _name_object("j")])),
        (threads, _event("M", [pl.lit('"name":"thread_name"'), *_common(), _name_object("j")])),
    ]


def _api(model: TraceModel) -> list[Part]:
    """API calls: a complete event per call with a duration, an instant per
    entry-only call (no return was recorded, so no duration is claimed)."""
    launched = model.kernels.select("corr", kernel="name", timed=pl.col("dur_ns").is_not_null())
    api = model.api.join(launched, on="corr", how="left", maintain_order="left")
    api = _with_hex(api, HANDLES)
    api = api.with_columns(jname=json_strings(api["api"]), jkernel=json_strings(api["kernel"]))
    entry_only = pl.col("dur_ns").is_null()
    timing = pl.when(entry_only).then(pl.lit('"s":"t"')).otherwise(_arg("dur", _us(pl.col("dur_ns"))))
    line = _object(
        pl.when(entry_only).then(pl.lit('"ph":"i"')).otherwise(pl.lit('"ph":"X"')),
        pl.format('"cat":"{}","name":{}', pl.col("cat"), pl.col("jname")), *_common(),
        _arg("ts", _us(pl.col("ts_ns"))), timing,
        _arg("args", _object(
            _arg("kind", pl.format('"{}"', pl.col("kind"))), _num("ret"),
            _hexarg("stream"), _hexarg("func"), _arg("kernel", pl.col("jkernel")), _hexarg("ptr"), _num("size"),
            _hexarg("dst"), _hexarg("src"),
            _arg("copy_kind", pl.format('"{}"', pl.col("copy_kind"))), _num("shmem"),
            pl.when(pl.col("grid_x").is_not_null()).then(_dim3("grid")),
            pl.when(pl.col("block_x").is_not_null()).then(_dim3("block")),
            _num("aux"), _arg("correlation", pl.col("corr").cast(pl.String)),
            _arg("device", pl.format('"{}"', pl.col("tensor_device"))), _num("allocated_bytes"),
            _num("reserved_bytes"),
        )),
        pl.when(pl.col("stack_id").is_not_null()).then(
            pl.format('"sf":"{}:{}:0"', pl.col("pid"), pl.col("stack_id"))),
    )
    # an arrow only to a kernel that is drawn: one with device timing
    flow = _event("s", [pl.lit('"cat":"ac2g","name":"ac2g"'), _arg("id", pl.col("corr").cast(pl.String)),
                        *_common(), _arg("ts", _us(pl.col("ts_ns")))])
    # NCCL collectives matched across ranks: an arrow from each rank's entry to the next rank's
    coll = [pl.lit('"cat":"nccl","name":"collective"'), *_common(), _arg("ts", _us(pl.col("ts_ns")))]
    c_out = _event("s", [*coll, _arg("id", pl.col("coll_out").cast(pl.String))])
    c_in = _event("f", [pl.lit('"bp":"e"'), *coll, _arg("id", pl.col("coll_in").cast(pl.String))])
    return [(api, line), (api, pl.when(pl.col("timed")).then(flow)),
            (api, pl.when(pl.col("coll_out").is_not_null()).then(c_out)),
            (api, pl.when(pl.col("coll_in").is_not_null()).then(c_in))]


def _gpu(model: TraceModel, streams: pl.DataFrame) -> list[Part]:
    """Kernel executions and CUPTI copies/memsets on their stream's track.
    Only kernels with device timing: a launch without it says nothing about
    when (or how long) the GPU ran the kernel, and a zero-length `kernel`
    slice there would be counted as GPU work by trace-analysis tools."""
    kernels = model.kernels.filter(pl.col("dur_ns").is_not_null())
    kernels = kernels.join(streams, on=["pid", "label"], how="left", maintain_order="left")
    kernels = _with_hex(kernels, ("stream",)).with_columns(jname=json_strings(kernels["name"]))
    kline = _event("X", [
        pl.format('"cat":"kernel","name":{}', pl.col("jname")), *_common(),
        _arg("ts", _us(pl.col("ts_ns"))), _arg("dur", _us(pl.col("dur_ns"))),
        _arg("args", _object(
            _arg("correlation", pl.col("corr").cast(pl.String)), *_gpu_stream(), _num("device"),
            pl.when(pl.col("grid_x").is_not_null()).then(_dim3("grid")),
            pl.when(pl.col("block_x").is_not_null()).then(_dim3("block")),
            _arg("cupti_correlation", pl.col("cupti_correlation").cast(pl.String)),
            _num("graph_id"), _num("graph_node_id"), _num("overlap_ns"),
        )),
    ])
    flow = _event("f", [pl.lit('"cat":"ac2g","name":"ac2g","bp":"e"'), _arg("id", pl.col("corr").cast(pl.String)),
                        *_common(), _arg("ts", _us(pl.col("ts_ns")))])
    ops = model.memops.join(streams, on=["pid", "label"], how="left", maintain_order="left")
    ops = _with_hex(ops, ("stream",))
    oline = _event("X", [
        pl.format('"cat":"{}","name":"{}"', pl.col("cat"), pl.col("name")), *_common(),
        _arg("ts", _us(pl.col("ts_ns"))), _arg("dur", _us(pl.col("dur_ns"))),
        _arg("args", _object(_num("bytes"), *_gpu_stream("stream_id"), _num("stream_id"), _num("device"),
                             _arg("cupti_correlation", pl.col("cupti_correlation").cast(pl.String)),
                             pl.when(pl.col("cat") == "gpu_memcpy").then(_arg("copy_kind", pl.col("copy_kind").cast(pl.String))),
                             _num("overlap_ns"))),
    ])
    return [(kernels, kline), (kernels, pl.when(pl.col("corr").is_not_null()).then(flow)), (ops, oline)]


def _gpu_stream(*fallback: str) -> list[pl.Expr]:
    """`stream` of a GPU-track event is a JSON integer, as in PyTorch's traces:
    trace-analysis tools (HTA) take an event with an integer `stream` for GPU
    work.  It is the handle's value, else (`fallback`) CUPTI's stream id of a
    copy on a stream no kernel named; `stream_handle` spells the handle in hex,
    the one form handles have everywhere else."""
    return [_arg("stream", pl.coalesce("stream", *fallback).cast(pl.String)),
            _hexarg("stream", "stream_handle")]


def _counters(model: TraceModel) -> list[Part]:
    mem = model.memory.with_columns(jname=json_strings(model.memory["label"]))
    return [(mem, _event("C", [
        pl.format('"name":{}', pl.col("jname")), _arg("pid", pl.col("pid").cast(pl.String)),
        _arg("ts", _us(pl.col("ts_ns"))), _arg("args", _object(_num("live_bytes"))),
    ]))]


def _device_type(device: pl.Expr) -> pl.Expr:
    """c10::DeviceType number of a "cuda:0" spelling (schema.TORCH_DEVICE_TYPES)."""
    return device.str.split(":").list.first().replace_strict(
        {name: i for i, name in enumerate(schema.TORCH_DEVICE_TYPES)}, default=-1, return_dtype=pl.Int64)


def _torch_memory(model: TraceModel) -> list[Part]:
    """One "[memory]" instant per tensor event, in the form of PyTorch's
    profiler (profile_memory=True): Bytes is + for an allocation and - for a
    free, the totals are the allocator's after it (Total Reserved 0 where the
    allocator gives none, as the profiler writes for the CPU)."""
    t = model.tensors.with_columns(
        _type=_device_type(pl.col("device")),
        _id=pl.col("device").str.split(":").list.get(1, null_on_oob=True).cast(pl.Int64, strict=False).fill_null(-1))
    return [(t, _event("i", [
        pl.lit('"cat":"cpu_instant_event","s":"t","name":"[memory]"'), *_common(), _arg("ts", _us(pl.col("ts_ns"))),
        _arg("args", _object(
            _arg("Total Reserved", pl.col("reserved_bytes").cast(pl.String)),
            _arg("Total Allocated", pl.col("allocated_bytes").cast(pl.String)),
            _arg("Bytes", pl.col("delta_bytes").cast(pl.String)),
            _arg("Device Id", pl.col("_id").cast(pl.String)), _arg("Device Type", pl.col("_type").cast(pl.String)),
            _arg("Addr", pl.col("ptr").cast(pl.String)))),
    ]))]


def stream_tids(model: TraceModel) -> pl.DataFrame:
    """pid, label, tid: the thread id each drawn GPU stream track gets (a
    stream whose kernels all lack device timing has nothing on it)."""
    drawn = pl.concat([model.kernels.filter(pl.col("dur_ns").is_not_null()).select("pid", "label"),
                       model.memops.select("pid", "label")])
    return model.streams.join(drawn, on=["pid", "label"], how="semi", maintain_order="left").with_row_index(
        "tid").select("pid", "label", tid=pl.col("tid").cast(pl.Int64) + STREAM_TID_BASE)


def write(model: TraceModel, out: BinaryIO, chunk_rows: int = CHUNK_ROWS) -> int:
    """Write the trace to `out` (seekable); returns the number of trace events.

    Lines are made chunk by chunk and written by Polars' CSV writer (one
    unquoted column, ",\n" after each line); the last separator is then
    overwritten by the end of the array."""
    streams = stream_tids(model)
    parts = [*_metadata(model, streams), *_api(model), *_gpu(model, streams), *_counters(model),
             *_torch_memory(model)]
    out.write(b'{"displayTimeUnit":"ns",')
    if model.distributed:  # the rank that trace-analysis tools (HTA) key a file on
        out.write(b'"distributedInfo":' + json.dumps(model.distributed, separators=(",", ":")).encode() + b",")
    out.write(b'"traceEvents":[\n')
    n = 0
    for frame, line in parts:
        for start in range(0, frame.height, chunk_rows):
            lines = frame.slice(start, chunk_rows).select(line.alias("line")).drop_nulls()
            lines.write_csv(out, include_header=False, quote_style="never", line_terminator=",\n")
            n += lines.height
    if n:
        out.seek(out.tell() - 2)
    out.write(b"\n],\n")
    _stack_frames(model, out, chunk_rows)
    out.write(b"}\n")
    return n


def _stack_frames(model: TraceModel, out: BinaryIO, chunk_rows: int) -> None:
    """`"stackFrames":{...}`: node "pid:stack:depth" names one frame; its
    parent is the caller's node (depth + 1); the outermost has none."""
    frames = model.stacks
    top = frames.group_by("pid", "stack_id").agg(pl.col("depth").max().alias("_top"))
    frames = frames.join(top, on=["pid", "stack_id"]).with_columns(
        label=pl.format("{} {}:{}", pl.col("function").fill_null("?"), pl.col("file").fill_null("?"),
                        pl.col("line").cast(pl.String).fill_null("?")))
    frames = frames.with_columns(j=json_strings(frames["label"]))
    key = pl.format('"{}:{}:{}"', pl.col("pid"), pl.col("stack_id"), pl.col("depth"))
    line = pl.format("{}:{}", key, _object(
        _arg("name", pl.col("j")), _arg("category", pl.lit('"python"')),
        pl.when(pl.col("depth") < pl.col("_top")).then(
            pl.format('"parent":"{}:{}:{}"', pl.col("pid"), pl.col("stack_id"), pl.col("depth") + 1))))
    out.write(b'"stackFrames":{\n')
    n = 0
    for start in range(0, frames.height, chunk_rows):
        lines = frames.slice(start, chunk_rows).select(line.alias("line"))
        lines.write_csv(out, include_header=False, quote_style="never", line_terminator=",\n")
        n += lines.height
    if n:
        out.seek(out.tell() - 2)
    out.write(b"\n}")


def write_file(model: TraceModel, path: Path) -> int:
    with open(path, "wb") as f:
        return write(model, f)
