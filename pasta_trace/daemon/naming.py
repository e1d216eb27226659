"""A dump's kernel names: those seen at run time, and the ones a capture's
end finds offline (capture.session.finish), found when the dump is written:
the host stubs of runtime launches, named from the mapped files
(capture.naming.symbolize); the driver handles launched inside named
runtime launches (capture.naming.pairing); and the driver handles looked up
before the daemon attached, read from the driver's objects
(capture.naming.attach_names).  The processes are read while they live,
which they usually still do; one that has exited is named from the maps
saved while it ran, as a capture names it."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np
import polars as pl

from .. import schema
from ..capture.naming import symbolize
from ..capture.naming.attach_names import AttachNamer
from ..capture.naming.pairing import nested_launch_names
from ..capture.output.decode import host_stub_aliases, names_frame


@dataclass
class Named:
    names: pl.DataFrame  # names.parquet
    attach_names: dict | None = None  # the manifest's attach_names (AttachNamer.manifest)
    notes: list[str] = field(default_factory=list)  # what could not be named, and why


def dump_names(out_dir: Path, parts: list[np.ndarray], names: np.ndarray, api_names: Sequence[str],
               maps: dict[int, str], build_ids: dict[int, dict]) -> Named:
    """The names of a dump whose events files (``parts``, written) lie in ``out_dir``: ``names``, the
    run-time name records; ``maps`` and ``build_ids``: what was saved of each process while it ran."""
    out = Named(names_frame(names, api_names))
    pids = {int(p) for part in parts for p in np.unique(part["pid"]).tolist()}
    try:
        offline = _offline(out_dir, pids, host_stub_aliases(names, api_names), maps, build_ids)
        out.names = pl.concat([out.names, offline.select(out.names.columns).cast(schema.NAMES_SCHEMA)])
    except Exception as e:  # noqa: BLE001 - naming is best effort; the events are written
        out.notes.append(f"offline kernel naming failed: {type(e).__name__}: {e}")
    try:
        paired = nested_launch_names(out_dir, out.names)
        out.names = pl.concat([out.names, paired]) if not paired.is_empty() else out.names
    except Exception as e:  # noqa: BLE001
        out.notes.append(f"naming driver handles from runtime launches failed: {type(e).__name__}: {e}")
    try:
        namer = AttachNamer(api_names)
        namer.observe(np.empty(0, schema.HOST_EVENT.dtype), names)
        for part in parts:
            namer.observe(part, names[:0])
        found = namer.finish(out.names)
        named = pl.concat([out.names, found]) if not found.is_empty() else out.names
        unnamed = namer.unnamed_rows(named, api_names)
        out.names = pl.concat([named, unnamed]) if not unnamed.is_empty() else named
        out.attach_names = namer.manifest() or None
    except Exception as e:  # noqa: BLE001
        out.notes.append(f"naming handles from the driver's objects failed: {type(e).__name__}: {e}")
    return out


def _offline(out_dir: Path, pids: set[int], aliases: pl.DataFrame, maps: dict[int, str],
             build_ids: dict[int, dict]) -> pl.DataFrame:
    """symbolize.name_capture over a /proc of our own: each process's saved maps (read now where none
    was saved), and its root while it lives (the host's once it has exited)."""
    with tempfile.TemporaryDirectory(prefix="pasta-maps-") as tmp:
        for pid in pids | set(maps):
            alive = Path(f"/proc/{pid}/root").exists()
            text = maps.get(pid)
            if text is None and alive:
                try:
                    text = Path(f"/proc/{pid}/maps").read_text()
                except OSError:
                    continue
            if not text:
                continue
            d = Path(tmp) / str(pid)
            d.mkdir()
            (d / "maps").write_text(text)
            os.symlink(f"/proc/{pid}/root" if alive else "/", d / "root")
        return symbolize.name_capture(out_dir, proc=Path(tmp), aliases=aliases, build_ids=build_ids)
