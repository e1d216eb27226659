"""The Parquet files of a capture or timeline, checked before they are scanned.

A file that is no regular file, not Parquet, cut short, has a damaged footer,
holds a column of another type than schema/ declares, or holds a page that
does not decode is left out with one line that names it and says what is
wrong; the other files are scanned as usual.  A scan never casts a value to
null silently: the types are compared first.  Every page is decoded once here
by Arrow's reader (about a millisecond per small file, a few percent of a
merge for large ones), because Polars, given a damaged page, can panic or
abort the process; what Polars still fails on later is named by
pasta_trace.damage.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from polars.exceptions import PanicException

from . import schema
from .errors import FormatError
from .regular_file import open_regular

#: Errors Polars raises for a file it cannot decode: its own, and a panic
#: (damage that trips an assertion in its decoder), which is no Exception.
POLARS_ERRORS = (pl.exceptions.PolarsError, PanicException)
#: What Arrow's Parquet reader raises for a damaged file.
ARROW_ERRORS = (pa.ArrowException, OSError, ValueError, MemoryError, NotImplementedError)


def first_line(e: BaseException, limit: int = 160) -> str:
    """An error's message as one short line (Polars' span several).  A panic
    that passed through worker threads nests its cause in JoinError::Panic(..., "cause"):
    the innermost cause is what went wrong."""
    text = str(e).strip()
    if isinstance(e, PanicException):
        marks = list(re.finditer(r'Panic\(Id\(\d+\), \\*"', text))
        cause = re.split(r'\\*"', text[marks[-1].end():], maxsplit=1)[0] if marks else text
        text = f"decoder failed: {cause}"
    lines = text.splitlines()
    return (lines[0] if lines else type(e).__name__).removeprefix("parquet: ")[:limit]


def _strings(t: pl.DataType) -> bool:
    return t.base_type() in (pl.String, pl.Categorical, pl.Enum)


def type_fits(found: pl.DataType, want: pl.DataType) -> bool:
    """Whether a column stored as `found` reads as `want` without losing values:
    the same type; all nulls; text as a categorical or the other way round; an
    enum of other categories (a newer minor version may add some: those read as null)."""
    if found == want or found == pl.Null:
        return True
    if want.base_type() is pl.Enum:
        return found.base_type() is pl.Enum
    return _strings(want) and _strings(found) and found.base_type() is not pl.Enum


def parquet_problem(path: Path, sch: dict[str, pl.DataType], nulls: dict[str, int] | None = None,
                    data: bool = True) -> tuple[dict | None, str | None]:
    """(the file's schema, None), or (None, what is wrong with it): not a
    regular file, not Parquet, cut short, a damaged footer, a column of
    another type, or (with `data`) damaged data.  `nulls`, when given, gets
    each column's count of nulls, counted as the data is decoded."""
    try:
        fd = open_regular(path)
    except FormatError as e:
        return None, str(e).removeprefix(f"{path}: ")
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        if size < 12 or os.pread(fd, 4, 0) != b"PAR1":
            return None, "not a Parquet file"
        if os.pread(fd, 4, size - 4) != b"PAR1":
            return None, "truncated Parquet file (no footer at its end)"
        try:
            arrow = pq.ParquetFile(f)
        except ARROW_ERRORS as e:
            return None, f"damaged Parquet footer ({first_line(e)})"
        try:
            found = dict(pl.read_parquet_schema(path))
        except POLARS_ERRORS as e:
            return None, f"damaged Parquet footer ({first_line(e)})"
        wrong = [f"column {k} is {found[k]}, expected {t}" for k, t in sch.items()
                 if k in found and not type_fits(found[k], t)]
        if wrong:
            return None, wrong[0]
        if not data:
            return found, None
        return (found, None) if (why := _data_problem(path, arrow, size, nulls)) is None else (None, why)


def data_problem(path: Path, nulls: dict[str, int], columns: list[str] | None = None) -> str | None:
    """The data check of a file whose footer and types passed parquet_problem
    (with data=False) earlier, of its `columns` (every one when None): None
    when every page of them decodes, with each one's nulls put in `nulls`;
    else what is wrong."""
    try:
        fd = open_regular(path)
    except FormatError as e:
        return str(e).removeprefix(f"{path}: ")
    with os.fdopen(fd, "rb") as f:
        try:
            arrow = pq.ParquetFile(f)
        except ARROW_ERRORS as e:  # changed since it was opened
            return f"damaged Parquet footer ({first_line(e)})"
        return _data_problem(path, arrow, os.fstat(fd).st_size, nulls, columns)


#: Above this size a file's row groups are decoded on several threads; below, threads cost more than they save.
THREADED_BYTES = 8 << 20
#: at most this many threads (each holds one decoded row group)
CHECK_THREADS = 4
#: rows per batch, and bytes read at a time per column, of the check
CHECK_BATCH_ROWS = 1 << 16
CHECK_BUFFER = 1 << 20


def row_group_batches(f: pq.ParquetFile, group: int, rows: int,
                      columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """The batches of one row group (its `columns`, every one when None).  A
    reader of several row groups holds what it decoded of each until it ends
    (12 MB a row group of 10^6 access samples: 1.2 GB for 10^8, two
    readers); one reader per row group holds one row group's."""
    yield from f.iter_batches(batch_size=rows, row_groups=[group], columns=columns, use_threads=False)


def _data_problem(path: Path, f: pq.ParquetFile, size: int, nulls: dict[str, int] | None = None,
                  columns: list[str] | None = None) -> str | None:
    """Every page decoded once by Arrow's reader, in small batches (the
    memory of one batch per thread).  Polars trusts what a page header says: a
    damaged one can make it panic, or abort the process on an allocation of
    exabytes; Arrow's reader checks and raises.  So what reaches Polars decodes.
    A large file's row groups are split among threads, each with a reader of
    its own: one reader serializes its reads (10^7 access samples: 0.37 s
    wall with use_threads on one reader, 0.21 s with two readers, on 2 CPUs).
    Whole row groups decoded at once (40 MB each there) are fresh memory every
    time, which the allocator hands back and faults in again (huge pages, where
    it asks for them): batches of CHECK_BATCH_ROWS read through a buffer of
    CHECK_BUFFER bytes reuse the same few MB (10^7 samples on a loaded 2-CPU
    machine: 0.57 CPU s against 0.90, medians of 6).  Each batch's nulls are
    counted on the way (from its validity bitmaps: microseconds), so that
    rows without their keys are known without a second read (keyed)."""
    n = f.num_row_groups
    threads = min(os.cpu_count() or 1, CHECK_THREADS, n) if size > THREADED_BYTES else 1
    names = f.schema_arrow.names if columns is None else columns

    def part(k: int) -> list[int]:
        counts = [0] * len(names)
        r = f if threads < 2 else pq.ParquetFile(path, buffer_size=CHECK_BUFFER)
        for g in range(k, n, threads):
            for batch in row_group_batches(r, g, CHECK_BATCH_ROWS, columns):
                for i, col in enumerate(batch.columns):
                    counts[i] += col.null_count
        return counts

    try:
        if threads < 2:
            parts = [part(0)]
        else:
            with ThreadPoolExecutor(threads) as pool:
                parts = [fut.result() for fut in [pool.submit(part, k) for k in range(threads)]]
    except ARROW_ERRORS as e:
        return f"damaged Parquet data ({first_line(e)})"
    finally:
        # Arrow's allocator keeps what the decoded batches freed, held through the
        # merge that follows unless handed back
        pa.default_memory_pool().release_unused()
    if nulls is not None:
        nulls.update({name: sum(c) for name, c in zip(names, zip(*parts))})
    return None


#: the columns without which a row of a frame means nothing (its time, its process and thread)
KEYS = {"events": ("ts_ns", "pid", "tid"), "processes": ("pid",), "device": ("pid",)}


def keyed(lf: pl.LazyFrame, nulls: list[dict[str, int]], keys: tuple[str, ...], what: str,
          problems: list[str]) -> pl.LazyFrame:
    """`lf` without the rows that have a null in one of `keys` (no tracer
    writes one: damage), said in `problems`.  `nulls` are the null counts of
    the files `lf` scans, counted when they were checked at open: a frame
    without such rows (every capture a tracer wrote) pays for no filter."""
    counts = [f"{n:,} without {k}" for k in keys if (n := sum(c.get(k, 0) for c in nulls))]
    if not counts:
        return lf
    problems.append(f"{what}: rows left out ({', '.join(counts)})")
    return lf.filter(pl.all_horizontal(pl.col(k).is_not_null() for k in keys))


#: Device frames whose pages are not decoded at open: the access samples,
#: the one input that grows to 10^8 rows and more.  The merge's pass over
#: them decodes the pages of the columns it reads with Arrow's reader, which
#: is their check; any other reader gets the check first
#: (device_frames.DeviceFrames).  Checked at open, 10^8 samples were decoded
#: twice, a fifth of the merge's time.
DEFERRED = ("access_samples",)
#: ... when their file is at least this large: a smaller one is checked at open
#: like every other file (10^6 samples are about 12 MB).  Once in a test run,
#: a verb whose check ran at its end aborted at the interpreter's exit
#: (std::terminate: a native thread alive into the exit, as Arrow's issue
#: 34314 reports of Parquet readers); small captures, the common case, keep
#: the check where it always was, long before the exit
DEFER_BYTES = 64 << 20


@dataclass
class Scanner:
    """Scans the Parquet files of one capture or timeline after checking each;
    a file that fails a check is left out, said in `damaged`."""

    damaged: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    #: device frame name -> the Parquet file it scans
    device_files: dict[str, list[Path]] = field(default_factory=dict)
    #: each file read -> column -> its nulls (counted by the check at open)
    nulls: dict[Path, dict[str, int]] = field(default_factory=dict)
    #: device frame name -> its file, whose data check waits for the first reader (DEFERRED)
    deferred: dict[str, Path] = field(default_factory=dict)

    def frames(self, paths: list[Path], sch: dict[str, pl.DataType], data: bool = True) -> pl.LazyFrame:
        """One lazy frame of the schema `sch` over the files that pass (their
        footers and types only, without `data`)."""
        by_schema: dict[tuple, list[Path]] = {}
        for p in paths:
            counts: dict[str, int] = {}
            found, why = parquet_problem(p, sch, counts, data)
            if data:
                self.nulls[p] = counts
            if why is not None:
                self.damaged.append(f"{p}: {why}")
                continue
            self.files.append(p)
            by_schema.setdefault(tuple(found.items()), []).append(p)  # type: ignore[union-attr]
        return _scan_alike(by_schema, sch)

    def optional(self, path: Path, sch: dict[str, pl.DataType], data: bool = True) -> pl.LazyFrame | None:
        """The frame of one file, None when it is absent or left out."""
        if not os.path.lexists(path):
            return None
        n = len(self.damaged)
        lf = self.frames([path], sch, data)
        return None if len(self.damaged) > n else lf

    def one(self, path: Path, sch: dict[str, pl.DataType]) -> pl.LazyFrame:
        """The frame of one file; empty when it is absent or left out."""
        lf = self.optional(path, sch)
        return pl.DataFrame(schema=sch).lazy() if lf is None else lf

    def device(self, d: Path) -> dict[str, pl.LazyFrame]:
        """Decoded device frames stored as d/<frame>.parquet, scanned lazily.
        The data check of a DEFERRED frame's file waits (`deferred`):
        device_frames.DeviceFrames runs it before the frame is first read."""
        out = {}
        for name, sch in schema.DEVICE_FRAMES.items():
            path = d / f"{name}.parquet"
            defer = name in DEFERRED and _size(path) >= DEFER_BYTES
            lf = self.optional(path, sch, data=not defer)
            if lf is not None:
                out[name] = lf
                self.device_files[name] = [path]
                if defer:
                    self.deferred[name] = path
        return out


def _size(path: Path) -> int:
    """A regular file's size; 0 for anything else (checked, and said, by parquet_problem)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return 0
    return st.st_size if stat.S_ISREG(st.st_mode) else 0


def column_ranges(paths: list[Path], columns: list[str]) -> tuple[int, dict[str, tuple[int, int, int]]] | None:
    """(rows, column -> (min, max, nulls)) of integer columns, from the files'
    footers alone (no data read); None when a file has no such column or a
    row group lacks a statistic.  The footers were checked when the files
    were scanned; a statistic that lies is the reader's to catch."""
    rows, out = 0, {}
    try:
        for p in paths:
            meta = pq.read_metadata(p)
            rows += meta.num_rows
            names = {meta.schema.column(i).path: i for i in range(meta.num_columns)}
            if any(c not in names for c in columns):
                return None
            for g in range(meta.num_row_groups):
                rg = meta.row_group(g)
                for c in columns:
                    st = rg.column(names[c]).statistics
                    if rg.num_rows == 0:
                        continue
                    if st is None or not st.has_min_max or not st.has_null_count:
                        return None
                    if not isinstance(st.min, int) or not isinstance(st.max, int):
                        return None
                    lo, hi, n = out.get(c, (st.min, st.max, 0))
                    out[c] = (min(lo, st.min), max(hi, st.max), n + st.null_count)
    except ARROW_ERRORS:
        return None
    return rows, out


def scan_events(paths: list[Path]) -> pl.LazyFrame:
    """The events*.parquet files this version wrote, as one lazy frame of
    schema.EVENTS_SCHEMA: the columns a file leaves out (null in every row of
    it, capture format 1.12) read as nulls.  For the tracer's own files at the
    end of a capture (its summary, the names it works out then); a capture of
    any age or state is read through read.open_capture."""
    by_schema: dict[tuple, list[Path]] = {}
    for p in paths:
        by_schema.setdefault(tuple(pl.read_parquet_schema(p).items()), []).append(p)
    return _scan_alike(by_schema, schema.EVENTS_SCHEMA)


def _scan_alike(by_schema: dict[tuple, list[Path]], sch: dict[str, pl.DataType]) -> pl.LazyFrame:
    """Files grouped by their schema (its items) as one lazy frame of `sch`:
    one scan per distinct file schema (a multi-file scan wants them all
    alike), each conformed to `sch`."""
    if not by_schema:
        return pl.DataFrame(schema=sch).lazy()
    parts = [_conform(pl.scan_parquet([str(p) for p in ps], glob=False), dict(key), sch)
             for key, ps in by_schema.items()]
    return parts[0] if len(parts) == 1 else pl.concat(parts, how="diagonal")


def _conform(lf: pl.LazyFrame, found: dict[str, pl.DataType], sch: dict[str, pl.DataType]) -> pl.LazyFrame:
    # a column added in a later minor version reads as null from older files, as does an events
    # column that a file leaves out (format 1.12: null in every row of it)
    missing = [pl.lit(None, v).alias(k) for k, v in sch.items() if k not in found]
    # only the columns stored as another type are cast: a cast of every column,
    # even to its own type, stands between the scan and the filters of each reader,
    # so that every row of every column read is decoded before any is dropped
    other = {k: v for k, v in sch.items() if k in found and found[k] != v}
    if missing:  # inserted where `sch` has them, so that every file's frame has one column order
        lf = lf.with_columns(missing).select(*sch, *(k for k in found if k not in sch))
    return lf.cast(other, strict=False) if other else lf
