"""Every probed CUDA driver, CUDA runtime, HIP and PyTorch (libc10) entry point, in one table.

The index of an :class:`Api` in :data:`APIS` is the ``api`` id the BPF programs
write into events and names, so the table is append-only in spirit: the capture
stores the names next to the ids, but keeping the order stable keeps captures
comparable.  ``symbol`` is the exact exported name (for HIP 5.x's C++-mangled
``hipExtModuleLaunchKernel`` the mangled name is its own entry).  ``label``
is what the capture's ``api`` column says when it is not the symbol: the
demangled name of a C++ function (``c10::reportMemoryUsageToProfiler``).

``shape`` names the BPF macro that decodes the arguments (``PT_H_<SHAPE>`` in
``bpf/*.bpf.c``); ``arg`` is that macro's shape-specific parameter (a CopyKind
for copies, the element size for memsets, a NameSource for name lookups).
Struct offsets live in :mod:`pasta_trace.probes.offsets` and are checked
against the vendor headers by ``tests/unit/test_struct_offsets.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from pasta_trace.schema import CopyKind, Kind, Layer, NameSource

#: ``arg`` of the struct-decoding copy shapes when the direction comes from the
#: struct's memory types rather than from the API name.
COPY_FROM_STRUCT = 255

#: Shapes whose handler pairs the entry with a uretprobe.
RETURN_SHAPES = frozenset(
    {
        "alloc",
        "alloc_flags",
        "alloc_stream",
        "alloc_pool",
        "alloc_pitch",
        "sync_stream",
        "sync_handle",
        "sync_none",
        "name_lookup",
        "kernel_get_function",
        "func_get_name",
        "module_load",
        "get_proc_address",
        "nccl_reduce_op",
        "nccl_reduce_root",
        "nccl_root",
        "nccl_gather",
        "nccl_p2p",
        "nccl_none",
        "nccl_comm",
        "nccl_init_rank",
        "nccl_init_all",
        "nccl_split",
        "nccl_unique_id",
        "nccl_version",
        "init",
        "device_count",
        "device_get",
        "ctx_create",
        "rt_device_count",
        "rt_set_device",
        "capture_begin",
        "capture_end",
        "graph_instantiate",
        "graph_create",
        "graph_kernel_node",
        "graph_node",
        "graph_child_node",
    }
)

#: Kinds of the entry-only shapes whose return code is taken by a uretprobe
#: all the same (bpf/pasta.h, PT_RET_SAVED): the entry handler builds the
#: event and the return writes it with `ret` and `dur_ns`, so a failed
#: launch, copy, memset or free is seen, and a failed copy moves no bytes.
SAVED_KINDS = frozenset({Kind.launch, Kind.free, Kind.memcpy, Kind.memset})

#: Every shape the BPF sources define, with the family whose file holds it
#: ("common" = bpf/pasta.h).
SHAPES: dict[str, str] = {
    "launch_cu": "common",
    "launch_rt": "common",
    "launch_cfg_cu": "common",
    "launch_cfg_rt": "common",
    "launch_hcc": "hip",
    "graph_launch": "common",
    "capture_begin": "common",
    "capture_end": "common",
    "graph_instantiate": "common",
    "graph_exec": "common",
    "graph_create": "common",
    "graph_destroy": "common",
    "graph_kernel_node": "common",
    "graph_node": "common",
    "graph_child_node": "common",
    "host_func": "common",
    "event_record": "common",
    "stream_wait_event": "common",
    "alloc": "common",
    "alloc_flags": "common",
    "alloc_stream": "common",
    "alloc_pool": "common",
    "alloc_pitch": "common",
    "range": "common",
    "vmm_map": "common",
    "free": "common",
    "free_stream": "common",
    "copy": "common",
    "copy_async": "common",
    "copy_peer": "common",
    "copy_peer_async": "common",
    "copy_hip": "hip",
    "copy_hip_async": "hip",
    "copy_2d_cu": "cuda",
    "copy_2d_cu_async": "cuda",
    "copy_3d_cu": "cuda",
    "copy_3d_cu_async": "cuda",
    "copy_2d_hip": "hip",
    "copy_2d_hip_async": "hip",
    "copy_3d_hip": "hip",
    "copy_3d_hip_async": "hip",
    "memset": "common",
    "memset_async": "common",
    "memset2d": "common",
    "memset2d_async": "common",
    "sync_stream": "common",
    "sync_handle": "common",
    "sync_none": "common",
    "name_lookup": "common",
    "kernel_get_function": "common",
    "func_get_name": "common",
    "module_load": "common",
    "register_function": "common",
    "get_proc_address": "cuda",
    "init": "cuda",
    "device_count": "cuda",
    "device_get": "cuda",
    "ctx_create": "cuda",
    "rt_device_count": "cudart",
    "rt_set_device": "cudart",
    "launch_rt_caller": "cudart",
    "launch_cfg_rt_caller": "cudart",
    "copy_rt": "cudart",
    "copy_rt_async": "cudart",
    "copy_symbol": "cudart",
    "copy_symbol_async": "cudart",
    "copy_2d_rt": "cudart",
    "copy_2d_rt_async": "cudart",
    "tensor_report": "c10",
    "tensor_new": "c10",
    "tensor_delete": "c10",
    "nccl_reduce_op": "nccl",
    "nccl_reduce_root": "nccl",
    "nccl_root": "nccl",
    "nccl_gather": "nccl",
    "nccl_p2p": "nccl",
    "nccl_none": "nccl",
    "nccl_comm": "nccl",
    "nccl_init_rank": "nccl",
    "nccl_init_all": "nccl",
    "nccl_split": "nccl",
    "nccl_unique_id": "nccl",
    "nccl_version": "nccl",
}

#: The layer each family's calls are seen at (the `layer` column).  HIP's
#: library is the HIP runtime: there is no separate driver library below it.
FAMILY_LAYER: dict[str, Layer] = {
    "cuda": Layer.driver, "cudart": Layer.runtime, "hip": Layer.runtime, "c10": Layer.framework, "nccl": Layer.nccl,
}

#: How a family's calls take part in nesting (bpf/pasta.h, pt_nest): an
#: "outer" call marks its thread, and a call of an "inner" family (or a
#: deeper call of the same outer family) of the same kind made before it
#: returns is its nested part (kind `nested`, counted once by the outer call).
NEST_ROLE: dict[str, str] = {"cudart": "outer", "cuda": "inner"}


@dataclass(frozen=True)
class Api:
    symbol: str
    family: str  # 'cuda' | 'hip' | 'cudart' | 'c10' | 'nccl'
    kind: Kind
    shape: str
    ret: bool  # needs a uretprobe
    category: str  # row of the coverage table in docs/probes.md
    arg: int = 0  # shape-specific: CopyKind, element size or NameSource
    label: str = ""  # the `api` column's name when it is not `symbol`

    @property
    def saved(self) -> bool:
        """An entry-only shape whose event waits for the return code (SAVED_KINDS)."""
        return self.ret and self.shape not in RETURN_SHAPES

    @property
    def api_name(self) -> str:
        return self.label or self.symbol

    @property
    def macro(self) -> str:
        return "PT_H_" + self.shape.upper()

    @property
    def layer(self) -> Layer:
        return FAMILY_LAYER[self.family]

    @property
    def nest_role(self) -> str | None:
        return NEST_ROLE.get(self.family)


def _api(symbol: str, family: str, kind: Kind, shape: str, category: str, arg: int = 0, label: str = "") -> Api:
    if shape not in SHAPES:
        raise ValueError(f"{symbol}: unknown shape {shape}")
    ret = shape in RETURN_SHAPES or (kind in SAVED_KINDS and family in ("cuda", "hip", "cudart"))
    return Api(symbol, family, kind, shape, ret, category, int(arg), label)


#: The APIs that launch a graph exec (`func`), whose kernels the merge counts
#: per launch (merge/graphs.py).
GRAPH_LAUNCHES = frozenset({"cuGraphLaunch", "cuGraphLaunch_ptsz", "cudaGraphLaunch", "cudaGraphLaunch_ptsz"})


def _graphs(add, p: str) -> None:
    """CUDA graphs, driver (p = "cu") and runtime ("cuda"): the same names and
    argument orders.  Stream capture marks a stream (bpf/pasta.h, pt_capture)
    so a launch, copy or memset on it is kind `captured` (a stream joined to
    the capture by an event wait too: _stream_ordering); the end gives the graph (`ptr`),
    instantiation the exec (`func`) of a graph (`ptr`); explicit construction
    adds kernel nodes (kind `captured`, `ptr` = the graph) and child graphs
    (`src`).  The kernel node of the runtime (cudaKernelNodeParams) has the
    driver's CUDA_KERNEL_NODE_PARAMS layout up to sharedMemBytes.  Every
    cuGraphInstantiate* export takes (CUgraphExec *out, CUgraph, ...), the
    legacy cuGraphInstantiate and _v2 with an error node and log after."""
    G = Kind.graph
    add([f"{p}StreamBeginCapture", f"{p}StreamBeginCapture_ptsz", f"{p}StreamBeginCaptureToGraph",
         f"{p}StreamBeginCaptureToGraph_ptsz"] + ([f"{p}StreamBeginCapture_v2", f"{p}StreamBeginCapture_v2_ptsz"]
                                                 if p == "cu" else []), G, "capture_begin", "graphs")
    add([f"{p}StreamEndCapture", f"{p}StreamEndCapture_ptsz"], G, "capture_end", "graphs")
    add([f"{p}GraphInstantiate", f"{p}GraphInstantiateWithFlags", f"{p}GraphInstantiateWithParams",
         f"{p}GraphInstantiateWithParams_ptsz"] + ([f"{p}GraphInstantiate_v2"] if p == "cu" else []),
        G, "graph_instantiate", "graphs")
    add([f"{p}GraphUpload", f"{p}GraphUpload_ptsz"], G, "graph_launch", "graphs")
    add([f"{p}GraphExecDestroy"], G, "graph_exec", "graphs")
    add([f"{p}GraphCreate"], G, "graph_create", "graphs")
    add([f"{p}GraphDestroy"], G, "graph_destroy", "graphs")
    add([f"{p}GraphAddKernelNode"], Kind.captured, "graph_kernel_node", "graphs")
    if p == "cu":  # CUDA_KERNEL_NODE_PARAMS_v2: a null func is a CUkernel in `kern`
        add(["cuGraphAddKernelNode_v2"], Kind.captured, "graph_kernel_node", "graphs", 1)
    add([f"{p}GraphAddMemcpyNode"], G, "graph_node", "graphs")
    add([f"{p}GraphAddChildGraphNode"], G, "graph_child_node", "graphs")


def _stream_ordering(add, p: str) -> None:
    """Event record and stream wait, driver (p = "cu") and runtime ("cuda"):
    the same names and argument orders.  The host does not wait in them, so
    they are kind `other`, never `sync` (the sync tools count time blocked).
    Under stream capture they fork and join streams: an event recorded on a
    capturing stream takes its capture, and a stream that waits on it
    captures into the same graph until the origin's end (bpf/pasta.h,
    pt_capture_record, pt_capture_wait); `dst` = that capture's id."""
    O = Kind.other
    add([f"{p}EventRecord", f"{p}EventRecord_ptsz"], O, "event_record", "stream ordering")
    add([f"{p}EventRecordWithFlags", f"{p}EventRecordWithFlags_ptsz"], O, "event_record", "stream ordering", 1)
    add([f"{p}StreamWaitEvent", f"{p}StreamWaitEvent_ptsz"], O, "stream_wait_event", "stream ordering")


