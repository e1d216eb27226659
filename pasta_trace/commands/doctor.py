"""`pasta-trace doctor`: check what tracing needs and say what to fix."""

from __future__ import annotations

import argparse
import glob
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..privilege import drop_to_user

HELP = "check the kernel, BPF, BCC, headers and GPU libraries (and PyTorch's), and say what to fix"

EXAMPLES = """\
  pasta-trace doctor                  every check (some need root to be conclusive)
  sudo pasta-trace doctor -v          also list the probed functions each library lacks
"""

VENDOR_CACHE = Path(os.environ.get("XDG_CACHE_HOME", str(Path.home() / ".cache"))) / "pasta-trace" / "vendor"


@dataclass
class Check:
    ok: bool
    what: str
    fix: str = ""

    def line(self) -> str:
        tag = "ok  " if self.ok else "FAIL"
        return f"{tag} {self.what}" + (f"\n     fix: {self.fix}" if self.fix and not self.ok else "")


def add_arguments(p: argparse.ArgumentParser) -> None:
    pass


def _kernel_checks() -> list[Check]:
    from ..capture.session import checks
    from ..probes import uprobe_link

    k = checks.kernel_support()
    tracefs = Path("/sys/kernel/tracing/events").is_dir() or Path("/sys/kernel/debug/tracing/events").is_dir()
    return [
        Check(True, f"kernel {platform.release()} ({platform.machine()})"),
        Check(k.bpf_syscall, "bpf() system call", "a kernel with CONFIG_BPF_SYSCALL=y"),
        Check(k.uprobes, "uprobes (uprobe PMU or uprobe_events)", "a kernel with CONFIG_UPROBE_EVENTS=y"),
        Check(k.btf, "kernel BTF (/sys/kernel/btf/vmlinux): the probes' task storage and struct offsets",
              "a kernel with CONFIG_DEBUG_INFO_BTF=y"),
        # pasta-trace uses raw tracepoints only, so tracefs is informational
        Check(True, "tracefs " + ("mounted" if tracefs else "not mounted (not needed: raw tracepoints only)")),
        Check(True, "uprobe_multi links: " + ("yes (probes are removed in under a second)" if uprobe_link.available()
                                              else "no, Linux < 6.6 (perf-event uprobes instead, removed in the "
                                                   "background at 0.1-0.25 s each)")),
    ]


def _privilege_check() -> Check:
    from ..capture.session import checks

    missing = checks.missing_caps()
    who = "root" if os.geteuid() == 0 else f"uid {os.geteuid()}"
    if not missing:
        return Check(True, f"privileges ({who}): CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN)")
    return Check(False, f"privileges ({who}): missing {' and '.join(missing)}",
                 f"run it as root: `{checks.rerun_as_root()}` (or grant CAP_BPF,CAP_PERFMON)")


def _bcc_checks() -> tuple[list[Check], object]:
    from ..capture.session import checks
    from ..errors import PastaError

    try:
        bcc = checks.import_bcc()
    except PastaError as e:
        return [Check(False, f"BCC: {e}", checks.BCC_HINT)], None
    version = getattr(bcc, "__version__", "?")
    return [Check(True, f"BCC {version} ({Path(bcc.__file__).parent})")], bcc


def _header_check() -> Check:
    build = Path(f"/lib/modules/{platform.release()}/build")
    if not build.exists():
        if Path("/sys/kernel/kheaders.ko").exists() or Path("/sys/kernel/kheaders.tar.xz").exists():
            return Check(True, "kernel headers: none installed, BCC will use /sys/kernel/kheaders.tar.xz")
        return Check(False, f"kernel headers: {build} is missing",
                     "apt-get install linux-headers-$(uname -r), or run scripts/setup.sh (it links Debian's "
                     "headers when the running kernel has none)")
    target = os.path.realpath(build)
    debian = target.startswith("/usr/src/linux-headers-")
    note = ""
    if debian and platform.release() not in target:
        note = " (Debian's headers of another kernel: the fallback scripts/setup.sh sets up; fine for uprobes)"
    return Check(True, f"kernel headers: {build} -> {target}{note}")


def _bpf_load_check(bcc) -> Check:
    """Compile and load a one-line program: headers, clang and the verifier together."""
    if bcc is None or os.geteuid() != 0:
        return Check(True, "BPF load test skipped (needs root and BCC)")
    try:
        b = bcc.BPF(text="#include <uapi/linux/ptrace.h>\nint f(struct pt_regs *ctx) { return 0; }\n")
        b.load_func("f", bcc.BPF.KPROBE)
        b.cleanup()
    except Exception as e:  # noqa: BLE001 - BCC raises bare Exception
        return Check(False, f"BCC could not compile and load a test program: {str(e).splitlines()[0]}",
                     "check the kernel headers (above) and the BCC install")
    return Check(True, "BCC compiles and loads a BPF program")


def _bpf_cache_check() -> Check:
    """Where the compiled handlers are kept (probes/compiled_cache), and whether they can be."""
    if os.geteuid() != 0:
        return Check(True, "compiled BPF handlers cache: not checked (root's)")
    from ..probes import compiled_cache

    ok, what = compiled_cache.state()
    return Check(ok, f"compiled BPF handlers cache: {what}",
                 f"make it root's, mode 0700, or remove it, or set {compiled_cache.ENV} to another directory")


