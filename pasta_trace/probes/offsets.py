"""Offsets of the vendor structs the BPF handlers read, kept in one place.

They are emitted as ``#define PT_OFF_<STRUCT>_<FIELD>`` into the BPF text and
checked by ``tests/unit/test_struct_offsets.py`` against ``offsetof`` in the
toolkit's ``cuda.h``/``cuda_runtime_api.h`` and Debian's HIP headers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Offset:
    struct: str  # short name used in the #define
    c_type: str  # C type name as the headers spell it
    field: str  # member designator for offsetof
    header: str  # 'cuda' (cuda.h + cuda_runtime_api.h) | 'hip' (hip_runtime_api.h)
    value: int

    @property
    def define(self) -> str:
        return f"PT_OFF_{self.struct.upper()}_{self.field.replace('.', '_').upper()}"


def _struct(struct: str, c_type: str, header: str, fields: dict[str, int]) -> list[Offset]:
    return [Offset(struct, c_type, f, header, v) for f, v in fields.items()]


#: CUlaunchConfig (cuLaunchKernelEx). HIP_LAUNCH_CONFIG (hipDrvLaunchKernelEx,
#: ROCm 6.5+) is byte-identical, so the same constants serve it.
LAUNCH_CFG_CU = _struct(
    "cfgcu",
    "CUlaunchConfig",
    "cuda",
    {
        "gridDimX": 0,
        "gridDimY": 4,
        "gridDimZ": 8,
        "blockDimX": 12,
        "blockDimY": 16,
        "blockDimZ": 20,
        "sharedMemBytes": 24,
        "hStream": 32,
    },
)

#: cudaLaunchConfig_t; hipLaunchConfig_t (hipLaunchKernelExC, ROCm 6.5+) has
#: the same layout.
LAUNCH_CFG_RT = _struct(
    "cfgrt",
    "cudaLaunchConfig_t",
    "cuda",
    {"gridDim": 0, "blockDim": 12, "dynamicSmemBytes": 24, "stream": 32},
)

MEMCPY2D = _struct(
    "m2d",
    "CUDA_MEMCPY2D",
    "cuda",
    {
        "srcMemoryType": 16,
        "srcHost": 24,
        "srcDevice": 32,
        "srcArray": 40,
        "dstMemoryType": 72,
        "dstHost": 80,
        "dstDevice": 88,
        "dstArray": 96,
        "WidthInBytes": 112,
        "Height": 120,
    },
)

#: CUDA_MEMCPY3D; CUDA_MEMCPY3D_PEER shares every offset used here.
MEMCPY3D = _struct(
    "m3d",
    "CUDA_MEMCPY3D",
    "cuda",
    {
        "srcMemoryType": 32,
        "srcHost": 40,
        "srcDevice": 48,
        "srcArray": 56,
        "dstMemoryType": 120,
        "dstHost": 128,
        "dstDevice": 136,
        "dstArray": 144,
        "WidthInBytes": 176,
        "Height": 184,
        "Depth": 192,
    },
)
MEMCPY3D_PEER = [
    Offset("m3d", "CUDA_MEMCPY3D_PEER", o.field, "cuda", o.value) for o in MEMCPY3D
]

HIP_MEMCPY3D = _struct(
    "h3d",
    "hipMemcpy3DParms",
    "hip",
    {
        "srcArray": 0,
        "srcPtr.ptr": 32,
        "dstArray": 64,
        "dstPtr.ptr": 96,
        "extent.width": 128,
        "extent.height": 136,
        "extent.depth": 144,
        "kind": 152,
    },
)

#: Constants emitted into the BPF text (each define once).
BPF_OFFSETS: tuple[Offset, ...] = tuple(LAUNCH_CFG_CU + LAUNCH_CFG_RT + MEMCPY2D + MEMCPY3D + HIP_MEMCPY3D)

#: Every offset the tests compare with the compiler, including the structs
#: that reuse another struct's constants.
CHECKED_OFFSETS: tuple[Offset, ...] = BPF_OFFSETS + tuple(MEMCPY3D_PEER)

#: Sizes of the structs read whole (bytes).
SIZES = {"CUlaunchConfig": 56, "cudaLaunchConfig_t": 56, "CUDA_MEMCPY2D": 128, "CUDA_MEMCPY3D": 200,
         "CUDA_MEMCPY3D_PEER": 200, "hipMemcpy3DParms": 160}

#: CUmemorytype values (cuda.h) used to pick the 2D/3D copy pointers and direction.
CU_MEMORYTYPE = {"HOST": 1, "DEVICE": 2, "ARRAY": 3, "UNIFIED": 4}


def c_defines() -> str:
    lines = [f"#define {o.define} {o.value}" for o in BPF_OFFSETS]
    lines += [f"#define PT_CU_MEMORYTYPE_{k} {v}" for k, v in CU_MEMORYTYPE.items()]
    return "\n".join(lines) + "\n"