def _cuda() -> list[Api]:
    L, A, F, C, M, S = Kind.launch, Kind.alloc, Kind.free, Kind.memcpy, Kind.memset, Kind.sync
    out: list[Api] = []

    def add(symbols, kind, shape, category, arg=0):
        out.extend(_api(s, "cuda", kind, shape, category, arg) for s in symbols)

    add(["cuLaunchKernel", "cuLaunchKernel_ptsz"], L, "launch_cu", "launch")
    add(["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"], L, "launch_cfg_cu", "launch")
    add(["cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"], L, "launch_cu", "launch")
    add(["cuLaunchHostFunc", "cuLaunchHostFunc_ptsz"], L, "host_func", "launch")
    add(["cuGraphLaunch", "cuGraphLaunch_ptsz"], Kind.graph, "graph_launch", "launch")
    _graphs(add, "cu")

    add(["cuMemAlloc_v2"], A, "alloc", "alloc")
    add(["cuMemAllocPitch_v2"], A, "alloc_pitch", "alloc")
    add(["cuMemAllocManaged"], A, "alloc_flags", "alloc")
    add(["cuMemAllocAsync", "cuMemAllocAsync_ptsz"], A, "alloc_stream", "alloc")
    add(["cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz"], A, "alloc_pool", "alloc")
    add(["cuMemAllocHost_v2"], A, "alloc", "alloc")
    add(["cuMemHostAlloc"], A, "alloc_flags", "alloc")
    # VMM: physical memory is created/released by handle: cuMemCreate's `ptr`
    # is the opaque handle it returns, cuMemRelease's the handle it releases,
    # never an address (lifetimes: kind "physical").  Address ranges are
    # reserved, mapped, given access and freed (kind other, ptr/size = the
    # range; cuMemMap's `src` = the handle mapped there): a device address is
    # attributed to the cuMemMap range that holds it (kind "mapping").
    add(["cuMemCreate"], A, "alloc", "vmm")
    add(["cuMemRelease"], F, "free", "vmm")
    add(["cuMemAddressReserve"], Kind.other, "alloc", "vmm")
    add(["cuMemMap"], Kind.other, "vmm_map", "vmm")
    add(["cuMemUnmap", "cuMemSetAccess", "cuMemAddressFree"], Kind.other, "range", "vmm")

    add(["cuMemFree_v2", "cuMemFreeHost"], F, "free", "free")
    add(["cuMemFreeAsync", "cuMemFreeAsync_ptsz"], F, "free_stream", "free")

    add(["cuMemcpy", "cuMemcpy_ptds"], C, "copy", "copy", CopyKind.default)
    add(["cuMemcpyAsync", "cuMemcpyAsync_ptsz"], C, "copy_async", "copy", CopyKind.default)
    for d, ck in (("HtoD", CopyKind.h2d), ("DtoH", CopyKind.d2h), ("DtoD", CopyKind.d2d)):
        add([f"cuMemcpy{d}_v2", f"cuMemcpy{d}_v2_ptds"], C, "copy", "copy", ck)
        add([f"cuMemcpy{d}Async_v2", f"cuMemcpy{d}Async_v2_ptsz"], C, "copy_async", "copy", ck)
    add(["cuMemcpyPeer", "cuMemcpyPeer_ptds"], C, "copy_peer", "copy", CopyKind.peer)
    add(["cuMemcpyPeerAsync", "cuMemcpyPeerAsync_ptsz"], C, "copy_peer_async", "copy", CopyKind.peer)
    add(
        ["cuMemcpy2D_v2", "cuMemcpy2D_v2_ptds", "cuMemcpy2DUnaligned_v2", "cuMemcpy2DUnaligned_v2_ptds"],
        C,
        "copy_2d_cu",
        "copy 2D/3D",
        COPY_FROM_STRUCT,
    )
    add(["cuMemcpy2DAsync_v2", "cuMemcpy2DAsync_v2_ptsz"], C, "copy_2d_cu_async", "copy 2D/3D", COPY_FROM_STRUCT)
    add(["cuMemcpy3D_v2", "cuMemcpy3D_v2_ptds"], C, "copy_3d_cu", "copy 2D/3D", COPY_FROM_STRUCT)
    add(["cuMemcpy3DAsync_v2", "cuMemcpy3DAsync_v2_ptsz"], C, "copy_3d_cu_async", "copy 2D/3D", COPY_FROM_STRUCT)
    # CUDA_MEMCPY3D_PEER has CUDA_MEMCPY3D's offsets (srcContext sits in reserved0).
    add(["cuMemcpy3DPeer", "cuMemcpy3DPeer_ptds"], C, "copy_3d_cu", "copy 2D/3D", CopyKind.peer)
    add(["cuMemcpy3DPeerAsync", "cuMemcpy3DPeerAsync_ptsz"], C, "copy_3d_cu_async", "copy 2D/3D", CopyKind.peer)

    for bits, elem in ((8, 1), (16, 2), (32, 4)):
        add([f"cuMemsetD{bits}_v2", f"cuMemsetD{bits}_v2_ptds"], M, "memset", "memset", elem)
        add([f"cuMemsetD{bits}Async", f"cuMemsetD{bits}Async_ptsz"], M, "memset_async", "memset", elem)
        add([f"cuMemsetD2D{bits}_v2", f"cuMemsetD2D{bits}_v2_ptds"], M, "memset2d", "memset", elem)
        add([f"cuMemsetD2D{bits}Async", f"cuMemsetD2D{bits}Async_ptsz"], M, "memset2d_async", "memset", elem)

    add(["cuStreamSynchronize", "cuStreamSynchronize_ptsz"], S, "sync_stream", "sync")
    add(["cuCtxSynchronize"], S, "sync_none", "sync")
    add(["cuCtxSynchronize_v2", "cuEventSynchronize"], S, "sync_handle", "sync")
    _stream_ordering(add, "cu")

    add(["cuModuleGetFunction"], Kind.module, "name_lookup", "names", NameSource.module_get_function)
    add(["cuLibraryGetKernel"], Kind.module, "name_lookup", "names", NameSource.library_get_kernel)
    add(["cuKernelGetFunction"], Kind.module, "kernel_get_function", "names", NameSource.kernel_get_function)
    add(["cuFuncGetName", "cuKernelGetName"], Kind.module, "func_get_name", "names", NameSource.func_get_name)
    add(
        [
            "cuModuleLoad",
            "cuModuleLoadData",
            "cuModuleLoadDataEx",
            "cuModuleLoadFatBinary",
            "cuLibraryLoadData",
            "cuLibraryLoadFromFile",
        ],
        Kind.module,
        "module_load",
        "modules",
    )
    add(["cuGetProcAddress", "cuGetProcAddress_v2"], Kind.other, "get_proc_address", "entry points",
        NameSource.get_proc_address)
    # initialization and devices: the calls that fail first without a GPU.
    # cuCtxCreate is the CUDA 3.x ABI's (the same arguments as _v2); _v4 is
    # CUDA 12.5's, absent from the 535 and 550 drivers.
    add(["cuInit"], Kind.other, "init", "devices")
    add(["cuDeviceGetCount"], Kind.other, "device_count", "devices")
    add(["cuDeviceGet"], Kind.other, "device_get", "devices")
    add(["cuDevicePrimaryCtxRetain"], Kind.other, "ctx_create", "devices", 2)
    add(["cuCtxCreate", "cuCtxCreate_v2"], Kind.other, "ctx_create", "devices", 3)
    add(["cuCtxCreate_v4"], Kind.other, "ctx_create", "devices", 4)
    add(["cuCtxCreate_v3"], Kind.other, "ctx_create", "devices", 5)
    return out


