"""Ring-buffer records (numpy structured arrays) -> Polars frames of schema/.

All work is columnar: numpy views of the record fields, Polars expressions for
the null masks, gathers from small lookup Series for the names.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import polars as pl

from ... import schema
from .collectives import Sequencer

_PAYLOAD_COLUMNS = {
    "stream": "stream",
    "func": "func",
    "ptr": "ptr",
    "size": "size",
    "dst": "dst",
    "src": "src",
    "grid_x": "grid",
    "grid_y": "grid",
    "grid_z": "grid",
    "block_x": "block",
    "block_y": "block",
    "block_z": "block",
    "shmem": "shmem",
    "aux": "aux",
    "caller": "caller",
    "caller_fp": "caller_fp",
}


def api_table(api_names: Sequence[str], needed: int) -> list[str]:
    """The catalog's names, padded with `api#N` for ids the catalog lacks
    (a BPF program built from a newer catalog than the decoder's)."""
    names = list(api_names)
    return names + [f"api#{i}" for i in range(len(names), needed)]


def layer_table(api_names: Sequence[str]) -> list[str | None]:
    """The layer of each API name (schema.LAYER_NAMES), None for names the
    catalog lacks."""
    from ...probes.catalog import APIS

    layers = {a.api_name: a.layer.name for a in APIS}
    return [layers.get(n) for n in api_names]


def _lookup(values: np.ndarray, table: Sequence[str], dtype: pl.DataType, name: str) -> pl.Series:
    idx = pl.Series(values.astype(np.uint32, copy=False))
    return pl.Series(name, table, dtype=dtype).gather(idx)


#: Records per block when splitting records into columns: a block's records
#: stay in cache while every field is copied out (3x faster than whole columns).
_BLOCK = 16384


def columns(parts: Sequence[np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Contiguous copies of the named fields of structured arrays of one
    layout, in order (as if concatenated: no copy of the records is made)."""
    dtype = parts[0].dtype
    out = {c: np.empty(sum(p.size for p in parts), dtype[c]) for c in names}
    at = 0
    for part in parts:
        for a in range(0, part.size, _BLOCK):
            block = part[a : a + _BLOCK]
            for c in names:
                out[c][at + a : at + a + block.size] = block[c]
        at += part.size
    return out


def _all_equal(raw: np.ndarray) -> bool:
    """Whether every fixed-width string in ``raw`` (non-empty) is the first,
    compared as whole 8-byte words (10x faster than numpy's bytes compare)."""
    raw = np.ascontiguousarray(raw)
    if raw.dtype.itemsize % 8:
        return bool((raw == raw[0]).all())
    words = raw.view(np.uint64).reshape(raw.size, -1)
    return all(bool((words[:, i] == words[0, i]).all()) for i in range(words.shape[1]))


def _comm(raw: np.ndarray) -> pl.Series:
    """The comm column; almost every batch has one or a few distinct values."""
    if raw.size and _all_equal(raw):
        text = raw[0].split(b"\0", 1)[0].decode("utf-8", "replace")
        return pl.Series("comm", [text], dtype=pl.Categorical).new_from_index(0, raw.size)
    return _strings(raw, "comm", pl.Categorical)


def _strings(raw: np.ndarray, name: str, dtype: pl.DataType) -> pl.Series:
    """Fixed-width NUL-padded C strings -> Series; decodes each distinct value once."""
    uniq, inverse = np.unique(raw, return_inverse=True)
    # bytes after the first NUL are whatever the probe left there: cut them
    text = [u.split(b"\0", 1)[0].decode("utf-8", "replace") for u in uniq.tolist()]
    return pl.Series(name, text, dtype=dtype).gather(pl.Series(inverse.astype(np.uint32)))


def torch_device(aux: pl.Expr) -> pl.Expr:
    """c10::Device packed as a tensor event's aux (schema.TORCH_DEVICE_TYPES)
    -> "cpu", "cuda:3", ...: torch.device's spelling; an unknown type reads
    "device#N"."""
    kind = aux & 0xFF
    index = (aux // 256) & 0xFF
    name = kind.replace_strict(dict(enumerate(schema.TORCH_DEVICE_TYPES)), default=None, return_dtype=pl.String)
    name = pl.coalesce(name, pl.format("device#{}", kind))
    # index -1 (0xff): the device has none ("cpu")
    return pl.when(index == 0xFF).then(name).otherwise(pl.format("{}:{}", name, index))


def _kind_payload() -> tuple[dict[str, tuple[str, list[int]]], dict[str, list[int]]]:
    """schema.KIND_PAYLOAD as (named column -> (slot, kinds), slot -> kinds that use it for a named column)."""
    named: dict[str, tuple[str, list[int]]] = {}
    taken: dict[str, list[int]] = {}
    for kind, slots in schema.KIND_PAYLOAD.items():
        for slot, col in slots.items():
            named.setdefault(col, (slot, []))[1].append(int(kind))
            taken.setdefault(slot, []).append(int(kind))
    return named, taken


def _nccl_exprs(has) -> dict[str, pl.Expr]:
    """The NCCL kinds' named columns, read from their slots (schema.NCCL_SLOTS)."""
    signed = {"root", "peer", "nranks", "rank"}
    out = {}
    for name, slot in schema.NCCL_SLOTS.items():
        value = pl.col(f"_{name}") if name in ("datatype", "op") else pl.col(slot)
        out[name] = pl.when(has(name)).then(value.reinterpret(signed=True) if name in signed else value)
    return out


def events_frame(recs: np.ndarray | Sequence[np.ndarray], api_names: Sequence[str],
                 sequencer: Sequencer | None = None) -> pl.DataFrame:
    """Decode HOST_EVENT records (an array, or several in order) into a
    frame with exactly schema.EVENTS_SCHEMA.  ``sequencer`` numbers the
    collectives (`seq`) on from the batches before; None: from 0 in this batch."""
    parts = [p for p in ([recs] if isinstance(recs, np.ndarray) else recs) if p.size]
    if not parts:
        return schema.empty_frame(schema.EVENTS_SCHEMA)
    # the payload fields no record of the batch set are not split out: their columns are null
    # (a launch flood's ptr, size, dst, src, aux, copy_kind, caller: a fifth of the split)
    bits = int(np.bitwise_or.reduce([np.bitwise_or.reduce(p["valid"]) for p in parts]))

    def set_somewhere(bit_name: str) -> bool:
        return bool(bits & (1 << schema.PAYLOAD_BITS[bit_name]))

    nccl_in = {slot for name, slot in schema.NCCL_SLOTS.items() if set_somewhere(name)}
    fields = [c for c, bit in _PAYLOAD_COLUMNS.items() if set_somewhere(bit) or c in nccl_in]
    cols = columns(parts, ["ts_ns", "dur_ns", "pid", "tid", "ret", "flags", "valid", "api", "kind", "comm",
                          "stack_id", "outer_ts", *fields, *(["copy_kind"] if set_somewhere("copy_kind") else [])])
    table = api_table(api_names, int(cols["api"].max()) + 1)
    kinds = schema.kind_index(cols.pop("kind"))
    api = cols.pop("api")
    comm = cols.pop("comm")
    cols["ts_ns"] = cols["ts_ns"].view(np.int64)
    cols["dur_ns"] = cols["dur_ns"].view(np.int64)
    cols["outer_ts"] = cols["outer_ts"].view(np.int64)
    cols["_kind"] = kinds.astype(np.uint8)
    lookups = [
        _comm(comm),
        _lookup(api, table, pl.Categorical, "api"),
        _lookup(api, layer_table(table), schema.EVENTS_SCHEMA["layer"], "layer"),
        _lookup(kinds, schema.KIND_NAMES, schema.EVENTS_SCHEMA["kind"], "kind"),
    ]
    if "copy_kind" in cols:
        lookups.append(_lookup(np.minimum(cols.pop("copy_kind"), int(schema.CopyKind.unknown)),
                               schema.COPY_KIND_NAMES, schema.EVENTS_SCHEMA["copy_kind"], "copy_kind"))
    if set_somewhere("datatype"):
        lookups.append(_lookup(np.minimum(cols["grid_x"], len(schema.NCCL_DATATYPE_NAMES) - 1),
                               schema.NCCL_DATATYPE_NAMES, schema.EVENTS_SCHEMA["datatype"], "_datatype"))
    if set_somewhere("op"):
        lookups.append(_lookup(np.minimum(cols["grid_y"], len(schema.NCCL_OP_NAMES) - 1), schema.NCCL_OP_NAMES,
                               schema.EVENTS_SCHEMA["op"], "_op"))
    raw = pl.DataFrame(cols).with_columns(lookups)

    def has(bit_name: str) -> pl.Expr:
        return (pl.col("valid") & (1 << schema.PAYLOAD_BITS[bit_name])) != 0

    def flag(bit: int) -> pl.Expr:
        return (pl.col("flags") & bit) != 0

    named, taken = _kind_payload()

    def slot(c: str, bit: str) -> pl.Expr:
        if not set_somewhere(bit):
            return pl.lit(None)
        own = has(bit) & ~pl.col("_kind").is_in(taken[c]) if c in taken else has(bit)
        return pl.when(own).then(pl.col(c))

    tensors = bool(np.isin(kinds, [int(schema.Kind.tensor_alloc), int(schema.Kind.tensor_free)]).any())

    exprs = {
        "ts_ns": pl.col("ts_ns"),
        "dur_ns": pl.when(flag(schema.FLAG_HAS_DUR)).then(pl.col("dur_ns")),
        "pid": pl.col("pid"),
        "tid": pl.col("tid"),
        "comm": pl.col("comm"),
        "api": pl.col("api"),
        "kind": pl.col("kind"),
        "ret": pl.when(flag(schema.FLAG_HAS_RET)).then(pl.col("ret")),
        **{c: slot(c, bit) for c, bit in _PAYLOAD_COLUMNS.items()},
        "copy_kind": pl.when(has("copy_kind")).then(pl.col("copy_kind")) if "copy_kind" in raw else pl.lit(None),
        "stack_id": pl.when(pl.col("stack_id") != 0).then(pl.col("stack_id")),
        "layer": pl.col("layer"),
        "outer_ts_ns": pl.when(pl.col("outer_ts") != 0).then(pl.col("outer_ts")),
        **{col: pl.when(pl.col("_kind").is_in(ks) & has(src)).then(pl.col(src)) if tensors and src in raw
           else pl.lit(None) for col, (src, ks) in named.items()},
        **{name: e if set_somewhere(name) else pl.lit(None) for name, e in _nccl_exprs(has).items()},
        "seq": pl.lit(None, pl.Int64),
        # tensor events only: made while the interpreter was finalizing (bpf/c10.bpf.c)
        "at_exit": pl.when(pl.col("_kind").is_in([int(schema.Kind.tensor_alloc), int(schema.Kind.tensor_free)]))
        .then(flag(schema.FLAG_AT_EXIT)) if tensors else pl.lit(None),
    }
    if tensors and "aux" in raw:
        exprs["device"] = pl.when(exprs["device"].is_not_null()).then(torch_device(pl.col("aux")))
    frame = raw.select([exprs[c].cast(dt).alias(c) for c, dt in schema.EVENTS_SCHEMA.items()])
    return (sequencer or Sequencer()).number(frame)


def names_frame(recs: np.ndarray, api_names: Sequence[str]) -> pl.DataFrame:
    """Decode HOST_NAME records into schema.NAMES_SCHEMA rows.

    A `kernel_get_function` record says "CUfunction `handle` aliases CUkernel
    `alias`"; it carries no text of its own, so its name is the alias's name
    from another record (resolved here, and again over the whole capture by
    :func:`resolve_aliases`)."""
    if recs.size == 0:
        return schema.empty_frame(schema.NAMES_SCHEMA)
    table = api_table(api_names, int(recs["api"].max()) + 1)
    sources = np.minimum(recs["source"], int(schema.NameSource.unknown))
    frame = pl.DataFrame(
        {
            "pid": recs["pid"],
            "handle": recs["handle"],
            "alias": recs["alias"],
            "ts_ns": recs["ts_ns"].view(np.int64),
            "reason": pl.Series([None] * len(recs), dtype=pl.String),  # run-time lookups name the handle
        }
    ).with_columns(
        _strings(recs["name"], "name", pl.String),
        _lookup(sources, schema.NAME_SOURCE_NAMES, schema.NAMES_SCHEMA["source"], "source"),
        _lookup(recs["api"], table, pl.Categorical, "api"),
    )
    return resolve_aliases(frame)


def host_stub_aliases(recs: np.ndarray, api_names: Sequence[str]) -> pl.DataFrame:
    """The successful host-stub lookups (cudaGetFuncBySymbol, cudaGetKernel,
    ...) among HOST_NAME records: pid, handle, alias (the host stub), ts_ns,
    api.  Their names come from the stub's ELF symbol, found offline."""
    keep = recs[(recs["source"] == int(schema.NameSource.host_stub)) & (recs["ret"] == 0) & (recs["handle"] != 0)]
    table = api_table(api_names, int(keep["api"].max()) + 1 if keep.size else 0)
    return pl.DataFrame({
        "pid": keep["pid"], "handle": keep["handle"], "alias": keep["alias"],
        "ts_ns": keep["ts_ns"].view(np.int64),
    }, schema={"pid": pl.UInt32, "handle": pl.UInt64, "alias": pl.UInt64, "ts_ns": pl.Int64}).with_columns(
        _lookup(keep["api"], table, pl.Categorical, "api"))


def resolve_aliases(frame: pl.DataFrame) -> pl.DataFrame:
    """Fill the names of kernel_get_function rows from the handle they alias,
    drop exact duplicates, and return schema.NAMES_SCHEMA columns.

    ``frame`` has the NAMES_SCHEMA columns plus ``alias`` (0 when none)."""
    named = (
        frame.filter(pl.col("name") != "")
        .group_by("pid", "handle")
        .agg(pl.col("name").sort_by("ts_ns").last().alias("_alias_name"))
        .rename({"handle": "alias"})
    )
    # alias 0 is no alias: a record whose string could not be read (a __cudaRegisterFunction name
    # on a page not faulted in yet) must not take the name of a handle-0 row (a cuGetProcAddress miss)
    filled = frame.join(named, on=["pid", "alias"], how="left").with_columns(
        pl.when((pl.col("name") == "") & (pl.col("alias") != 0)).then(pl.col("_alias_name"))
        .otherwise(pl.col("name")).alias("name")
    )
    return (
        filled.filter(pl.col("name").is_not_null() & (pl.col("name") != ""))
        .unique(subset=["pid", "handle", "name", "source"], keep="first", maintain_order=True)
        .select([pl.col(c).cast(dt) for c, dt in schema.NAMES_SCHEMA.items()])
    )


def aggregate_frame(keys: np.ndarray, vals: np.ndarray, api_names: Sequence[str]) -> pl.DataFrame:
    """The --aggregate BPF hash (AGG_KEY -> AGG_VAL arrays) as schema.AGGREGATE_SCHEMA."""
    if keys.size == 0:
        return schema.empty_frame(schema.AGGREGATE_SCHEMA)
    table = api_table(api_names, int(keys["api"].max()) + 1)
    kinds = schema.kind_index(keys["kind"])
    return pl.DataFrame(
        {
            "pid": keys["pid"],
            **{c: keys[c] for c in ("func", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")},
            "ret": keys["ret"],
            "flags": keys["flags"],
            "count": vals["count"],
            "bytes": vals["bytes"],
            "first_ts_ns": vals["first_ts"].view(np.int64),
            "last_ts_ns": vals["last_ts"].view(np.int64),
        }
    ).with_columns(
        _lookup(keys["api"], table, pl.Categorical, "api"),
        _lookup(kinds, schema.KIND_NAMES, schema.AGGREGATE_SCHEMA["kind"], "kind"),
        pl.when((pl.col("flags") & schema.FLAG_HAS_RET) != 0).then(pl.col("ret")).alias("ret"),
    ).select([pl.col(c).cast(dt) for c, dt in schema.AGGREGATE_SCHEMA.items()])
