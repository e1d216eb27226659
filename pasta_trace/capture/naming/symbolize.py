"""Name runtime-API launch handles offline, from the traced process's files.

A `cudaLaunchKernel`/`hipLaunchKernel` handle is the address of the host
stub nvcc generates for the kernel, and the stub's ELF symbol is the kernel's
mangled name.  So: find the mapping that holds the address (/proc/PID/maps
text), turn it into the file's virtual address, look the symbol up in
`.symtab`/`.dynsym`, and keep it only if it names a kernel of that file's
fatbin (capture.naming.stub_names: internal-linkage stubs, device stubs, lambdas;
source `elf_stub`).  Anything else gets `unknown@0x...` with the reason.

A CUDA 13 stub passes a `cudaKernel_t` instead (a driver object on a GPU), so
a runtime launch also carries where it was called from (`caller`, and
`caller_fp` one frame up): an address in the stub itself (named after the
kernel) or in nvcc's device stub function `__device_stub__<mangled kernel>`,
which names it too.  The handle gets the first of (func, caller, caller_fp)
that names a kernel of the fatbin.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import polars as pl
from elftools.common.exceptions import ELFError

from ... import schema
from ...elf_tables import ElfImage
from ...parquet_scan import scan_events
from ...probes.fatbin import FatbinError, kernel_names
from ...regular_file import open_library
from ..output.manifest import FILE_PROBLEMS
from .stub_names import kernel_of_symbol

RESULT_SCHEMA: dict[str, pl.DataType] = {
    "handle": pl.UInt64,
    "name": pl.String,
    "source": pl.Enum(schema.NAME_SOURCE_NAMES),
    "reason": pl.String,  # null when resolved
}


def parse_maps(text: str) -> pl.DataFrame:
    """File-backed lines of a /proc/PID/maps text: start, end, offset, path,
    and the file's device ("major:minor" in hex, as maps writes it) and inode."""
    rows = [line.split(maxsplit=5) for line in text.splitlines()]
    rows = [r for r in rows if len(r) == 6 and r[5].startswith("/")]
    if not rows:
        return pl.DataFrame(schema={"start": pl.UInt64, "end": pl.UInt64, "offset": pl.UInt64, "path": pl.String,
                                    "dev": pl.String, "inode": pl.UInt64})
    raw = pl.DataFrame({"range": [r[0] for r in rows], "offset": [r[2] for r in rows],
                        "path": [r[5].removesuffix(" (deleted)") for r in rows],
                        "dev": [r[3] for r in rows], "inode": [r[4] for r in rows]})
    bounds = raw["range"].str.split_exact("-", 1)
    hex_u64 = lambda e: e.str.to_integer(base=16).cast(pl.UInt64)  # noqa: E731
    return raw.select(
        start=hex_u64(bounds.struct.field("field_0")),
        end=hex_u64(bounds.struct.field("field_1")),
        offset=hex_u64(pl.col("offset")),
        path=pl.col("path"),
        dev=pl.col("dev"),
        inode=pl.col("inode").str.to_integer(base=10, strict=False).cast(pl.UInt64),
    ).sort("start")


@dataclass(frozen=True)
class _File:
    """An open file to read tables from: remembered by its identity, read through ``path``."""

    key: tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
    path: str = field(compare=False)  # /proc/self/fd/N of our descriptor
    name: str = field(compare=False)  # the path the process mapped it under (for messages)


def same_file(st: os.stat_result, dev: str | None, inode: int | None) -> bool:
    """Whether ``st`` is the file a maps line names by ``dev`` ("fd:01") and ``inode``."""
    if dev is None or inode is None:
        return False
    major, _, minor = dev.partition(":")
    try:
        return (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino) == (int(major, 16), int(minor, 16), inode)
    except ValueError:
        return False