#: HIP 5.x exports these two with C++ linkage only (hip_ext.h, before 6.0).
HIP_EXT_MODULE_LAUNCH_MANGLED = (
    "_Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j",
    "_Z24hipHccModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_",
)


def _hip() -> list[Api]:
    L, A, F, C, M, S = Kind.launch, Kind.alloc, Kind.free, Kind.memcpy, Kind.memset, Kind.sync
    out: list[Api] = []

    def add(symbols, kind, shape, category, arg=0):
        out.extend(_api(s, "hip", kind, shape, category, arg) for s in symbols)

    add(["hipLaunchKernel", "hipLaunchKernel_spt", "hipExtLaunchKernel"], L, "launch_rt", "launch")
    add(["hipLaunchCooperativeKernel", "hipLaunchCooperativeKernel_spt"], L, "launch_rt", "launch")
    add(["hipModuleLaunchKernel", "hipModuleLaunchCooperativeKernel"], L, "launch_cu", "launch")
    add(["hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel", *HIP_EXT_MODULE_LAUNCH_MANGLED], L,
        "launch_hcc", "launch")
    add(["hipLaunchKernelExC"], L, "launch_cfg_rt", "launch")
    add(["hipDrvLaunchKernelEx"], L, "launch_cfg_cu", "launch")
    add(["hipLaunchHostFunc"], L, "host_func", "launch")
    add(["hipGraphLaunch", "hipGraphLaunch_spt"], Kind.graph, "graph_launch", "launch")

    add(["hipMalloc", "hipMallocHost", "hipMemAllocHost"], A, "alloc", "alloc")
    add(["hipExtMallocWithFlags", "hipMallocManaged", "hipHostMalloc"], A, "alloc_flags", "alloc")
    add(["hipMallocAsync"], A, "alloc_stream", "alloc")
    add(["hipMallocFromPoolAsync"], A, "alloc_pool", "alloc")
    add(["hipMallocPitch", "hipMemAllocPitch"], A, "alloc_pitch", "alloc")
    add(["hipMemCreate"], A, "alloc", "vmm")  # `ptr` = the handle, as cuMemCreate's
    add(["hipMemRelease"], F, "free", "vmm")
    add(["hipMemAddressReserve"], Kind.other, "alloc", "vmm")
    add(["hipMemMap"], Kind.other, "vmm_map", "vmm")
    add(["hipMemUnmap", "hipMemSetAccess", "hipMemAddressFree"], Kind.other, "range", "vmm")

    add(["hipFree", "hipHostFree", "hipFreeHost"], F, "free", "free")
    add(["hipFreeAsync"], F, "free_stream", "free")

    add(["hipMemcpy", "hipMemcpy_spt"], C, "copy_hip", "copy")
    add(["hipMemcpyAsync", "hipMemcpyAsync_spt", "hipMemcpyWithStream"], C, "copy_hip_async", "copy")
    for d, ck in (("HtoD", CopyKind.h2d), ("DtoH", CopyKind.d2h), ("DtoD", CopyKind.d2d)):
        add([f"hipMemcpy{d}"], C, "copy", "copy", ck)
        add([f"hipMemcpy{d}Async"], C, "copy_async", "copy", ck)
    add(["hipMemcpyPeer"], C, "copy_peer", "copy", CopyKind.peer)
    add(["hipMemcpyPeerAsync"], C, "copy_peer_async", "copy", CopyKind.peer)
    add(["hipMemcpy2D", "hipMemcpy2D_spt"], C, "copy_2d_hip", "copy 2D/3D")
    add(["hipMemcpy2DAsync", "hipMemcpy2DAsync_spt"], C, "copy_2d_hip_async", "copy 2D/3D")
    add(["hipMemcpy3D", "hipMemcpy3D_spt"], C, "copy_3d_hip", "copy 2D/3D")
    add(["hipMemcpy3DAsync", "hipMemcpy3DAsync_spt"], C, "copy_3d_hip_async", "copy 2D/3D")

    add(["hipMemset", "hipMemset_spt", "hipMemsetD8"], M, "memset", "memset", 1)
    add(["hipMemsetAsync", "hipMemsetAsync_spt", "hipMemsetD8Async"], M, "memset_async", "memset", 1)
    add(["hipMemsetD16"], M, "memset", "memset", 2)
    add(["hipMemsetD16Async"], M, "memset_async", "memset", 2)
    add(["hipMemsetD32"], M, "memset", "memset", 4)
    add(["hipMemsetD32Async"], M, "memset_async", "memset", 4)
    add(["hipMemset2D", "hipMemset2D_spt"], M, "memset2d", "memset", 1)
    add(["hipMemset2DAsync", "hipMemset2DAsync_spt"], M, "memset2d_async", "memset", 1)

    add(["hipStreamSynchronize", "hipStreamSynchronize_spt"], S, "sync_stream", "sync")
    add(["hipDeviceSynchronize", "hipCtxSynchronize"], S, "sync_none", "sync")
    add(["hipEventSynchronize"], S, "sync_handle", "sync")

    add(["hipModuleGetFunction"], Kind.module, "name_lookup", "names", NameSource.module_get_function)
    add(["hipLibraryGetKernel"], Kind.module, "name_lookup", "names", NameSource.library_get_kernel)
    add(["hipGetFuncBySymbol"], Kind.module, "kernel_get_function", "names", NameSource.kernel_get_function)
    add(["hipKernelGetName"], Kind.module, "func_get_name", "names", NameSource.func_get_name)
    add(["__hipRegisterFunction"], Kind.module, "register_function", "names", NameSource.register_function)
    add(["hipModuleLoad", "hipModuleLoadData", "hipModuleLoadDataEx"], Kind.module, "module_load", "modules")
    return out


