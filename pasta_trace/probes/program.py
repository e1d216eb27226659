"""The BPF program text, built in one place (``build`` from a ``Spec``) for
every capture mode, the dry run, --print-bpf, the compiled-handlers cache,
the benchmarks and the tests.

The probes program: schema header + configuration + bpf/*.bpf.c + one
instantiation line per probed API, generated from the catalog so that ids,
kinds and shapes come from one table.  The discover program
(bpf/discover.bpf.c, capture.procs.late_load reads what it reports) follows
it, or stands alone with a pid_filter of its own."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from pasta_trace import schema
from pasta_trace.errors import PastaError
from pasta_trace.probes import catalog, offsets
from pasta_trace.probes.kernel_offsets import discover_offsets


def _bpf_dir() -> Path:
    """bpf/ of a source checkout (editable install), else the copy a wheel
    installs as pasta_trace/bpf (setup.py)."""
    package = Path(__file__).resolve().parents[1]
    checkout = package.parent / "bpf"
    return checkout if (checkout / "pasta.h").is_file() else package / "bpf"


BPF_DIR = _bpf_dir()
SOURCES = ("pasta.h", "cuda.bpf.c", "hip.bpf.c", "c10.bpf.c", "nccl.bpf.c", "cudart.bpf.c")
STACK_SOURCE = "pystack.h"  # after SOURCES: it writes the events pasta.h built
STACK_PROGRAM = "pt_stack_event"  # the tail-call target of every handler with stacks on
NATIVE_SOURCE = "nativestack.h"  # after STACK_SOURCE: the Python walker tail-calls it
NATIVE_PROGRAM = "pt_native_event"
NATIVE_TAIL_SLOT = 1
DISCOVER_SOURCE = "discover.bpf.c"
REACH_SOURCE = "reach.h"  # before SOURCES (pt_skip uses it); again in the discover program, guarded  # PT_TAIL_NATIVE of bpf/pasta.h; slot 0 when it is the only stack program

DEFAULT_RING_PAGES = 1024  # 4 MiB with 4 KiB pages: ~30k events between drains
DEFAULT_NAMES_PAGES = 64
DEFAULT_STACK_PAGES = 256  # the pystacks ring (capture.session.options.DEFAULT_STACK_PAGES for a capture)
DEFAULT_NATIVE_PAGES = 2048  # the nativestacks ring: ~1000 samples of 8 KiB between drains
PID_FILTER_MAX = 4096
#: lowers PID_FILTER_MAX, for the tests that fill pid_filter
PID_FILTER_MAX_ENV = "PASTA_TRACE_TEST_PID_FILTER_MAX"
#: Python processes whose stacks are walked at once (bpf/pystack.h's py_procs); PY_PROCS_MAX_ENV
#: lowers it, for the tests that fill it
PY_PROCS_MAX = 4096
PY_PROCS_MAX_ENV = "PASTA_TRACE_TEST_PY_PROCS_MAX"
#: processes with streams under capture at once (bpf/pasta.h's capturing), and with NCCL communicators'
#: comm_ids (bpf/nccl.bpf.c's pt_nccl_ids); the _ENV names lower them, for the tests that fill them
CAPTURE_MAX = 4096
CAPTURE_MAX_ENV = "PASTA_TRACE_TEST_CAPTURE_MAX"
NCCL_IDS_MAX = 4096
NCCL_IDS_MAX_ENV = "PASTA_TRACE_TEST_NCCL_IDS_MAX"
VMLINUX_BTF = Path("/sys/kernel/btf/vmlinux")

# The discover program's maps (bpf/discover.bpf.c; capture.procs.late_load reads them).
#: library files (inodes) with probes that the kernel remembers; beyond it, each open of another one is paused
KNOWN_MAX = 1024
#: processes stopped at once, waiting for the tracer
STOPS_MAX = 16384
#: pages of the fork/exec/exit ring (80 bytes a record: 13,000 of them).  It fills while the
#: tracer attaches to a new library (a second or more), and -a reports every process of the
#: machine: 16 pages dropped 1,223 notifications of 200 processes started during one attach.
DISCOVER_PAGES = 256
#: files mapped executable with nothing to probe that the kernel remembers (an LRU: one
#: forgotten costs its next mapping a stop)
PLAIN_MAX = 65536
#: pasta-trace's own processes of one tracer (the tracer, its writer, its guardian), with room to spare
#: for those of other tracers
OWN_MAX = 64

# Bytes of kind-specific data after each BTF type record, by kind; *vlen
# where the kind has one entry per member (linux/btf.h).
_BTF_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}
_BTF_PER_VLEN = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}


def handler_names(api: catalog.Api) -> tuple[str, str | None]:
    """Names of the BPF functions for ``api``: (entry, return or None)."""
    return f"pt_e_{api.symbol}", (f"pt_r_{api.symbol}" if api.ret else None)


def instantiation(api: catalog.Api) -> str:
    return f"{api.macro}({api.symbol}, {catalog.API_ID[api.symbol]}, {int(api.kind)}, {api.arg})"


def return_instantiation(api: catalog.Api) -> str | None:
    """The uretprobe of a call whose entry handler saves its event (bpf/pasta.h, PT_RET_SAVED)."""
    return f"PT_RET_SAVED({api.symbol}, {catalog.API_ID[api.symbol]}, {int(api.kind)})" if api.saved else None


def save_define(api: catalog.Api) -> str:
    """Whether ``api``'s entry handler saves its event for its return probe (1) or writes it (0)."""
    return f"#define PT_SAVE_{catalog.API_ID[api.symbol]} {int(api.saved)}"


