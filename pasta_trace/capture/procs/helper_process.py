"""How a tracer starts its own Python helpers (the events writer, the
guardians): isolated, so that no code from outside the installed package
runs in them as root (docs/security.md).

`python -m MODULE` puts the current directory first on ``sys.path``, and sudo
keeps the caller's directory: a ``pasta_trace/`` package there ran as root.
So a helper is started with ``-I`` (no current directory, no user site, no
PYTHON* variables), from ``/``, with a clean environment, and the one path it
is given is the directory this very package was imported from: the helper
runs the tracer's own code, whatever is installed elsewhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

#: what a helper keeps of the tracer's environment: who ran sudo (the events
#: writer makes its files as that user) and how text and times are shown
KEPT_ENV = ("SUDO_UID", "SUDO_GID", "SUDO_USER", "LANG", "LC_ALL", "TZ")
#: Debian's sudo secure_path
SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CWD = "/"

#: argv[1] the package's parent directory, argv[2] the module, the rest its arguments
_BOOT = (
    "import sys,runpy\n"
    "p=sys.argv.pop(1)\n"
    "sys.path[:]=[x for x in sys.path if x not in ('','.')]\n"
    "p in sys.path or sys.path.insert(0,p)\n"
    "runpy.run_module(sys.argv.pop(1),run_name='__main__',alter_sys=True)\n"
)


def package_parent() -> str:
    """The directory this pasta_trace package was imported from (one level
    up from the package per dot of this module's name, wherever it sits)."""
    return str(Path(__file__).resolve().parents[__name__.count(".")])


def argv(module: str, *args: object) -> list[str]:
    """The command line that runs `module` as __main__ with `args`, isolated."""
    return [sys.executable, "-I", "-c", _BOOT, package_parent(), module, *map(str, args)]


def env() -> dict[str, str]:
    """The helper's whole environment."""
    return {"PATH": SAFE_PATH, **{k: os.environ[k] for k in KEPT_ENV if k in os.environ}}