#: c10::reportMemoryUsageToProfiler(void*, int64_t, size_t, size_t, c10::Device)
C10_REPORT = "_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE"
#: c10::ProfiledCPUMemoryReporter::New(void*, size_t) and ::Delete(void*)
C10_CPU_NEW = "_ZN3c1025ProfiledCPUMemoryReporter3NewEPvm"
C10_CPU_DELETE = "_ZN3c1025ProfiledCPUMemoryReporter6DeleteEPv"


def _c10() -> list[Api]:
    """PyTorch's libc10.so: the caching allocators (CUDA, and ROCm's, which
    is the CUDA one built for HIP) report every block they hand out and take
    back to reportMemoryUsageToProfiler, whether or not a profiler runs;
    CPU tensors go through ProfiledCPUMemoryReporter::New/Delete.  The
    handler sets the kind: a negative size is a free."""
    return [
        _api(C10_REPORT, "c10", Kind.tensor_alloc, "tensor_report", "tensor memory",
             label="c10::reportMemoryUsageToProfiler"),
        _api(C10_CPU_NEW, "c10", Kind.tensor_alloc, "tensor_new", "tensor memory",
             label="c10::ProfiledCPUMemoryReporter::New"),
        _api(C10_CPU_DELETE, "c10", Kind.tensor_free, "tensor_delete", "tensor memory",
             label="c10::ProfiledCPUMemoryReporter::Delete"),
    ]


