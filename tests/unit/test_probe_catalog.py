"""The probe catalog: consistent with the BPF sources, and every probed symbol
resolves in the real vendor libraries except the ones those versions lack."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from pasta_trace import schema
from pasta_trace.probes import catalog, elf, program

ROOT = Path(__file__).resolve().parents[2]
HIP_LIB = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5")

#: Entry points newer than each real NVIDIA driver (cuCtxSynchronize_v2: 13.0;
#: the name getters and capture into a graph: 12.3+; 535 is CUDA 12.2, 550 is CUDA 12.4).
CUDA_ABSENT = {
    "535": {"cuCtxCreate_v4", "cuCtxSynchronize_v2", "cuFuncGetName", "cuKernelGetName",
            "cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz"},
    "550": {"cuCtxCreate_v4", "cuCtxSynchronize_v2"},
}
#: The real drivers the symbol, placement and call tests run against
#: (scripts/fetch_vendor_libs.sh --driver D).
DRIVERS = sorted(CUDA_ABSENT)

#: Entry points newer than HIP 5.2 (mostly ROCm 6.x-7.x), plus the two
#: launchers 5.2 exports only with C++ linkage (probed under their mangled names).
HIP_ABSENT_5_2 = {
    "hipDrvLaunchKernelEx",
    "hipExtModuleLaunchKernel",
    "hipGetFuncBySymbol",
    "hipGraphLaunch_spt",
    "hipHccModuleLaunchKernel",
    "hipKernelGetName",
    "hipLaunchHostFunc",
    "hipLaunchKernelExC",
    "hipLibraryGetKernel",
    "hipMemcpy2DAsync_spt",
    "hipMemcpy3DAsync_spt",
    "hipMemset2DAsync_spt",
    "hipMemsetAsync_spt",
    "hipModuleLaunchCooperativeKernel",
}

CATEGORIES = {"launch", "alloc", "vmm", "free", "copy", "copy 2D/3D", "memset", "sync", "names", "modules"}


def vendor_libcuda(driver: str = "535") -> tuple[str, str]:
    """(path, package version) of NVIDIA's libcuda.so.1 `driver` (535, 550), or skip saying why."""
    proc = subprocess.run([str(ROOT / "scripts/fetch_vendor_libs.sh"), "--driver", driver], capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        pytest.skip(f"NVIDIA libcuda1 {driver} not available: {proc.stderr.strip() or proc.returncode}")
    path = proc.stdout.strip().splitlines()[-1]
    version = next(p / "VERSION" for p in Path(path).parents if (p / "VERSION").exists()).read_text().strip()
    assert version.startswith(f"{driver}."), version
    return path, version


def test_ids_are_table_indexes():
    assert [catalog.API_ID[a.symbol] for a in catalog.APIS] == list(range(len(catalog.APIS)))
    assert len(catalog.APIS) < 2**16  # the api column is u16


def test_every_api_is_well_formed():
    for a in catalog.APIS:
        assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", a.symbol), a.symbol
        assert a.family in ("cuda", "hip", "c10", "nccl", "cudart")
        assert isinstance(a.kind, schema.Kind)
        # entry-only shapes of launches, copies, memsets and frees save their event for the return code
        saved = a.kind in catalog.SAVED_KINDS and a.family in ("cuda", "hip", "cudart")
        assert a.ret == (a.shape in catalog.RETURN_SHAPES or saved)
        assert a.saved == (saved and a.shape not in catalog.RETURN_SHAPES)
        assert catalog.SHAPES[a.shape] in ("common", a.family)


def test_both_families_cover_every_category():
    assert {a.category for a in catalog.for_family("hip")} == CATEGORIES
    # CUDA graphs are probed beyond their launch in CUDA only, and with them the event record and wait
    # that join a stream to a capture
    assert {a.category for a in catalog.for_family("cuda")} == CATEGORIES | {"entry points", "devices", "graphs",
                                                                              "stream ordering"}
    # the runtime has no VMM or module API of its own: those calls are the driver's
    assert {a.category for a in catalog.for_family("cudart")} == CATEGORIES - {"vmm", "modules"} | {
        "devices", "graphs", "stream ordering"}


def test_runtime_coverage_layers_and_nesting_roles():
    by = {a.symbol: a for a in catalog.APIS}
    launches = {a.symbol for a in catalog.for_family("cudart") if a.kind == schema.Kind.launch}
    assert launches == {"cudaLaunchKernel", "cudaLaunchKernel_ptsz", "__cudaLaunchKernel", "__cudaLaunchKernel_ptsz",
                        "cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz", "cudaLaunchCooperativeKernel",
                        "cudaLaunchCooperativeKernel_ptsz", "cudaLaunchHostFunc", "cudaLaunchHostFunc_ptsz"}
    assert (by["cudaMalloc"].kind, by["cudaMalloc"].ret, by["cudaFreeAsync_ptsz"].kind) == (
        schema.Kind.alloc, True, schema.Kind.free)
    assert (by["cudaMemcpyAsync_ptsz"].shape, by["cudaMemset2D_ptds"].kind) == ("copy_rt_async", schema.Kind.memset)
    assert {by[s].kind for s in ("cudaDeviceSynchronize", "cudaStreamSynchronize_ptsz", "cudaEventSynchronize")} == {
        schema.Kind.sync}
    assert {by[s].arg for s in ("cudaGetFuncBySymbol", "cudaGetKernel", "__cudaGetKernel")} == {
        schema.NameSource.host_stub}
    assert (by["cudaGraphLaunch"].kind, by["__cudaRegisterFunction"].arg) == (
        schema.Kind.graph, schema.NameSource.register_function)
    assert [(by[s].layer.name, by[s].nest_role) for s in ("cuLaunchKernel", "cudaLaunchKernel", "hipLaunchKernel")] \
        == [("driver", "inner"), ("runtime", "outer"), ("runtime", None)]
    text = program.build(program.Spec(discover=False, apis=(by["cuLaunchKernel"], by["cudaMalloc"], by["hipMalloc"])))
    assert [ln for ln in text.splitlines() if ln.startswith("#define PT_ROLE_") and ln.split()[1][8:].isdigit()] == [
        f"#define PT_ROLE_{catalog.API_ID['cuLaunchKernel']} PT_ROLE_INNER",
        f"#define PT_ROLE_{catalog.API_ID['cudaMalloc']} PT_ROLE_OUTER",
        f"#define PT_ROLE_{catalog.API_ID['hipMalloc']} PT_ROLE_NONE"]


def test_c10_probes_are_named_demangled_and_framework_layer():
    c10 = catalog.for_family("c10")
    assert [(a.symbol, a.api_name, a.kind.name, a.ret) for a in c10] == [
        ("_ZN3c1027reportMemoryUsageToProfilerEPvlmmNS_6DeviceE", "c10::reportMemoryUsageToProfiler",
         "tensor_alloc", False),
        ("_ZN3c1025ProfiledCPUMemoryReporter3NewEPvm", "c10::ProfiledCPUMemoryReporter::New", "tensor_alloc", False),
        ("_ZN3c1025ProfiledCPUMemoryReporter6DeleteEPv", "c10::ProfiledCPUMemoryReporter::Delete", "tensor_free",
         False),
    ]
    assert {a.layer for a in c10} == {schema.Layer.framework}
    assert catalog.API_NAMES[catalog.API_ID["cuLaunchKernel"]] == "cuLaunchKernel"
    assert catalog.API_NAMES[catalog.API_ID[catalog.C10_CPU_NEW]] == "c10::ProfiledCPUMemoryReporter::New"


def test_kinds_and_args_of_representative_apis():
    by = {a.symbol: a for a in catalog.APIS}
    assert (by["cuLaunchKernel"].kind, by["cuLaunchKernel"].ret, by["cuLaunchKernel"].saved) == (
        schema.Kind.launch, True, True)
    assert [(by[s].shape, by[s].arg, by[s].ret) for s in ("cuInit", "cuDeviceGetCount", "cuDeviceGet",
            "cuDevicePrimaryCtxRetain", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cudaGetDeviceCount",
            "cudaSetDevice")] == [("init", 0, True), ("device_count", 0, True), ("device_get", 0, True),
            ("ctx_create", 2, True), ("ctx_create", 3, True), ("ctx_create", 5, True), ("ctx_create", 4, True),
            ("rt_device_count", 0, True), ("rt_set_device", 0, True)]
    assert (by["cuGraphLaunch_ptsz"].kind, by["cuGraphLaunch_ptsz"].shape) == (schema.Kind.graph, "graph_launch")
    assert (by["cuMemAlloc_v2"].kind, by["cuMemAlloc_v2"].ret) == (schema.Kind.alloc, True)
    assert (by["cuMemCreate"].kind, by["cuMemRelease"].kind) == (schema.Kind.alloc, schema.Kind.free)
    assert {by[s].kind for s in ("cuMemAddressReserve", "cuMemMap", "cuMemUnmap", "cuMemSetAccess",
                                 "cuMemAddressFree")} == {schema.Kind.other}
    assert by["cuMemcpyDtoHAsync_v2_ptsz"].arg == schema.CopyKind.d2h
    assert by["cuMemcpyPeer_ptds"].arg == schema.CopyKind.peer
    assert by["cuMemcpy2D_v2"].arg == catalog.COPY_FROM_STRUCT
    assert (by["cuMemsetD16_v2"].arg, by["cuMemsetD2D32Async_ptsz"].arg, by["hipMemset"].arg) == (2, 4, 1)
    assert by["cuKernelGetFunction"].arg == schema.NameSource.kernel_get_function
    assert by["__hipRegisterFunction"].ret is False
    assert by["cuStreamSynchronize_ptsz"].ret is True


def test_every_shape_has_exactly_one_bpf_macro():
    text = "".join((program.BPF_DIR / s).read_text() for s in program.SOURCES)
    defined = re.findall(r"#define PT_H_([A-Z0-9_]+)\(name, id, kind, arg\)", text)
    assert sorted(defined) == sorted(s.upper() for s in catalog.SHAPES)
    for shape, where in catalog.SHAPES.items():
        file = {"common": "pasta.h", "cuda": "cuda.bpf.c", "hip": "hip.bpf.c", "c10": "c10.bpf.c",
                "nccl": "nccl.bpf.c", "cudart": "cudart.bpf.c"}[where]
        assert f"#define PT_H_{shape.upper()}(" in (program.BPF_DIR / file).read_text()


def test_program_text_instantiates_each_api_once():
    text = program.build(program.Spec(discover=False, ring_pages=64, names_pages=16))
    lines = [ln for ln in text.splitlines() if ln.startswith("PT_H_")]
    assert lines == [program.instantiation(a) for a in catalog.APIS]
    roles = [ln for ln in text.splitlines() if ln.startswith("#define PT_ROLE_") and ln.split()[1][8:].isdigit()]
    assert roles == [program.role_define(a) for a in catalog.APIS]
    saves = [ln for ln in text.splitlines() if ln.startswith("#define PT_SAVE_")]
    assert saves == [program.save_define(a) for a in catalog.APIS]
    rets = [ln for ln in text.splitlines() if ln.startswith("PT_RET_SAVED(")]
    assert rets == [program.return_instantiation(a) for a in catalog.APIS if a.saved]
    assert "PT_RET_SAVED(cuLaunchKernel, 0, 0)" in rets and "#define PT_SAVE_0 1" in saves
    assert "PT_H_LAUNCH_CU(cuLaunchKernel, 0, 0, 0)" in lines
    assert "#define PT_RING_PAGES 64" in text and "#define PT_NAMES_PAGES 16" in text
    assert "#define PT_AGGREGATE" not in text and "#define PT_FILTER_PIDS" not in text
    agg = program.build(program.Spec(discover=False, aggregate=True, filter_pids=True))
    assert "#define PT_AGGREGATE 1" in agg and "#define PT_FILTER_PIDS 1" in agg


def test_ring_pages_must_be_a_power_of_two():
    with pytest.raises(ValueError, match="ring_pages must be a power of two, got 1000"):
        program.build(program.Spec(discover=False, ring_pages=1000))


def test_handler_names():
    by = {a.symbol: a for a in catalog.APIS}
    assert program.handler_names(by["cuLaunchKernel"]) == ("pt_e_cuLaunchKernel", "pt_r_cuLaunchKernel")
    assert program.handler_names(by["__cudaRegisterFunction"]) == ("pt_e___cudaRegisterFunction", None)
    assert program.handler_names(by["cuMemAlloc_v2"]) == ("pt_e_cuMemAlloc_v2", "pt_r_cuMemAlloc_v2")


@pytest.mark.parametrize("driver", DRIVERS)
def test_every_cuda_symbol_resolves_in_the_real_libcuda(driver):
    path, version = vendor_libcuda(driver)
    exports = elf.exported_symbols(path)
    probed = {a.symbol for a in catalog.for_family("cuda")}
    absent = probed - exports.keys()
    print(f"libcuda.so.1 {version}: absent from this driver: {sorted(absent)}")
    assert absent == CUDA_ABSENT[driver], f"NVIDIA driver {version} lacks {sorted(absent)}"
    assert all(exports[s].size > 0 for s in probed - absent)


def test_every_hip_symbol_resolves_in_debian_libamdhip64():
    if not HIP_LIB.exists():
        pytest.skip(f"{HIP_LIB} is not installed (Debian package libamdhip64-5)")
    version = HIP_LIB.resolve().name.removeprefix("libamdhip64.so.")
    exports = elf.exported_symbols(str(HIP_LIB))
    probed = {a.symbol for a in catalog.for_family("hip")}
    absent = probed - exports.keys()
    print(f"libamdhip64 {version}: absent from this version: {sorted(absent)}")
    assert absent == HIP_ABSENT_5_2, f"HIP {version} lacks {sorted(absent)}"


@pytest.mark.parametrize("driver", DRIVERS)
def test_build_id_of_the_real_libraries(driver):
    path, _ = vendor_libcuda(driver)
    bid = elf.build_id(path)
    assert bid is not None and re.fullmatch(r"[0-9a-f]{40}", bid)


def test_every_nccl_symbol_resolves_in_the_real_libnccl_once_with_its_alias(real_libnccl):
    """ncclX and pncclX share an address: the catalog lists ncclX only, so each is probed once."""
    exports = elf.exported_symbols(str(real_libnccl.lib))
    probed = [a.symbol for a in catalog.for_family("nccl")]
    assert [s for s in probed if s not in exports] == []
    assert [s for s in probed if exports[s].vaddr != exports["p" + s].vaddr] == []
    assert len({exports[s].vaddr for s in probed}) == len(probed) == 21


def test_nccl_coverage():
    by_kind: dict = {}
    for a in catalog.for_family("nccl"):
        by_kind.setdefault(a.kind.name, []).append(a.symbol.removeprefix("nccl"))
        assert a.ret and a.layer == schema.Layer.nccl
    assert {k: sorted(v) for k, v in by_kind.items()} == {
        "collective": ["AllGather", "AllReduce", "AlltoAll", "Broadcast", "Gather", "Reduce",
                       "ReduceScatter", "Scatter"],
        "p2p": ["Recv", "Send"],
        "group": ["GroupEnd", "GroupStart"],
        "comm": ["CommAbort", "CommDestroy", "CommFinalize", "CommInitAll", "CommInitRank", "CommInitRankConfig",
                 "CommSplit", "GetUniqueId"],
        "other": ["GetVersion"],
    }
