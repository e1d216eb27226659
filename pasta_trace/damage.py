"""Damaged input met while a verb works: one line that names the file.

Every file passed the checks at open (parquet_scan, which decodes each page
once with Arrow's reader), yet Polars can still fail while a verb works: on a
file changed since, on a page only its decoder rejects, or on values the
analysis cannot use.  It says so with an error that names no file, or with a
panic.  `reading` turns either into a FormatError naming the damaged file,
found by decoding the capture's files one by one with Polars (only then: that
is a second read), or naming the capture when every file decodes.

Rust prints a panic (and, under RUST_BACKTRACE, its backtrace) straight to
file descriptor 2 before Python sees it.  So while a verb reads, what native
code writes there is held in a temporary file and shown at the end, unless it
is the report of a panic: that became the one-line error.  Python's own
stderr keeps going straight to the terminal.  With -v nothing is held.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
from contextlib import contextmanager
from typing import Callable, Iterator

import polars as pl

from .errors import FormatError
from .parquet_scan import POLARS_ERRORS, first_line
from .read import Capture

#: Where held native output holds this, it reports a Rust panic.
PANIC = b"panicked at"


@contextmanager
def reading(load: Callable[[], Capture], *, verbose: bool = False) -> Iterator[Capture]:
    """The capture from `load()`; a decoding error raised while it is read
    becomes a FormatError naming the damaged file."""
    with _native_stderr_held(not verbose):
        cap = None
        try:
            cap = load()
            yield cap
        except POLARS_ERRORS as e:
            raise FormatError(_damaged_file([cap] if cap is not None else [], e)) from None


@contextmanager
def reading_all(load: Callable[[], list[Capture]], *, verbose: bool = False) -> Iterator[list[Capture]]:
    """`reading` of several captures (a cluster merge): the error names the
    damaged file of whichever capture it is in."""
    with _native_stderr_held(not verbose):
        caps: list[Capture] = []
        try:
            caps = load()
            yield caps
        except POLARS_ERRORS as e:
            raise FormatError(_damaged_file(caps, e)) from None


def _damaged_file(caps: list[Capture], err: BaseException) -> str:
    for cap in caps:  # a file not checked yet is checked by Arrow's reader before Polars decodes it
        n = len(cap.damaged)
        cap.device.check_all()
        if len(cap.damaged) > n:
            return cap.damaged[n]
    for f in (f for cap in caps for f in cap.files):
        try:
            # every value decoded (hashed) by the streaming engine, in bounded memory;
            # not collect_batches: it ends quietly, with no batch, when the decoder panics
            pl.scan_parquet(str(f), glob=False).select(pl.all().hash().sum()).collect(engine="streaming")
        except POLARS_ERRORS as e:
            return f"{f}: damaged Parquet data ({first_line(e)})"
        except OSError as e:
            return f"{f}: cannot read ({e.strerror})"
    # every file decodes: values the analysis cannot use (or a bug), said as Polars says it
    where = ", ".join(str(cap.path) for cap in caps)
    return f"{where}: {first_line(err)}" if where else first_line(err)


def left_out(*caps: Capture) -> None:
    """After a verb did what it could: FormatError (exit 1) naming each file
    of `caps` that was left out, when there is one."""
    for cap in caps:  # a file whose check waited for a reader that never came is said too
        cap.device.check_all()
    damaged = [d for cap in caps for d in cap.damaged]
    n = len(damaged)
    if n == 1:
        raise FormatError(f"{damaged[0]} (left out; the rest was read)")
    if n > 1:
        more = f"; and {n - 3} more" if n > 3 else ""
        raise FormatError(f"{n} files left out (the rest was read): {'; '.join(damaged[:3])}{more}")


def _on_fd2(stream: object) -> bool:
    try:
        return stream.fileno() == 2  # type: ignore[attr-defined]
    except (AttributeError, OSError, ValueError):
        return False  # a stream that is no file (a test's capture): leave it as it is


@contextmanager
def _native_stderr_held(enabled: bool) -> Iterator[None]:
    try:
        terminal = os.dup(2) if enabled else -1
    except OSError:  # no descriptor 2 at all (started with 2>&-): nothing to keep clean
        terminal = -1
    if terminal < 0:
        yield
        return
    python_stderr = sys.stderr
    python_stderr.flush()
    held = tempfile.TemporaryFile()
    os.dup2(held.fileno(), 2)
    ours = None
    if _on_fd2(python_stderr):
        ours = io.TextIOWrapper(io.FileIO(terminal, "w", closefd=False), encoding=python_stderr.encoding,
                                errors="backslashreplace", line_buffering=True)
        sys.stderr = ours
    try:
        yield
    finally:
        if ours is not None:
            ours.close()  # flushes; the descriptor stays open (closefd=False)
        sys.stderr = python_stderr
        os.dup2(terminal, 2)
        os.close(terminal)
        held.seek(0)
        text = held.read()
        held.close()
        if text and PANIC not in text:
            with open(2, "wb", closefd=False) as out:
                out.write(text)