def _nccl() -> list[Api]:
    """libnccl.so.2.  Each ncclX is a weak alias of pncclX at the same
    address: only ncclX is listed, so each is probed once.  Every call is
    paired with its return (the return code, and the time in the call).
    Signatures: nccl.h; the argument layout of each shape is in bpf/nccl.bpf.c.
    Not probed: the deprecated ncclBcast(buff, ...), a wrapper that calls
    ncclBroadcast(buff, buff, ...): its calls are seen as that ncclBroadcast."""
    out: list[Api] = []

    def add(symbols, kind, shape, category):
        out.extend(_api(s, "nccl", kind, shape, category) for s in symbols)

    C = Kind.collective
    add(["ncclAllReduce", "ncclReduceScatter"], C, "nccl_reduce_op", "collectives")
    add(["ncclReduce"], C, "nccl_reduce_root", "collectives")
    add(["ncclBroadcast", "ncclGather", "ncclScatter"], C, "nccl_root", "collectives")
    add(["ncclAllGather", "ncclAlltoAll"], C, "nccl_gather", "collectives")
    add(["ncclSend", "ncclRecv"], Kind.p2p, "nccl_p2p", "point to point")
    add(["ncclGroupStart", "ncclGroupEnd"], Kind.group, "nccl_none", "groups")
    add(["ncclGetUniqueId"], Kind.comm, "nccl_unique_id", "communicators")
    add(["ncclCommInitRank", "ncclCommInitRankConfig"], Kind.comm, "nccl_init_rank", "communicators")
    add(["ncclCommInitAll"], Kind.comm, "nccl_init_all", "communicators")
    add(["ncclCommSplit"], Kind.comm, "nccl_split", "communicators")
    add(["ncclCommFinalize", "ncclCommDestroy", "ncclCommAbort"], Kind.comm, "nccl_comm", "communicators")
    add(["ncclGetVersion"], Kind.other, "nccl_version", "version")
    return out


