"""The processes and library files a capture starts with."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ..errors import PastaError
from . import discovery


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent has exited already)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def check_pids(pids: list[int]) -> None:
    for pid in pids:
        if pid <= 0 or not Path(f"/proc/{pid}").is_dir():
            raise PastaError(f"no such process: {pid}")


def launch_candidates(env: dict[str, str]) -> list[discovery.Library]:
    """Traced library files a launched command can load by name: those in
    LD_LIBRARY_PATH and in the ld.so cache (others are caught when opened)."""
    paths: list[str] = []
    for d in filter(None, env.get("LD_LIBRARY_PATH", "").split(":")):
        p = Path(d)
        if p.is_dir():
            paths += [str(f) for f in sorted(p.iterdir()) if discovery.family_of(f.name)]
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if target and discovery.family_of(name.split(" ")[0]):
            paths.append(target)
    libs: dict[tuple[int, int], discovery.Library] = {}
    for p in paths:
        try:
            lib = discovery.resolve_library_file(p)
        except OSError:
            continue
        if lib is not None:
            libs.setdefault(lib.key, lib)
    return list(libs.values())
