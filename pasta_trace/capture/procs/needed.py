"""The shared libraries a launched program will load at start, found before
it runs: its DT_NEEDED entries, and theirs, looked up the way ld.so does
(DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, the ld.so cache, the default
directories; `$ORIGIN` expanded).  Launch mode needs them to probe a CUDA
runtime linked into one of them (`nvcc -shared` links libcudart_static) from
its first call: such a file has no traced name for the open-time stop to
catch.  Each file is read bounded (elf_tables), from a regular file only."""

from __future__ import annotations

import os

import numpy as np
from elftools.common.exceptions import ELFError

from ...elf_tables import ElfImage
from ...regular_file import open_library

DT_NEEDED, DT_RPATH, DT_RUNPATH = 1, 15, 29
DEFAULT_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64", "/lib", "/usr/lib")
MAX_FILES = 1024  # a program with more libraries than this has its others caught when opened, if traced
MAX_DYNAMIC = 1 << 20


def _dynamic(path: str) -> tuple[list[str], list[str], list[str]]:
    """(needed, rpath dirs, runpath dirs) of the ELF file at ``path``."""
    with open_library(path) as f:
        img = ElfImage(f, path)
        dyn, strs = img.section(".dynamic"), img.section(".dynstr")
        if dyn is None or strs is None:
            return [], [], []
        entries = np.frombuffer(img.section_data(dyn, MAX_DYNAMIC), dtype=[("tag", "<i8"), ("val", "<u8")])
        table = img.section_data(strs, MAX_DYNAMIC)

    def text(off: int) -> str:
        end = table.find(b"\0", off)
        return table[off:end if end >= 0 else len(table)].decode(errors="replace")

    out: dict[int, list[str]] = {DT_NEEDED: [], DT_RPATH: [], DT_RUNPATH: []}
    for tag, val in entries.tolist():
        if tag in out and val < len(table):
            out[tag].append(text(val))
    split = lambda vals: [d for v in vals for d in v.split(":") if d]  # noqa: E731
    return out[DT_NEEDED], split(out[DT_RPATH]), split(out[DT_RUNPATH])


def _expand(d: str, origin: str) -> str:
    return d.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)


def needed_files(exe: str, env: dict[str, str], cache: dict[str, str]) -> list[str]:
    """Real paths of the libraries ``exe`` loads at start (not ``exe``);
    ``cache``: the ld.so cache, soname -> path (`ldconfig -p`).  Files that
    cannot be read are left out (ld.so would fail on them, or they are
    caught when opened)."""
    env_dirs = [d for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    found: dict[str, None] = {}
    queue = [(os.path.realpath(exe), [])]  # (file, the rpaths its loaders pass down)
    done: set[str] = set()
    while queue and len(found) < MAX_FILES:
        path, inherited = queue.pop(0)
        if path in done:
            continue
        done.add(path)
        try:
            needed, rpath, runpath = _dynamic(path)
        except (OSError, ValueError, ELFError):  # a script, a damaged file: ld.so would not load it either
            continue
        origin = os.path.dirname(path)
        # DT_RPATH applies to the object's own needs and, without DT_RUNPATH, to those below it
        own_rpath = [] if runpath else [_expand(d, origin) for d in rpath] + inherited
        dirs = own_rpath + env_dirs + [_expand(d, origin) for d in runpath]
        for name in needed:
            if "/" in name:
                cands = [name]
            else:
                cands = [os.path.join(d, name) for d in dirs]
                cands += [cache[name]] if name in cache else []
                cands += [os.path.join(d, name) for d in DEFAULT_DIRS]
            hit = next((c for c in cands if os.path.isfile(c)), None)
            if hit is not None:
                real = os.path.realpath(hit)
                found.setdefault(real, None)
                queue.append((real, own_rpath))
    found.pop(os.path.realpath(exe), None)
    return list(found)