def _python_envs() -> list[str]:
    """Interpreters whose environments may hold traced libraries (torch's
    libc10.so): the active venv or conda environment, and python3 in PATH."""
    envs = [os.environ.get("VIRTUAL_ENV"), os.environ.get("CONDA_PREFIX")]
    return [str(Path(e) / "bin" / "python") for e in envs if e] + ["python3"]


#: Where the CUDA toolkit keeps libcudart (it is rarely in the ld.so cache).
CUDA_LIB_GLOBS = ("/usr/local/cuda*/lib64/libcudart.so*", "/usr/local/cuda*/targets/*/lib/libcudart.so*")


def _library_files() -> dict[str, tuple[str, set[str]]]:
    """Traced library files on this machine -> (family, where they were found)."""
    from ..capture.procs import discovery, python_env

    found: dict[str, tuple[str, set[str]]] = {}

    def add(path: str, family: str, where: str) -> None:
        found.setdefault(path, (family, set()))[1].add(where)

    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if target and (fam := discovery.family_of(name.split(" ")[0])):
            add(os.path.realpath(target), fam, "ldconfig")
    cuda_home = os.environ.get("CUDA_HOME")
    for pattern in (*CUDA_LIB_GLOBS, *([f"{cuda_home}/lib64/libcudart.so*"] if cuda_home else [])):
        for f in glob.glob(pattern):
            if discovery.family_of(f) and os.path.isfile(f):
                add(os.path.realpath(f), "cudart", "CUDA toolkit")
    for p in discovery.scan_all(skip={os.getpid()}):
        for lib in p.traced:
            where = f"PID {p.pid}" if discovery.family_of(lib.path) else f"PID {p.pid}, the CUDA runtime linked in"
            add(lib.attach_path if lib.path.endswith(" (deleted)") else lib.path, lib.family, where)
    for name in _python_envs():
        python = python_env.interpreter(name, dict(os.environ))
        try:
            libs = python_env.traced_libraries(str(python), dict(os.environ)) if python else []
        except OSError:  # an environment this user may not read (under sudo: the user's reach)
            libs = []
        for f in libs:
            if fam := discovery.family_of(f):
                add(os.path.realpath(f), fam, f"python env {python.parent.parent}")
    for f in glob.glob(str(VENDOR_CACHE / "**" / "lib*.so*"), recursive=True):
        if (fam := discovery.family_of(f)) and os.path.isfile(f):
            add(os.path.realpath(f), fam, "vendor cache")
    # PyTorch's CPU build for the tests (scripts/fetch_torch_cpu.sh)
    for f in glob.glob(str(VENDOR_CACHE.parent / "torch-*" / "torch" / "lib" / "lib*.so*")):
        if fam := discovery.family_of(f):
            add(os.path.realpath(f), fam, "torch test cache")
    return found


def _cudart_checks() -> list[Check]:
    """Per process that maps a CUDA runtime: where it lives (a shared
    libcudart.so.N, or linked into which files): a runtime linked into a file
    is probed there, and a user reading a capture needs to know which."""
    from ..capture.procs import discovery

    return [Check(True, discovery.process_cudart(p)) for p in discovery.scan_all(skip={os.getpid()})
            if any(lib.family == "cudart" for lib in p.traced)]


def _library_checks(verbose: bool) -> list[Check]:
    from ..capture.session.dry_run import probe_plan

    files = _library_files()
    if not files:
        return [Check(True, "GPU libraries: no libcuda.so*, libcudart.so*, libamdhip64.so*, libc10.so* or "
                            "libnccl.so* found (nothing to trace yet; libraries loaded later are caught when opened)")]
    out = []
    for path, (fam, where) in sorted(files.items()):
        try:
            plan = probe_plan(path, fam)
        except Exception as e:  # noqa: BLE001 - an unreadable or damaged ELF
            out.append(Check(False, f"{path} ({fam}): cannot read its symbols: {e}", "check the file"))
            continue
        fwd = f" ({len(plan.aliases)} more reported under the functions they jump to)" if plan.aliases else ""
        what = (f"{path} ({fam}; {', '.join(sorted(where))}): {len(plan.attach)} probes would attach{fwd}, "
                f"{len(plan.missing)} probed functions missing")
        if verbose and plan.missing:
            what += "\n     missing: " + ", ".join(plan.missing)
        out.append(Check(bool(plan.attach), what,
                         "not a CUDA driver, CUDA runtime, HIP runtime, PyTorch or NCCL library?"))
    return out


def run(args: argparse.Namespace) -> int:
    # what needs root reads only the system's own files; the library checks
    # read other processes' maps and the package directories the environment
    # names (VIRTUAL_ENV, CONDA_PREFIX, PATH): under sudo they run as the user
    results = _kernel_checks()
    results.append(_privilege_check())
    bcc_results, bcc = _bcc_checks()
    results += bcc_results
    results.append(_header_check())
    results.append(_bpf_load_check(bcc))
    results.append(_bpf_cache_check())
    if (user := drop_to_user()) is not None:
        results.append(Check(True, f"the checks below ran as uid {user[0]}, who ran sudo: they see only what "
                                   "that user may read"))
    results += _library_checks(args.verbose)
    results += _cudart_checks()
    for c in results:
        print(c.line())
    problems = [c for c in results if not c.ok]
    if problems:
        print(f"\n{len(problems)} problem(s)")
    else:
        from ..capture.session.checks import rerun_as_root

        print(f"\nall good: `{rerun_as_root([sys.argv[0], '-p', 'PID'])}` will work")
    return 0 if not problems else 1
