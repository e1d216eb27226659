"""Name runtime-API launch handles offline, from the traced process's files.

A `cudaLaunchKernel`/`hipLaunchKernel` handle is the address of the host
stub nvcc generates for the kernel, and the stub's ELF symbol is the kernel's
mangled name.  So: find the mapping that holds the address (/proc/PID/maps
text), turn it into the file's virtual address, look the symbol up in
`.symtab`/`.dynsym`, and keep it only if it is a kernel of that file's fatbin
(source `elf_stub`).  Anything else gets `unknown@0x...` with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from pathlib import Path

import polars as pl
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from .. import schema
from ..probes.fatbin import FatbinError, kernel_names

RESULT_SCHEMA: dict[str, pl.DataType] = {
    "handle": pl.UInt64,
    "name": pl.String,
    "source": pl.Enum(schema.NAME_SOURCE_NAMES),
    "reason": pl.String,  # null when resolved
}


def parse_maps(text: str) -> pl.DataFrame:
    """File-backed lines of a /proc/PID/maps text: start, end, offset, path."""
    rows = [line.split(maxsplit=5) for line in text.splitlines()]
    rows = [r for r in rows if len(r) == 6 and r[5].startswith("/")]
    if not rows:
        return pl.DataFrame(schema={"start": pl.UInt64, "end": pl.UInt64, "offset": pl.UInt64, "path": pl.String})
    raw = pl.DataFrame({"range": [r[0] for r in rows], "offset": [r[2] for r in rows],
                        "path": [r[5].removesuffix(" (deleted)") for r in rows]})
    bounds = raw["range"].str.split_exact("-", 1)
    hex_u64 = lambda e: e.str.to_integer(base=16).cast(pl.UInt64)  # noqa: E731
    return raw.select(
        start=hex_u64(bounds.struct.field("field_0")),
        end=hex_u64(bounds.struct.field("field_1")),
        offset=hex_u64(pl.col("offset")),
        path=pl.col("path"),
    ).sort("start")


@lru_cache(maxsize=64)
def _elf_tables(path: str) -> tuple[pl.DataFrame, pl.DataFrame, frozenset[str]]:
    """(PT_LOAD segments, function symbols, fatbin kernels) of one file."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        loads = [(s["p_offset"], s["p_filesz"], s["p_vaddr"]) for s in elf.iter_segments() if s["p_type"] == "PT_LOAD"]
        syms: dict[int, tuple[int, str]] = {}
        for name in (".symtab", ".dynsym"):  # .symtab first: it also has the local (static) stubs
            sec = elf.get_section_by_name(name)
            for s in sec.iter_symbols() if sec is not None else ():
                if s["st_info"]["type"] == "STT_FUNC" and s["st_value"] and s.name:
                    syms.setdefault(s["st_value"], (max(s["st_size"], 1), s.name))
    try:
        kernels = frozenset(kernel_names(path))
    except (FatbinError, ELFError, ValueError):
        kernels = frozenset()
    segs = pl.DataFrame(loads, schema={"p_offset": pl.UInt64, "p_filesz": pl.UInt64, "p_vaddr": pl.UInt64},
                        orient="row").sort("p_offset")
    table = pl.DataFrame(
        {"sym_addr": list(syms), "sym_size": [v[0] for v in syms.values()], "symbol": [v[1] for v in syms.values()]},
        schema={"sym_addr": pl.UInt64, "sym_size": pl.UInt64, "symbol": pl.String},
    ).sort("sym_addr")
    return segs, table, kernels


def _unknown(handle: pl.Expr) -> pl.Expr:
    # per-row formatting is fine here: only the few unresolved handles get it
    return pl.lit("unknown@0x") + handle.cast(pl.UInt64).map_elements(lambda h: f"{h:x}", return_dtype=pl.String)