@lru_cache(maxsize=64)
def _elf_tables(file: _File) -> tuple[pl.DataFrame, pl.DataFrame, frozenset[str]]:
    """(PT_LOAD segments, function symbols, fatbin kernels) of one file:
    read bounded (elf_tables), from a regular file only (any process can map
    or name one); a bad fatbin leaves the file without kernels, and a note."""
    path = file.name
    with open_library(file.path) as f:
        img = ElfImage(f, path)
        loads = [(int(s["offset"]), int(s["filesz"]), int(s["vaddr"])) for s in img.loads]
        syms: dict[int, tuple[int, str]] = {}
        for name in (".symtab", ".dynsym"):  # .symtab first: it also has the local (static) stubs
            table = img.symbols(name)
            if table is None:
                continue
            t = table.table
            for i in table.functions().tolist():
                if t["value"][i]:
                    syms.setdefault(int(t["value"][i]), (max(int(t["size"][i]), 1), table.name(i)))
    try:
        kernels = frozenset(kernel_names(file.path))
    except (FatbinError, ELFError, ValueError, OSError) as e:
        FILE_PROBLEMS.add(path, f"its CUDA fatbin: {str(e).removeprefix(f'{path}: ')}")
        kernels = frozenset()
    segs = pl.DataFrame(loads, schema={"p_offset": pl.UInt64, "p_filesz": pl.UInt64, "p_vaddr": pl.UInt64},
                        orient="row").sort("p_offset")
    table = pl.DataFrame(
        {"sym_addr": list(syms), "sym_size": [v[0] for v in syms.values()], "symbol": [v[1] for v in syms.values()]},
        schema={"sym_addr": pl.UInt64, "sym_size": pl.UInt64, "symbol": pl.String},
    ).sort("sym_addr")
    return segs, table, kernels


@lru_cache(maxsize=64)
def _build_id(file: _File) -> str | None:
    """The GNU build-id of one file (None: it has none)."""
    with open_library(file.path) as f:
        return ElfImage(f, file.name).build_id()


def _unknown(handle: pl.Expr) -> pl.Expr:
    # per-row formatting is fine here: only the few unresolved handles get it
    return pl.lit("unknown@0x") + handle.cast(pl.UInt64).map_elements(lambda h: f"{h:x}", return_dtype=pl.String)


#: a file whose build-id was not read while its process ran (build_ids.BuildIds): checked by device and inode only
NOT_RECORDED = object()


def _replaced(hits: pl.DataFrame, path: str, what: str) -> pl.DataFrame:
    return hits.select("handle", name=_unknown(pl.col("handle")), source=pl.lit("unknown"),
                       reason=pl.lit(f"{path} is not the file the process mapped ({what}): replaced since"))


def _resolve_file(hits: pl.DataFrame, path: str, root: str, dev: str | None, inode: int | None,
                  build_id: str | None | object = NOT_RECORDED) -> pl.DataFrame:
    """Resolve the handles that fall in mappings of one file: the file the
    process mapped (``dev``, ``inode`` from its maps, and ``build_id`` when
    one was recorded while it ran), else none.  A process that has exited is
    read from the host's paths, where another file (a rebuild, or one put
    there to be read in its place) may be now, even with the same inode: a
    deleted file's inode is given to the next file made, and a file
    rewritten in place keeps its own."""
    full = str(Path(root) / path.lstrip("/")) if root else path
    try:
        with open_library(full) as f:
            st = os.fstat(f.fileno())
            if not same_file(st, dev, inode):
                now = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} inode {st.st_ino}"
                return _replaced(hits, path, f"device {dev} inode {inode}; device {now} there now")
            key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            file = _File(key, f"/proc/self/fd/{f.fileno()}", path)
            if isinstance(build_id, str) and (now_id := _build_id(file)) != build_id:
                return _replaced(hits, path, f"build-id {build_id}; {f'build-id {now_id}' if now_id else 'none'} "
                                             "there now")
            segs, syms, kernels = _elf_tables(file)
    except (OSError, ELFError) as e:
        FILE_PROBLEMS.add(path, str(e))
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
    # a few distinct symbols per file: mapped one by one
    symbols = located.filter(in_sym)["symbol"].unique().to_list()
    launched = pl.DataFrame({"symbol": symbols, "kernel": [kernel_of_symbol(x, kernels) for x in symbols]},
                            schema={"symbol": pl.String, "kernel": pl.String})
    located = located.join(launched, on="symbol", how="left")
    is_kernel = in_sym & pl.col("kernel").is_not_null()
    return located.select(
        "handle",
        name=pl.when(is_kernel).then(pl.col("kernel")).otherwise(_unknown(pl.col("handle"))),
        source=pl.when(is_kernel).then(pl.lit("elf_stub")).otherwise(pl.lit("unknown")),
        reason=pl.when(is_kernel).then(None)
        .when(in_sym & (len(kernels) == 0)).then(pl.lit(f"{path} has no CUDA fatbin kernels"))
        .when(in_sym).then(pl.lit("symbol ") + pl.col("symbol") + pl.lit(f" is not a kernel in {path}'s fatbin"))
        .otherwise(pl.lit(f"no symbol at this address in {path} (stripped?)")),
    )


