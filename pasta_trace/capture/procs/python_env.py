"""Traced libraries a Python environment holds (PyTorch's libc10.so in a
venv or conda environment, a CUDA runtime from a wheel): where `--dry-run`
and `doctor` look for what a Python program would load, since such
libraries are found through the packages' own paths, not through ld.so's
cache.  Nothing is run: the interpreter's path names its environment."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from . import discovery

_PYTHON = re.compile(r"^python[0-9.]*$")


def interpreter(argv0: str, env: dict[str, str]) -> Path | None:
    """The Python interpreter `argv0` names (a path, or a name in PATH), or None."""
    if not _PYTHON.match(os.path.basename(argv0)):
        return None
    found = argv0 if "/" in argv0 else shutil.which(argv0, path=env.get("PATH"))
    return Path(os.path.abspath(found)) if found else None


def site_dirs(python: Path, env: dict[str, str]) -> list[Path]:
    """Package directories of the environment `python` belongs to: its
    prefix's site- and dist-packages, the base interpreter's when a venv sees
    them (pyvenv.cfg), and PYTHONPATH."""
    prefixes = [python.parent.parent]  # .../bin/python -> the environment (venv, conda, /usr)
    cfg = prefixes[0] / "pyvenv.cfg"
    if cfg.is_file():
        conf = dict(line.split("=", 1) for line in cfg.read_text(errors="replace").splitlines() if "=" in line)
        conf = {k.strip(): v.strip() for k, v in conf.items()}
        if conf.get("include-system-site-packages") == "true" and conf.get("home"):
            prefixes.append(Path(conf["home"]).parent)
    dirs: list[Path] = []
    for prefix in prefixes:
        for pattern in ("lib/python3*/site-packages", "lib/python3/dist-packages", "local/lib/python3*/dist-packages"):
            dirs += sorted(prefix.glob(pattern))
    dirs += [Path(p) for p in env.get("PYTHONPATH", "").split(":") if p]
    return [d for d in dict.fromkeys(dirs) if d.is_dir()]


def traced_libraries(argv0: str, env: dict[str, str]) -> list[str]:
    """Traced library files (discovery.family_of) in the packages of the
    Python environment `argv0` runs in, e.g. torch/lib/libc10.so; [] when
    `argv0` is not a Python interpreter."""
    python = interpreter(argv0, env)
    if python is None:
        return []
    out: list[str] = []
    for site in site_dirs(python, env):
        # <package>/lib/ (torch) and <namespace>/<package>/lib/ (nvidia/cuda_runtime)
        for lib in [*site.glob("*/lib/lib*.so*"), *site.glob("*/*/lib/lib*.so*")]:
            if discovery.family_of(lib.name) and lib.is_file():
                out.append(str(lib))
    return sorted(dict.fromkeys(out))