_ROLES = {None: "PT_ROLE_NONE", "outer": "PT_ROLE_OUTER", "inner": "PT_ROLE_INNER"}


def role_define(api: catalog.Api) -> str:
    """``api``'s part in nesting (bpf/pasta.h, pt_nest), read by its handler."""
    return f"#define PT_ROLE_{catalog.API_ID[api.symbol]} {_ROLES[api.nest_role]}"


def struct_member_offsets(wanted: dict[str, tuple[str, ...]], btf: Path = VMLINUX_BTF) -> dict[tuple[str, str], int]:
    """Byte offsets of direct members of kernel structs in the running kernel
    (its BTF): {(struct, member): offset} for those found; empty without BTF."""
    try:
        data = btf.read_bytes()
    except OSError:
        return {}
    magic, _, _, hdr_len, type_off, type_len, str_off, _ = struct.unpack_from("<HBBIIIII", data)
    if magic != 0xEB9F:
        return {}
    strings = hdr_len + str_off

    def name(off: int) -> bytes:
        return data[strings + off : data.index(b"\0", strings + off)]

    todo = {s.encode(): {m.encode() for m in members} for s, members in wanted.items()}
    out: dict[tuple[str, str], int] = {}
    pos, end = hdr_len + type_off, hdr_len + type_off + type_len
    while pos < end and todo:
        name_off, info, _ = struct.unpack_from("<III", data, pos)
        kind, vlen = (info >> 24) & 0x1F, info & 0xFFFF
        pos += 12
        if kind == 4 and (members := todo.get(name(name_off))) is not None:
            struct_name = name(name_off)
            del todo[struct_name]  # the first definition is the kernel's (modules' BTF is elsewhere)
            for m in range(vlen):
                m_name, _, m_off = struct.unpack_from("<III", data, pos + 12 * m)
                if name(m_name) in members:
                    out[(struct_name.decode(), name(m_name).decode())] = (m_off & 0xFFFFFF if info >> 31 else m_off) // 8
        pos += _BTF_FIXED.get(kind, 0) + _BTF_PER_VLEN.get(kind, 0) * vlen
    return out


def task_comm_offset(btf: Path = VMLINUX_BTF) -> int | None:
    """Byte offset of ``comm`` in the running kernel's ``struct task_struct``
    (from its BTF), or None without BTF.  The handlers load the comm straight
    from the task with it: bpf_get_current_comm cost ~50 ns more per event."""
    return struct_member_offsets({"task_struct": ("comm",)}, btf).get(("task_struct", "comm"))


#: the credential members bpf/reach.h compares with the allowed uid
CRED_MEMBERS = {"task_struct": ("cred",), "cred": ("uid", "euid", "suid", "fsuid")}


