"""A capture's device frames, each file checked before Polars first reads it.

Every Parquet file is checked at open (parquet_scan) except the access
samples' (parquet_scan.DEFERRED), whose pages are decoded once, by whoever
reads them first, a column at a time:

- the merge's pass over the samples (merge/sample_batches.py) decodes the
  pages of the five columns it reads with Arrow's reader itself, which is
  their check: it takes the file with `unchecked`, and says how it went
  with `checked` (those columns) or `leave_out`;
- a reader through Polars (`frames[name]`, `.items()`, ...), which may read
  any column, gets the frame after the check of every column not checked
  yet, as open would have checked it: a damaged file left out and said,
  rows without a pid dropped (parquet_scan.keyed).

A verb has the columns no reader checked checked at its end
(damage.left_out), so that a damaged file is always said.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from pathlib import Path

import polars as pl

from . import schema
from .parquet_scan import KEYS, POLARS_ERRORS, data_problem, keyed


class DeviceFrames(MutableMapping):
    """schema.DEVICE_FRAMES name -> lazy frame, with the data checks that wait."""

    def __init__(self, frames: dict[str, pl.LazyFrame], pending: dict[str, Path] | None = None) -> None:
        self._frames = dict(frames)
        self._pending = dict(pending or {})
        self.problems: list[str] = []
        self.damaged: list[str] = []
        self.files: list[Path] = []
        #: frame -> column -> its nulls, for the columns of a waiting file checked so far
        self._done: dict[str, dict[str, int]] = {}
        #: the copies made by `replaced`, this one among them: a check any of them runs is theirs too
        self._peers = [self]

    def replaced(self, name: str, lf: pl.LazyFrame) -> DeviceFrames:
        """A copy with frame `name` replaced by `lf`, sharing this one's
        checks: what either checks, both read checked, once."""
        other = DeviceFrames.__new__(DeviceFrames)
        other.__dict__.update(self.__dict__)
        other._frames = {**self._frames, name: lf}
        self._peers.append(other)
        return other

    def attach(self, problems: list[str], damaged: list[str], files: list[Path]) -> None:
        """Say what the checks find in these lists (the Capture's own)."""
        self.problems, self.damaged, self.files = problems, damaged, files

    def __getitem__(self, name: str) -> pl.LazyFrame:
        if name in self._pending:
            self._check(name)
        return self._frames[name]

    def __setitem__(self, name: str, lf: pl.LazyFrame) -> None:
        self._pending.pop(name, None)
        self._frames[name] = lf

    def __delitem__(self, name: str) -> None:
        self._pending.pop(name, None)
        del self._frames[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._frames)

    def __len__(self) -> int:
        return len(self._frames)

    @property
    def pending(self) -> list[str]:
        """The frames whose file no reader has checked yet."""
        return list(self._pending)

    def unchecked(self, name: str) -> Path | None:
        """The file of `name` when its check still waits: for a reader that
        decodes the pages of the columns it reads with Arrow's reader (their
        check) and then says `checked` or `leave_out`."""
        return self._pending.get(name)

    def rows(self, name: str) -> int:
        """The frame's rows, from the Parquet footer when the check waits
        (that footer was checked at open): no page is decoded."""
        path = self._pending.get(name)
        if path is None:
            return self[name].select(pl.len()).collect().item()
        return pl.scan_parquet(str(path), glob=False).select(pl.len()).collect().item()

    def checked(self, name: str, nulls: dict[str, int]) -> None:
        """Every page of the columns `nulls` names decoded, with these nulls;
        once every column of the file is, the file is checked."""
        done = self._done.setdefault(name, {})
        done.update(nulls)
        if self._unchecked_columns(name) != []:
            return
        nulls = self._done.pop(name)
        self._pending.pop(name)
        for peer in self._peers:
            peer._frames[name] = keyed(peer._frames[name], [nulls], KEYS["device"], f"device {name}",
                                       self.problems if peer is self else [])

    def leave_out(self, name: str, why: str) -> None:
        """`name`'s file is damaged (`why`: its path, what is wrong): the
        frame is empty from now on, the file said in the damaged ones."""
        path = self._pending.pop(name, None)
        self._done.pop(name, None)
        for peer in self._peers:
            peer._frames[name] = schema.empty_frame(schema.DEVICE_FRAMES[name]).lazy()
        self.damaged.append(why)
        self.problems.append(why)
        if path in self.files:
            self.files.remove(path)

    def check_all(self) -> None:
        """Run every check that still waits."""
        for name in self.pending:
            self._check(name)

    def _unchecked_columns(self, name: str) -> list[str] | None:
        """The file's columns not checked yet; None (every one) when its
        footer cannot be read now (changed since open: the check says how)."""
        done = self._done.get(name, {})
        try:
            return [c for c in pl.read_parquet_schema(self._pending[name]) if c not in done]
        except (*POLARS_ERRORS, OSError):
            return None

    def _check(self, name: str) -> None:
        path = self._pending[name]
        nulls: dict[str, int] = {}
        why = data_problem(path, nulls, self._unchecked_columns(name))
        if why is None:
            self.checked(name, nulls)
        else:
            self.leave_out(name, f"{path}: {why}")