def _cudart() -> list[Api]:
    """libcudart (shared, or linked statically into an executable).  Its
    calls reach libcuda through cuGetProcAddress pointers to the exported
    entry points, so the driver's probes fire inside them: those driver
    events are marked nested (NEST_ROLE) and each call counts once."""
    L, A, F, C, M, S = Kind.launch, Kind.alloc, Kind.free, Kind.memcpy, Kind.memset, Kind.sync
    out: list[Api] = []

    def add(symbols, kind, shape, category, arg=0):
        out.extend(_api(s, "cudart", kind, shape, category, arg) for s in symbols)

    # CUDA 13 host stubs call __cudaLaunchKernel(cudaKernel_t, ...): libcudart
    # 13's is a jump to cudaLaunchKernel, reported under it (attach.forwarders)
    add(["cudaLaunchKernel", "cudaLaunchKernel_ptsz", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz",
         "cudaLaunchCooperativeKernel", "cudaLaunchCooperativeKernel_ptsz"], L, "launch_rt_caller", "launch")
    add(["cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz"], L, "launch_cfg_rt_caller", "launch")
    add(["cudaLaunchHostFunc", "cudaLaunchHostFunc_ptsz"], L, "host_func", "launch")
    add(["cudaGraphLaunch", "cudaGraphLaunch_ptsz"], Kind.graph, "graph_launch", "launch")
    _graphs(add, "cuda")

    add(["cudaMalloc", "cudaMallocHost"], A, "alloc", "alloc")
    add(["cudaMallocManaged", "cudaHostAlloc"], A, "alloc_flags", "alloc")
    add(["cudaMallocAsync", "cudaMallocAsync_ptsz"], A, "alloc_stream", "alloc")
    add(["cudaMallocFromPoolAsync", "cudaMallocFromPoolAsync_ptsz"], A, "alloc_pool", "alloc")
    add(["cudaMallocPitch"], A, "alloc_pitch", "alloc")
    add(["cudaFree", "cudaFreeHost"], F, "free", "free")
    add(["cudaFreeAsync", "cudaFreeAsync_ptsz"], F, "free_stream", "free")

    add(["cudaMemcpy", "cudaMemcpy_ptds"], C, "copy_rt", "copy")
    add(["cudaMemcpyAsync", "cudaMemcpyAsync_ptsz"], C, "copy_rt_async", "copy")
    add(["cudaMemcpyToSymbol", "cudaMemcpyToSymbol_ptds", "cudaMemcpyFromSymbol", "cudaMemcpyFromSymbol_ptds"], C,
        "copy_symbol", "copy")
    add(["cudaMemcpyToSymbolAsync", "cudaMemcpyToSymbolAsync_ptsz", "cudaMemcpyFromSymbolAsync",
         "cudaMemcpyFromSymbolAsync_ptsz"], C, "copy_symbol_async", "copy")
    add(["cudaMemcpyPeer"], C, "copy_peer", "copy", CopyKind.peer)
    add(["cudaMemcpyPeerAsync"], C, "copy_peer_async", "copy", CopyKind.peer)
    add(["cudaMemcpy2D", "cudaMemcpy2D_ptds"], C, "copy_2d_rt", "copy 2D/3D")
    add(["cudaMemcpy2DAsync", "cudaMemcpy2DAsync_ptsz"], C, "copy_2d_rt_async", "copy 2D/3D")

    add(["cudaMemset", "cudaMemset_ptds"], M, "memset", "memset", 1)
    add(["cudaMemsetAsync", "cudaMemsetAsync_ptsz"], M, "memset_async", "memset", 1)
    add(["cudaMemset2D", "cudaMemset2D_ptds"], M, "memset2d", "memset", 1)
    add(["cudaMemset2DAsync", "cudaMemset2DAsync_ptsz"], M, "memset2d_async", "memset", 1)

    add(["cudaGetDeviceCount"], Kind.other, "rt_device_count", "devices")
    add(["cudaSetDevice"], Kind.other, "rt_set_device", "devices")

    add(["cudaDeviceSynchronize"], S, "sync_none", "sync")
    add(["cudaStreamSynchronize", "cudaStreamSynchronize_ptsz"], S, "sync_stream", "sync")
    add(["cudaEventSynchronize"], S, "sync_handle", "sync")
    _stream_ordering(add, "cuda")

    # (T *out, const void *hostStub): the handle aliases the stub, named offline from the ELF
    add(["cudaGetFuncBySymbol", "cudaGetKernel", "__cudaGetKernel"], Kind.module, "kernel_get_function", "names",
        NameSource.host_stub)
    # static constructors of each nvcc-built file: host stub -> device name, seen when launched
    add(["__cudaRegisterFunction"], Kind.module, "register_function", "names", NameSource.register_function)
    return out


APIS: tuple[Api, ...] = tuple(_cuda() + _hip() + _c10() + _nccl() + _cudart())
API_ID: dict[str, int] = {a.symbol: i for i, a in enumerate(APIS)}
#: the capture's api names, by id
API_NAMES: tuple[str, ...] = tuple(a.api_name for a in APIS)

if len(API_ID) != len(APIS):
    raise RuntimeError("duplicate symbol in the probe catalog")


def for_family(family: str, apis: tuple[Api, ...] = APIS) -> tuple[Api, ...]:
    return tuple(a for a in apis if a.family == family)