def reach_text(allowed_uid: int | None, btf: Path = VMLINUX_BTF) -> str:
    """bpf/reach.h with its configuration: events and stops of processes whose
    uids are all ``allowed_uid`` only (capture.procs.reach), or of every process
    (None).  Refuses (PastaError) when the running kernel's BTF does not give
    the credential offsets: a restricted capture never runs unrestricted."""
    head = []
    if allowed_uid is not None:
        offs = struct_member_offsets(CRED_MEMBERS, btf)
        need = [(s, m) for s, ms in CRED_MEMBERS.items() for m in ms]
        missing = [f"{s}.{m}" for s, m in need if (s, m) not in offs]
        if missing:
            raise PastaError(f"cannot restrict the capture to the processes of uid {allowed_uid}: the running "
                             f"kernel's BTF ({btf}) does not give {', '.join(missing)}",
                             hint="run `pasta-trace doctor`")
        head = [f"#define PT_ALLOWED_UID {int(allowed_uid)}u",
                *(f"#define PT_OFF_{s.upper()}_{m.upper()} {offs[(s, m)]}" for s, m in need)]
    return "\n".join(head) + "\n" + (BPF_DIR / REACH_SOURCE).read_text()


def _power_of_two(name: str, n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two, got {n}")


@dataclass(frozen=True)
class Spec:
    """What the BPF program text depends on.  ``probes``: the probes program;
    ``discover``: the discover program after it, or alone (``probes=False``)
    with a pid_filter of its own.  ``apis`` limits the handlers that are
    compiled (attach only those); their ids stay the catalog's.
    ``stack_depth``: record the caller's Python stack on every event, up to
    that many frames (bpf/pystack.h); None: no stacks.  ``aggregate_max``:
    rows the --aggregate map holds (calls of further rows count in lost_agg).
    ``native_stacks``: copy the user stack of the events of
    schema.NATIVE_STACK_KINDS and of failed calls ("default"), or of every
    event ("all"); None: none (bpf/nativestack.h).  ``allowed_uid``: events
    of that user's processes only (capture.procs.reach; None: every process).
    ``known_max``: library files the discover program remembers."""

    probes: bool = True
    discover: bool = True
    ring_pages: int = DEFAULT_RING_PAGES
    names_pages: int = DEFAULT_NAMES_PAGES
    aggregate: bool = False
    aggregate_max: int = schema.DEFAULT_AGGREGATE_MAX
    filter_pids: bool = False
    apis: tuple[catalog.Api, ...] = field(default=catalog.APIS, repr=False)
    stack_depth: int | None = None
    stack_pages: int = DEFAULT_STACK_PAGES
    native_stacks: str | None = None
    native_pages: int = DEFAULT_NATIVE_PAGES
    allowed_uid: int | None = None
    known_max: int = KNOWN_MAX


def build(spec: Spec) -> str:
    """C text for ``bcc.BPF(text=...)``: the programs ``spec`` names."""
    if spec.probes and spec.discover:
        return _probes_text(spec) + _discover_text(spec, alone=False)
    if spec.probes:
        return _probes_text(spec)
    if spec.discover:
        return schema.bpf_c_header() + _discover_text(spec, alone=True)
    raise ValueError("a BPF program needs the probes, the discover program or both")


def _probes_text(spec: Spec) -> str:
    ring_pages, names_pages, aggregate = spec.ring_pages, spec.names_pages, spec.aggregate
    aggregate_max, filter_pids, apis, stack_depth = spec.aggregate_max, spec.filter_pids, spec.apis, spec.stack_depth
    stack_pages, native_stacks, native_pages = spec.stack_pages, spec.native_stacks, spec.native_pages
    allowed_uid = spec.allowed_uid
    _power_of_two("ring_pages", ring_pages)
    _power_of_two("names_pages", names_pages)
    if aggregate_max < 1:
        raise ValueError(f"aggregate_max must be at least 1, got {aggregate_max}")
    config = [
        f"#define PT_RING_PAGES {ring_pages}",
        f"#define PT_NAMES_PAGES {names_pages}",
        f"#define PT_AGG_MAX {aggregate_max}",
        f"#define PT_PID_FILTER_MAX {int(os.environ.get(PID_FILTER_MAX_ENV) or PID_FILTER_MAX)}",
        f"#define PT_CAPTURE_MAX {int(os.environ.get(CAPTURE_MAX_ENV) or CAPTURE_MAX)}",
        f"#define PT_NCCL_IDS_MAX {int(os.environ.get(NCCL_IDS_MAX_ENV) or NCCL_IDS_MAX)}",
    ]
    comm = task_comm_offset()
    if comm is not None:
        config.append(f"#define PT_TASK_COMM_OFF {comm}")
    if aggregate:
        config.append("#define PT_AGGREGATE 1")
    if filter_pids:
        config.append("#define PT_FILTER_PIDS 1")
    stacks = stack_depth is not None and not aggregate  # --aggregate keeps no events to carry them
    if stacks:
        _power_of_two("stack_pages", stack_pages)
        procs_max = int(os.environ.get(PY_PROCS_MAX_ENV) or PY_PROCS_MAX)
        config += ["#define PT_PYSTACKS 1", f"#define PT_PYSTACK_PAGES {stack_pages}",
                   f"#define PT_PY_PROCS_MAX {procs_max}"]
    native = native_stacks is not None and not aggregate
    if native:
        if native_stacks not in ("default", "all"):
            raise ValueError(f"native_stacks must be 'default' or 'all', got {native_stacks!r}")
        _power_of_two("native_pages", native_pages)
        config += ["#define PT_NATIVESTACKS 1", f"#define PT_NATIVE_PAGES {native_pages}"]
    parts = [schema.bpf_c_header(), "\n".join(config) + "\n", offsets.c_defines()]
    if stacks:
        parts.append(schema.stacks_c_header(stack_depth))
    if native:
        parts.append(schema.native_stacks_c_header(None if native_stacks == "all" else schema.NATIVE_STACK_KINDS))
    parts.append(reach_text(allowed_uid))
    parts += [(BPF_DIR / s).read_text() for s in SOURCES]
    if stacks:
        parts.append((BPF_DIR / STACK_SOURCE).read_text())
    if native:
        parts.append((BPF_DIR / NATIVE_SOURCE).read_text())
    parts.append("/* generated from pasta_trace/probes/catalog.py */\n" + "".join(role_define(a) + "\n" for a in apis)
                 + "".join(save_define(a) + "\n" for a in apis)
                 + "".join(instantiation(a) + "\n" for a in apis)
                 + "".join(r + "\n" for a in apis if (r := return_instantiation(a))))
    return "\n".join(parts)


def _discover_source() -> Path:
    """bpf/discover.bpf.c, from a source checkout or an installed package."""
    path = BPF_DIR / DISCOVER_SOURCE
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from this installation")
    return path


def _discover_text(spec: Spec, *, alone: bool) -> str:
    """The discover program's C text, after the probes program (which already
    includes schema.bpf_c_header() and, when filtering, pid_filter), or
    ``alone``: declaring pid_filter itself."""
    head = [
        f"#define PT_DISCOVER_FILTER {int(spec.filter_pids)}",
        f"#define PT_PATH_LEN {schema.DISCOVER_PATH_LEN}",
        f"#define PT_KNOWN_MAX {spec.known_max}",
        f"#define PT_PLAIN_MAX {PLAIN_MAX}",
        f"#define PT_STOPS_MAX {STOPS_MAX}",
        f"#define PT_DISCOVER_PAGES {DISCOVER_PAGES}",
        f"#define PT_OWN_MAX {OWN_MAX}",
        schema.loss_c_defines("discover_lost").rstrip("\n"),
        *(f"#define {name} {off}" for name, off in discover_offsets().items()),
        *(f"#define PT_DISCOVER_{t.name} {int(t)}" for t in schema.DiscoverType),
        schema.DISCOVER_EVENT.c_struct(),
        schema.KNOWN_FILE.c_struct(),
        schema.STOP_RECORD.c_struct(),
    ]
    if alone:
        head += ["#define PT_DISCOVER_ALONE 1", "BPF_HASH(pid_filter, u32, u8, 65536);"]
    # pt_foreign: the probes program's (which defines the allowed uid under sudo), or none
    reach = (BPF_DIR / REACH_SOURCE).read_text()
    return "\n".join(head) + "\n" + reach + _discover_source().read_text()
