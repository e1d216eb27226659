"""What tracing needs from the machine: BCC, a kernel with BPF and uprobes,
and the privileges to use them.  Each check raises a one-line PastaError
with the fix; `doctor` runs them all and reports every problem instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import PastaError, PermissionsError

#: Lets the CLI-error tests point the kernel checks at a fake /sys, the one
#: way to show the "kernel without uprobes" message on a kernel that has them.
SYSFS_ENV = "PASTA_TRACE_SYSFS_ROOT"

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
SYS_BPF = 321  # x86-64

BCC_HINT = (
    "install Debian's BCC with `apt-get install python3-bpfcc` and use a Python that sees it "
    "(the system python3, or a venv made with --system-site-packages); never `pip install bcc`, "
    "an unrelated project"
)


#: Debian's sudo secure_path: sudo finds only the programs in these (a venv's bin is not)
SUDO_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def rerun_as_root(argv: list[str] | None = None) -> str:
    """The exact command that runs this one again as root.  sudo resets PATH,
    so a program it would not find (in a venv, say) is named by its path; on
    a machine without sudo it is the command itself, for root to run."""
    argv = sys.argv if argv is None else argv
    program = argv[0] if argv else ""
    if os.path.basename(program) == "pasta-trace":
        program = os.path.abspath(program)
        found = shutil.which("pasta-trace", path=SUDO_PATH)
        cmd = ["pasta-trace" if found and os.path.samefile(found, program) else program]
    else:  # python -m pasta_trace.cli, or embedded
        cmd = [sys.executable, "-m", "pasta_trace.cli"]
    line = shlex.join(cmd + list(argv[1:]))
    return f"sudo {line}" if shutil.which("sudo") else line


def sysfs_root() -> Path:
    return Path(os.environ.get(SYSFS_ENV, "/sys"))


def import_bcc():
    """The bcc module, or a PastaError saying how to install it."""
    try:
        import bcc
    except ImportError as e:
        raise PastaError(f"BCC is not available ({e})", hint=BCC_HINT) from None
    if not hasattr(bcc, "BPF"):
        raise PastaError(f"the `bcc` module at {bcc.__file__} is not BCC", hint=BCC_HINT)
    return bcc


def effective_caps() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def missing_caps(caps: int | None = None) -> list[str]:
    """Capabilities BPF uprobe tracing needs that this process lacks.
    CAP_SYS_ADMIN alone covers both on every kernel."""
    caps = effective_caps() if caps is None else caps
    if caps & (1 << CAP_SYS_ADMIN):
        return []
    return [name for bit, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")) if not caps & (1 << bit)]


def check_privileges() -> None:
    missing = missing_caps()
    if not missing:
        return
    who = "not root" if os.geteuid() != 0 else "root without the needed capabilities"
    raise PermissionsError(
        f"tracing needs {' and '.join(missing)} ({who})",
        hint=f"run it as root: `{rerun_as_root()}`, or grant CAP_BPF and CAP_PERFMON",
    )


@dataclass
class KernelSupport:
    bpf_syscall: bool
    uprobes: bool
    btf: bool

    def problems(self) -> list[str]:
        out = []
        if not self.bpf_syscall:
            out.append("the kernel has no bpf() system call (CONFIG_BPF_SYSCALL)")
        if not self.uprobes:
            out.append("the kernel has no uprobes (CONFIG_UPROBE_EVENTS): no uprobe PMU and no uprobe_events")
        if not self.btf:
            # task storage (bpf_get_current_task_btf) and the struct offsets the probes read come from it
            out.append("the kernel has no BTF (CONFIG_DEBUG_INFO_BTF): no /sys/kernel/btf/vmlinux")
        return out


def bpf_syscall_available() -> bool:
    """bpf() with an invalid command: ENOSYS only when BPF is compiled out."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(SYS_BPF, -1, None, 0)
    return ctypes.get_errno() != errno.ENOSYS


def kernel_support(sys_root: Path | None = None) -> KernelSupport:
    root = sys_root or sysfs_root()
    uprobes = (root / "bus/event_source/devices/uprobe").exists() or any(
        (root / d / "uprobe_events").exists() for d in ("kernel/tracing", "kernel/debug/tracing")
    )
    return KernelSupport(bpf_syscall=bpf_syscall_available(), uprobes=uprobes, btf=(root / "kernel/btf/vmlinux").exists())


def check_kernel() -> None:
    problems = kernel_support().problems()
    if problems:
        raise PastaError(
            "; ".join(problems),
            hint="use a kernel built with CONFIG_BPF_SYSCALL, CONFIG_UPROBE_EVENTS and CONFIG_DEBUG_INFO_BTF "
                 "(Debian's are)",
        )