def name_handles(pid_maps: str, root: str, handles: Iterable[int],
                 build_ids: Mapping[tuple[str, int], str | None] | None = None) -> pl.DataFrame:
    """Kernel names for launch handles of one process.

    pid_maps: the text of /proc/PID/maps (saved at capture time); root: the
    directory the paths in it are relative to ("/proc/PID/root" for a process
    in another mount namespace, "" or "/" otherwise); handles: host stub
    addresses; build_ids: the build-id of each (device, inode) of pid_maps,
    read while the process ran (capture.naming.build_ids), None for a file without
    one.  Returns RESULT_SCHEMA, one row per distinct handle.
    """
    build_ids = build_ids or {}
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
    # one ELF parse per distinct file, not per handle
    for (path, dev, inode), group in hits.group_by("path", "dev", "inode"):
        parts.append(_resolve_file(group, path, root, dev, inode, build_ids.get((dev, inode), NOT_RECORDED)))
    return pl.concat([p.cast(RESULT_SCHEMA) for p in parts]).sort("handle")


def _runtime_launch_apis() -> list[str]:
    """APIs whose launch handle is a host stub address (runtime-style launches)."""
    from ...probes.catalog import APIS

    return [a.symbol for a in APIS
            if a.shape in ("launch_rt", "launch_cfg_rt", "launch_rt_caller", "launch_cfg_rt_caller")]


def name_launches(pid_maps: str, root: str, launches: pl.DataFrame,
                  build_ids: Mapping[tuple[str, int], str | None] | None = None) -> pl.DataFrame:
    """Kernel names for the runtime launches of one process: ``launches`` has
    func, caller, caller_fp (null where not read); returns RESULT_SCHEMA, one
    row per func, named by the first of func, caller, caller_fp that names a
    kernel (a func with no name from any keeps func's own reason)."""
    addrs = pl.concat([launches.select(pl.col(c).alias("handle")) for c in ("func", "caller", "caller_fp")])
    named = name_handles(pid_maps, root, addrs.drop_nulls()["handle"], build_ids)
    known = named.filter(pl.col("source") != "unknown").select("handle", "name")
    picks = launches.select("func", "caller", "caller_fp").unique(maintain_order=True).with_row_index("_order")
    for c in ("func", "caller", "caller_fp"):
        picks = picks.join(known.rename({"handle": c, "name": f"_{c}"}), on=c, how="left")
    first = pl.coalesce("_func", "_caller", "_caller_fp")
    return (
        picks.sort("_order").group_by("func", maintain_order=True)
        .agg(first.drop_nulls().first().alias("kernel"))
        .join(named.rename({"handle": "func"}), on="func", how="left")
        .select(
            pl.col("func").alias("handle"),
            pl.coalesce("kernel", "name").alias("name"),
            pl.when(pl.col("kernel").is_not_null()).then(pl.lit("elf_stub")).otherwise(pl.col("source"))
            .alias("source"),
            pl.when(pl.col("kernel").is_null()).then(pl.col("reason")).alias("reason"),
        )
        .cast(RESULT_SCHEMA)
    )


def _maps(proc: Path, pid: int) -> tuple[str, str] | None:
    try:
        return (proc / str(pid) / "maps").read_text(), str(proc / str(pid) / "root")
    except OSError:
        return None