def _resolve_file(hits: pl.DataFrame, path: str, root: str) -> pl.DataFrame:
    """Resolve the handles that fall in mappings of one file."""
    full = str(Path(root) / path.lstrip("/")) if root else path
    try:
        segs, syms, kernels = _elf_tables(full)
    except (OSError, ELFError) as e:
        return hits.select("handle", name=_unknown(pl.col("handle")),
                           source=pl.lit("unknown"), reason=pl.lit(f"cannot read {path}: {e}"))
    located = (
        hits.with_columns(file_off=pl.col("handle") - pl.col("start") + pl.col("offset"))
        .sort("file_off")
        .join_asof(segs, left_on="file_off", right_on="p_offset", strategy="backward")
        .with_columns(vaddr=pl.col("file_off") - pl.col("p_offset") + pl.col("p_vaddr"))
        .sort("vaddr")
        .join_asof(syms, left_on="vaddr", right_on="sym_addr", strategy="backward")
    )
    in_sym = pl.col("sym_addr").is_not_null() & (pl.col("vaddr") < pl.col("sym_addr") + pl.col("sym_size"))
    is_kernel = in_sym & pl.col("symbol").is_in(list(kernels))
    return located.select(
        "handle",
        name=pl.when(is_kernel).then(pl.col("symbol")).otherwise(_unknown(pl.col("handle"))),
        source=pl.when(is_kernel).then(pl.lit("elf_stub")).otherwise(pl.lit("unknown")),
        reason=pl.when(is_kernel).then(None)
        .when(in_sym & (len(kernels) == 0)).then(pl.lit(f"{path} has no CUDA fatbin kernels"))
        .when(in_sym).then(pl.lit("symbol ") + pl.col("symbol") + pl.lit(f" is not a kernel in {path}'s fatbin"))
        .otherwise(pl.lit(f"no symbol at this address in {path} (stripped?)")),
    )


def name_handles(pid_maps: str, root: str, handles: Iterable[int]) -> pl.DataFrame:
    """Kernel names for launch handles of one process.

    pid_maps: the text of /proc/PID/maps (saved at capture time); root: the
    directory the paths in it are relative to ("/proc/PID/root" for a process
    in another mount namespace, "" or "/" otherwise); handles: host stub
    addresses.  Returns RESULT_SCHEMA, one row per distinct handle.
    """
    hs = pl.DataFrame({"handle": list(handles)}, schema={"handle": pl.UInt64}).unique().sort("handle")
    maps = parse_maps(pid_maps)
    placed = hs.join_asof(maps, left_on="handle", right_on="start", strategy="backward").with_columns(
        mapped=pl.col("start").is_not_null() & (pl.col("handle") < pl.col("end"))
    )
    parts = [
        placed.filter(~pl.col("mapped")).select(
            "handle", name=_unknown(pl.col("handle")), source=pl.lit("unknown"),
            reason=pl.lit("address is not in a file-backed mapping"),
        )
    ]
    hits = placed.filter(pl.col("mapped"))
    for (path,), group in hits.group_by("path"):  # one ELF parse per distinct file, not per handle
        parts.append(_resolve_file(group, path, root))
    return pl.concat([p.cast(RESULT_SCHEMA) for p in parts]).sort("handle")


def _runtime_launch_apis() -> list[str]:
    """APIs whose launch handle is a host stub address (runtime-style launches)."""
    from ..probes.catalog import APIS

    return [a.symbol for a in APIS if a.shape in ("launch_rt", "launch_cfg_rt")]


def name_capture(capture_dir: Path, proc: Path = Path("/proc")) -> pl.DataFrame:
    """Offline names (schema.NAMES_SCHEMA) for the host-stub handles of the
    runtime-style launches in a capture directory's events.

    Each process's mappings are read from `proc`/PID/maps while it is still
    alive (paths under `proc`/PID/root, so containers work); a process that
    has exited gets `unknown@0x...` names.  Handles from driver-API launches
    are named by the run-time lookups instead and are left out here.
    """
    files = sorted(Path(capture_dir).glob("events*.parquet"))
    empty = schema.empty_frame(schema.NAMES_SCHEMA)
    if not files:
        return empty
    launches = (
        pl.scan_parquet([str(f) for f in files])
        .filter(pl.col("api").cast(pl.String).is_in(_runtime_launch_apis()) & pl.col("func").is_not_null())
        .group_by("pid", "func")
        .agg(pl.col("ts_ns").min(), pl.col("api").first().cast(pl.String))
        .collect()
    )
    parts = []
    for (pid,), group in launches.group_by("pid"):  # one maps read per process
        try:
            maps = (proc / str(pid) / "maps").read_text()
            named = name_handles(maps, str(proc / str(pid) / "root"), group["func"])
        except OSError:
            named = group.select(handle="func", name=_unknown(pl.col("func")), source=pl.lit("unknown"),
                                 reason=pl.lit(f"the maps of PID {pid} could not be read (the process exited)"))
        parts.append(group.join(named, left_on="func", right_on="handle").select(
            pl.lit(pid, dtype=pl.UInt32).alias("pid"), pl.col("func").alias("handle"), "name", "source", "ts_ns", "api", "reason"))
    if not parts:
        return empty
    return pl.concat(parts).cast(schema.NAMES_SCHEMA)
