"""The C headers generated from the records: the BPF programs' and the device side's."""

from __future__ import annotations

from .versions import DEVICE_FORMAT_VERSION, DEVICE_MAGIC
from .host import COMM_LEN, CopyKind, FLAG_AT_EXIT, FLAG_HAS_DUR, FLAG_HAS_RET, FLAG_OUTPTR_FAULT, FNV_OFFSET, FNV_PRIME, HOST_RECORDS, Kind, NAME_LEN, NCCL_DATATYPES, NCCL_SLOTS, NameSource, PAYLOAD_BITS
from .losses import INFLIGHT_DEPTH, loss_c_defines, tally_c_defines
from .device import DEVICE_RECORDS, DeviceAllocKind, DeviceBackend, DeviceRecordType, InjectionMode, LoadingMode, TOOL_STATUS_NOT_CALLED, ToolStage


def bpf_c_header() -> str:
    """C text prepended to the BPF programs: structs, enums and bits."""
    out = ["/* Generated from pasta_trace/schema/: do not edit. */"]
    for k in Kind:
        out.append(f"#define PT_KIND_{k.name.upper()} {int(k)}")
    for k in CopyKind:
        out.append(f"#define PT_COPY_{k.name.upper()} {int(k)}")
    for s in NameSource:
        out.append(f"#define PT_NAME_{s.name.upper()} {int(s)}")
    for name, bit in PAYLOAD_BITS.items():
        out.append(f"#define PT_V_{name.upper()} (1u << {bit})")
    for name, slot in NCCL_SLOTS.items():
        out.append(f"#define PT_NCCL_{name.upper()} {slot}")
    sizes = sum(size << (4 * i) for i, (_, size) in enumerate(NCCL_DATATYPES))
    out += [
        f"#define PT_NCCL_NUM_TYPES {len(NCCL_DATATYPES)}",
        f"#define PT_NCCL_ELEM_SIZES 0x{sizes:x}ULL /* 4 bits per ncclDataType_t */",
        f"#define PT_NCCL_FNV_OFFSET 0x{FNV_OFFSET:x}ULL",
        f"#define PT_NCCL_FNV_PRIME 0x{FNV_PRIME:x}ULL",
    ]
    out += [
        f"#define PT_FLAG_HAS_RET {FLAG_HAS_RET}",
        f"#define PT_FLAG_HAS_DUR {FLAG_HAS_DUR}",
        f"#define PT_FLAG_OUTPTR_FAULT {FLAG_OUTPTR_FAULT}",
        f"#define PT_FLAG_AT_EXIT {FLAG_AT_EXIT}",
        f"#define PT_COMM_LEN {COMM_LEN}",
        f"#define PT_NAME_LEN {NAME_LEN}",
        f"#define PT_DEPTH {INFLIGHT_DEPTH}",
    ]
    out.append(loss_c_defines("lost").rstrip("\n"))
    out.append(tally_c_defines().rstrip("\n"))
    for r in HOST_RECORDS:
        out.append(r.c_struct())
    return "\n".join(out) + "\n"


def device_c_header() -> str:
    """C/C++ header for gpu_probes (checked in as include/gpu_probes/record.h)."""
    out = [
        "/* Generated from pasta_trace/schema/ by `python -m pasta_trace.schema --write`: do not edit. */",
        "#pragma once",
        "#include <stdint.h>",
        "typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;",
        "typedef int32_t __s32; typedef int64_t __s64;",
        f"#define GP_MAGIC 0x{DEVICE_MAGIC:08X}u",
        f"#define GP_VER_MAJOR {DEVICE_FORMAT_VERSION[0]}",
        f"#define GP_VER_MINOR {DEVICE_FORMAT_VERSION[1]}",
    ]
    for t in DeviceRecordType:
        out.append(f"#define GP_REC_{t.name} {int(t)}")
    for b in DeviceBackend:
        out.append(f"#define GP_BACKEND_{b.name.upper()} {int(b)}")
    for k in DeviceAllocKind:
        out.append(f"#define GP_ALLOC_{k.name.rstrip('_').upper()} {int(k)}")
    for prefix, e in (("GP_STAGE", ToolStage), ("GP_LOADING", LoadingMode), ("GP_INJECTION", InjectionMode)):
        out.extend(f"#define {prefix}_{k.name.upper()} {int(k)}" for k in e)
    out.append(f"#define GP_RC_NOT_CALLED ({TOOL_STATUS_NOT_CALLED})")
    for r in DEVICE_RECORDS:
        out.append(r.c_struct())
        out.append(
            f"#ifdef __cplusplus\nstatic_assert(sizeof(struct {r.name}) == {r.size}, \"{r.name} size\");\n#endif"
        )
    return "\n".join(out) + "\n"


DEVICE_HEADER_PATH = "gpu_probes/include/gpu_probes/record.h"
