"""The Parquet files of a capture or timeline, checked before they are scanned.

A file that is no regular file, not Parquet, cut short, or holds a column of
another type than schema.py declares is left out with one line that names it
and says what is wrong; the other files are scanned as usual.  A scan never
casts a value to null silently: the types are compared first.  Damage inside
the data pages shows only when they are decoded: pasta_trace.damage names the
file then.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from polars.exceptions import PanicException

from . import schema
from .errors import FormatError
from .regular_file import open_regular

#: Errors Polars raises for a file it cannot decode: its own, and a panic
#: (damage that trips an assertion in its decoder), which is no Exception.
POLARS_ERRORS = (pl.exceptions.PolarsError, PanicException)


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


def parquet_problem(path: Path, sch: dict[str, pl.DataType]) -> tuple[dict | None, str | None]:
    """(the file's schema, None), or (None, what is wrong with it): not a
    regular file, not Parquet, a damaged footer, a column of another type."""
    try:
        fd = open_regular(path)
    except FormatError as e:
        return None, str(e).removeprefix(f"{path}: ")
    try:
        size = os.fstat(fd).st_size
        if size < 12 or os.pread(fd, 4, 0) != b"PAR1":
            return None, "not a Parquet file"
        if os.pread(fd, 4, size - 4) != b"PAR1":
            return None, "truncated Parquet file (no footer at its end)"
    finally:
        os.close(fd)
    try:
        found = dict(pl.read_parquet_schema(path))
    except POLARS_ERRORS as e:
        return None, f"damaged Parquet footer ({first_line(e)})"
    except OSError as e:
        return None, f"cannot read ({e.strerror})"
    wrong = [f"column {k} is {found[k]}, expected {t}" for k, t in sch.items()
             if k in found and not type_fits(found[k], t)]
    return (None, wrong[0]) if wrong else (found, None)


@dataclass
class Scanner:
    """Scans the Parquet files of one capture or timeline after checking each;
    a file that fails a check is left out, said in `damaged`."""

    damaged: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)

    def frames(self, paths: list[Path], sch: dict[str, pl.DataType]) -> pl.LazyFrame:
        """One lazy frame of the schema `sch` over the files that pass."""
        by_schema: dict[tuple, list[Path]] = {}
        for p in paths:
            found, why = parquet_problem(p, sch)
            if why is not None:
                self.damaged.append(f"{p}: {why}")
                continue
            self.files.append(p)
            by_schema.setdefault(tuple(found.items()), []).append(p)  # type: ignore[union-attr]
        if not by_schema:
            return pl.DataFrame(schema=sch).lazy()
        # one scan per distinct file schema: a multi-file scan wants them all alike
        parts = [_conform(pl.scan_parquet([str(p) for p in ps], glob=False), dict(key), sch)
                 for key, ps in by_schema.items()]
        return parts[0] if len(parts) == 1 else pl.concat(parts, how="diagonal")

    def optional(self, path: Path, sch: dict[str, pl.DataType]) -> pl.LazyFrame | None:
        """The frame of one file, None when it is absent or left out."""
        if not os.path.lexists(path):
            return None
        n = len(self.damaged)
        lf = self.frames([path], sch)
        return None if len(self.damaged) > n else lf

    def one(self, path: Path, sch: dict[str, pl.DataType]) -> pl.LazyFrame:
        """The frame of one file; empty when it is absent or left out."""
        lf = self.optional(path, sch)
        return pl.DataFrame(schema=sch).lazy() if lf is None else lf

    def device(self, d: Path) -> dict[str, pl.LazyFrame]:
        """Decoded device frames stored as d/<frame>.parquet, scanned lazily."""
        out = {}
        for name, sch in schema.DEVICE_FRAMES.items():
            lf = self.optional(d / f"{name}.parquet", sch)
            if lf is not None:
                out[name] = lf
        return out


def _conform(lf: pl.LazyFrame, found: dict[str, pl.DataType], sch: dict[str, pl.DataType]) -> pl.LazyFrame:
    # a column added in a later minor version reads as null from older files
    missing = [pl.lit(None, v).alias(k) for k, v in sch.items() if k not in found]
    return (lf.with_columns(missing) if missing else lf).cast(dict(sch), strict=False)