def name_aliases(aliases: pl.DataFrame, proc: Path = Path("/proc"),
                 build_ids: Mapping[int, Mapping[tuple[str, int], str | None]] | None = None) -> pl.DataFrame:
    """Names (schema.NAMES_SCHEMA, source `host_stub`) for the handles that
    cudaGetFuncBySymbol / cudaGetKernel returned for a host stub: ``aliases``
    has pid, handle, alias (the stub), ts_ns, api.  Only stubs that name a
    kernel give a row."""
    parts = []
    for (pid,), group in aliases.group_by("pid"):
        where = _maps(proc, pid)
        if where is None:
            continue
        named = name_handles(*where, group["alias"], (build_ids or {}).get(pid)).filter(
            pl.col("source") == "elf_stub")
        parts.append(
            group.join(named.select(pl.col("handle").alias("alias"), "name"), on="alias")
            .group_by("pid", "handle", "name").agg(pl.col("ts_ns").min(), pl.col("api").sort_by("ts_ns").first())
            .select("pid", "handle", "name", pl.lit("host_stub").alias("source"), "ts_ns", "api",
                    pl.lit(None, pl.String).alias("reason"))
            .sort("ts_ns"))
    if not parts:
        return schema.empty_frame(schema.NAMES_SCHEMA)
    return pl.concat(parts).cast(schema.NAMES_SCHEMA)


def name_capture(capture_dir: Path, proc: Path = Path("/proc"), aliases: pl.DataFrame | None = None,
                 build_ids: Mapping[int, Mapping[tuple[str, int], str | None]] | None = None) -> pl.DataFrame:
    """Offline names (schema.NAMES_SCHEMA) for the host-stub handles of the
    runtime-style launches in a capture directory's events, and for the
    handles of ``aliases`` (name_aliases).

    Each process's mappings are read from `proc`/PID/maps while it is still
    alive (paths under `proc`/PID/root, so containers work); a process that
    has exited gets `unknown@0x...` names.  ``build_ids``: per PID, the
    build-ids its mapped files had (capture.naming.build_ids): a file at the path
    now with another is not read.  Handles from driver-API launches are
    named by the run-time lookups instead and are left out here.
    """
    build_ids = build_ids or {}
    files = sorted(Path(capture_dir).glob("events*.parquet"))
    empty = schema.empty_frame(schema.NAMES_SCHEMA)
    stubs = name_aliases(aliases, proc, build_ids) if aliases is not None and not aliases.is_empty() else empty
    if not files:
        return stubs
    events = scan_events(files)
    launches = (
        events.filter(pl.col("api").cast(pl.String).is_in(_runtime_launch_apis()) & pl.col("func").is_not_null())
        .group_by("pid", "func", "caller", "caller_fp")
        .agg(pl.col("ts_ns").min(), pl.col("api").first().cast(pl.String))
        .sort("ts_ns")
        .collect()
    )
    parts = [stubs]
    for (pid,), by_site in launches.group_by("pid", maintain_order=True):  # one maps read per process
        group = by_site.sort("ts_ns").group_by("func", maintain_order=True).agg(
            pl.col("ts_ns").min(), pl.col("api").first())
        try:
            maps = (proc / str(pid) / "maps").read_text()
            named = name_launches(maps, str(proc / str(pid) / "root"), by_site, build_ids.get(pid))
        except OSError:
            named = group.select(handle="func", name=_unknown(pl.col("func")), source=pl.lit("unknown"),
                                 reason=pl.lit(f"the maps of PID {pid} could not be read (the process exited)"))
        # a handle left unknown here carries no time: merge names a launch by the latest name
        # before it, and a name seen at run time (__cudaRegisterFunction at the library's load)
        # must not be shadowed by this row, as it was for a library opened just before it launched
        parts.append(group.join(named, left_on="func", right_on="handle").select(
            pl.lit(pid, dtype=pl.UInt32).alias("pid"), pl.col("func").alias("handle"), "name", "source",
            pl.when(pl.col("source") != "unknown").then(pl.col("ts_ns")).alias("ts_ns"), "api",
            "reason").cast(schema.NAMES_SCHEMA))
    return pl.concat(parts)
