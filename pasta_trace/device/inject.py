"""Set up a device backend for a launched command, and collect its device files afterwards.

    s = DeviceSession("sanitizer", out)   # out: the capture's OutputDir; PastaError if the backend cannot run
    env = {**os.environ, **s.env()}        # launch the command with this environment
    ...
    files = s.finish()                     # now in capture_dir/device/

Every traced process writes ``gpu_probes.<pid>.<backend>.bin`` into a staging
folder (``GPU_PROBES_DIR``) beside the capture directory, that the launched
user can write to (the capture directory itself is root's until the end);
``finish`` copies each plain file of the user's into ``capture_dir/device/``,
where :func:`pasta_trace.read.open_capture` finds them.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path

from ..errors import PastaError, UsageError
from ..safe_output import OutputDir, invoking_user, open_adoptable
from .adopt import copy_bounded, copy_problem

BACKENDS = ("sanitizer", "nvbit", "cupti")

_PKG_ROOT = Path(__file__).resolve().parents[2]  # the folder holding pasta_trace/
#: written by scripts/build_gpu_probes.sh: absolute paths of the built artefacts
DEFAULT_MANIFEST = _PKG_ROOT / "gpu_probes" / "build" / "manifest.json"
BOOTSTRAP_DIR = Path(__file__).resolve().parent / "cupti_bootstrap"
_SAMPLE = re.compile(r"^(off|warp:[1-9][0-9]*|cta:[1-9][0-9]*)$")


def built_artefacts(manifest: Path) -> dict[str, str | None]:
    """The manifest's ``artifacts`` (name -> absolute path, null when skipped), or {} when nothing was built."""
    try:
        data = json.loads(manifest.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as e:
        raise PastaError(f"{manifest}: unreadable build manifest ({e})", hint="run scripts/build_gpu_probes.sh") from None
    arts = data.get("artifacts") if isinstance(data, dict) else None
    return arts if isinstance(arts, dict) else {}


def _artefact_path(artefacts: dict[str, str | None], key: str) -> Path | None:
    v = artefacts.get(key)
    return Path(v) if isinstance(v, str) and Path(v).is_file() else None


def _is_python(command: list[str] | None) -> bool:
    """True when the launched command is a Python interpreter (or unknown: the collector's default)."""
    if not command:
        return True
    return re.match(r"^python[0-9.]*$", Path(command[0]).name) is not None


class DeviceSession:
    """One device backend for one launched command."""

    def __init__(
        self,
        backend: str,
        out: OutputDir,
        *,
        page_shift: int | None = None,
        sample: str | None = None,
        hash_slots: int | None = None,
        manifest: str | os.PathLike | None = None,
        command: list[str] | None = None,
    ) -> None:
        if backend not in BACKENDS:
            raise UsageError(f"unknown device backend {backend!r} (choose from {', '.join(BACKENDS)})")
        if page_shift is not None and not 8 <= page_shift <= 30:
            raise UsageError(f"page shift {page_shift} is out of range (8..30, 16 = 64 KiB pages)")
        if sample is not None and not _SAMPLE.match(sample):
            raise UsageError(f"bad sampling {sample!r} (off, warp:N or cta:K)")
        if hash_slots is not None and hash_slots < 8:
            raise UsageError(f"page-hash slots {hash_slots} is too small (at least 8)")
        self.backend = backend
        self.out = out
        self.command = command
        self._options = {
            "GPU_PROBES_PAGE_SHIFT": page_shift,
            "GPU_PROBES_SAMPLE": sample,
            "GPU_PROBES_HASH_SLOTS": hash_slots,
        }
        self._env = self._backend_env(Path(manifest) if manifest else DEFAULT_MANIFEST)
        # under sudo the command runs as the invoking user, who must be able to write there
        self.staging, self._staging_fd = out.staging(invoking_user())

    def _backend_env(self, manifest: Path) -> dict[str, str]:
        if self.backend == "cupti" and not _is_python(self.command):
            # any other program: the C CUPTI injection library (gpu_probes/host/cupti_inject.cpp);
            # never both collectors in one process (one CUPTI subscriber, one output file)
            lib = _artefact_path(built_artefacts(manifest), "cupti")
            if lib is None:
                raise PastaError("CUPTI injection library not built: run scripts/build_gpu_probes.sh")
            return {"CUDA_INJECTION64_PATH": str(lib)}
        if self.backend == "cupti":
            import importlib.util

            if importlib.util.find_spec("cupti") is None:
                raise PastaError(
                    "CUPTI backend needs cupti-python", hint="pip install 'pasta-trace[cupti]' (cupti-python 13.0)"
                )
            return {
                "PYTHONPATH": os.pathsep.join(p for p in (str(BOOTSTRAP_DIR), os.environ.get("PYTHONPATH")) if p),
                "PASTA_TRACE_PYTHONPATH": str(_PKG_ROOT),
            }
        artefacts = built_artefacts(manifest)
        if self.backend == "nvbit":
            lib = _artefact_path(artefacts, "nvbit")
            if lib is None:
                raise PastaError("NVBit tool not built: set NVBIT_HOME and run scripts/build_gpu_probes.sh")
        else:
            lib = _artefact_path(artefacts, "sanitizer")
            if lib is None:
                raise PastaError("Sanitizer backend not built: run scripts/build_gpu_probes.sh")
        # Both tools start from a constructor under LD_PRELOAD.  The Sanitizer tool also has
        # CUDA_INJECTION64_PATH's entry point, but loaded that way it died with SIGSEGV before
        # its first callback on an H200 with driver 580.159.04 (scripts/gpu_check, 2026-12-04),
        # where LD_PRELOAD ran; docs/performance.md, "GPU check".
        preload = os.environ.get("LD_PRELOAD")
        env = {"LD_PRELOAD": f"{lib}:{preload}" if preload else str(lib)}
        env.update({k: str(v) for k, v in self._options.items() if v is not None})
        return env

    def env(self) -> dict[str, str]:
        """Variables to merge into the launched command's environment."""
        return {**self._env, "GPU_PROBES_DIR": str(self.staging)}

    def finish(self) -> list[Path]:
        """Copy the device files written so far into ``capture_dir/device/`` and return them."""
        if self._staging_fd < 0:
            return []
        user = invoking_user()
        out = []
        for name in sorted(fnmatch.filter(os.listdir(self._staging_fd), "gpu_probes.*.bin")):
            src = open_adoptable(self._staging_fd, name, user[0] if user else None)
            if src is None:
                continue
            dest = self.out.subdir("device")
            taken = set(os.listdir(dest.fd))
            stem, suffix = os.path.splitext(name)
            target, n = name, 1
            while target in taken:  # a pid reused within one capture: keep both
                target = f"{stem}.{n}{suffix}"
                n += 1
            try:
                why = copy_problem(src, dest)
                if why is None:
                    try:
                        copy_bounded(dest, target, src)
                    except OSError as e:  # the disk filled meanwhile: nothing half-written is kept
                        why = f"not copied ({e.strerror})"
            finally:
                os.close(src)
            if why is not None:  # left in the staging directory for the user, said in the manifest's notes
                from ..capture.output.manifest import FILE_PROBLEMS

                FILE_PROBLEMS.add(str(self.staging / name), why)
                continue
            os.unlink(name, dir_fd=self._staging_fd)
            out.append(self.out.path / "device" / target)
        os.close(self._staging_fd)
        self._staging_fd = -1
        # something else written there stays for the user to see
        self.out.remove_staging(self.staging.name)
        return out
