"""Probe placement from the function's own bytes: on the real driver, on
Debian's libamdhip64, on a -O0 stub and on hand-written instruction bytes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pasta_trace.probes import catalog, elf, placement

sys.path.insert(0, str(Path(__file__).parent))
from test_probe_catalog import CUDA_ABSENT, DRIVERS, HIP_LIB, vendor_libcuda  # noqa: E402


@pytest.mark.parametrize(
    "code, offset, form",
    [
        # cmpl $0x321cba00, 0x18d933e(%rip); je +0xc   (the real driver's exports)
        (bytes.fromhex("813d3e938d0100ba1c32740c"), 10, "je"),
        (bytes.fromhex("55"), 0, "push"),  # push %rbp
        (bytes.fromhex("4154"), 0, "push"),  # push %r12
        (bytes.fromhex("f30f1efa55"), 4, "push"),  # endbr64; push %rbp
        (bytes.fromhex("4885ff0f84aa000000"), 3, "je"),  # test %rdi,%rdi; je rel32
        (bytes.fromhex("e9aabbccdd"), 0, "jmp"),  # tail jump
        (bytes.fromhex("90"), 0, "nop"),
    ],
)
def test_first_emulated_instruction(code, offset, form):
    p = placement.choose_offset(code)
    assert p.offset == offset
    assert form in p.reason


@pytest.mark.parametrize(
    "code, first",
    [
        (bytes.fromhex("4889f8c3"), "mov"),  # mov %rdi,%rax; ret
        (bytes.fromhex("488d05000000004889"), "lea"),
        (bytes.fromhex("4885ff4889f874"), "test"),  # test; mov (writes rax); je: stop at mov
        (bytes.fromhex("4883ec0855"), "sub"),  # sub $8,%rsp changes the stack slots we read
        (bytes.fromhex("6690"), "nop"),  # prefixed: the kernel single-steps it
    ],
)
def test_falls_back_to_the_symbol(code, first):
    p = placement.choose_offset(code)
    assert p.offset == 0
    assert p.reason.endswith(f"({first}): symbol")


@pytest.mark.parametrize("driver", DRIVERS)
def test_real_libcuda_probes_the_je_after_the_cmpl(driver):
    """Every probed export of each driver (136 on 535, 140 on 550, the CUDA
    graph entry points and the event record and stream wait of cross-stream
    capture included) opens with the same `cmpl` of a global flag
    and a `je`: each probe goes on the je."""
    path, version = vendor_libcuda(driver)
    exports = elf.exported_symbols(path)
    probed = {a.symbol for a in catalog.for_family("cuda")} - CUDA_ABSENT[driver]
    placed = {s: placement.choose_probe_offset(path, exports[s]) for s in probed}
    je = placement.Placement(10, "je at +10 is emulated; skipped cmp (flags only)")
    assert placed == dict.fromkeys(probed, je), f"driver {version}"
    assert len(placed) == {"535": 136, "550": 140}[driver]


def test_debian_libamdhip64_probes_the_symbol():
    if not HIP_LIB.exists():
        pytest.skip(f"{HIP_LIB} is not installed (Debian package libamdhip64-5)")
    exports = elf.exported_symbols(str(HIP_LIB))
    found = [a.symbol for a in catalog.for_family("hip") if a.symbol in exports]
    reasons = {placement.choose_probe_offset(str(HIP_LIB), exports[s]) for s in found}
    assert reasons == {placement.Placement(0, "first instruction (push) is emulated")}


STUB = """
typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, unsigned long bytesize) { *dptr = 0x1000; return bytesize ? 0 : 1; }
"""


@pytest.mark.parametrize("cf, offset", [("none", 0), ("full", 4)])
def test_O0_stub(tmp_path, cf, offset):
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed")
    (tmp_path / "stub.c").write_text(STUB)
    lib = tmp_path / "libstub.so"
    subprocess.run(
        ["gcc", "-O0", "-shared", "-fPIC", f"-fcf-protection={cf}", str(tmp_path / "stub.c"), "-o", str(lib)],
        check=True,
    )
    sym = elf.exported_symbols(str(lib))["cuMemAlloc_v2"]
    p = placement.choose_probe_offset(str(lib), sym)
    assert (p.offset, "push" in p.reason) == (offset, True)


@pytest.mark.parametrize(
    "code, target",
    [
        # push %rbp; mov %rsp,%rbp; pop %rbp; jmp rel32: libcudart 13's __cudaLaunchKernel
        (bytes.fromhex("554889e55de9bb170500"), 0x1000 + 10 + 0x517BB),
        (bytes.fromhex("f30f1efae9f0ffffff"), 0x1000 + 9 - 0x10),  # endbr64; jmp rel32
        (bytes.fromhex("eb10"), 0x1000 + 2 + 0x10),  # jmp rel8
        (bytes.fromhex("55e9f0ffffff"), None),  # push %rbp; jmp: the callee would see another stack
        (bytes.fromhex("554889e5e8f0ffffff5dc3"), None),  # a call, not a jump
        (bytes.fromhex("ff25aabbccdd"), None),  # jmp *rip-relative: not a known address
    ],
)
def test_forward_target(code, target):
    assert placement.forward_target(code, 0x1000) == target


LIBCUDART = Path("/usr/local/cuda/lib64/libcudart.so.13")


def test_real_libcudart_forwards_the_cuda13_launch_entry_to_cudaLaunchKernel():
    from pasta_trace.probes import attach

    if not LIBCUDART.exists():
        pytest.skip(f"{LIBCUDART} not installed (the CUDA 13 toolkit)")
    syms = elf.probe_symbols(str(LIBCUDART), {a.symbol for a in catalog.for_family("cudart")})
    assert sorted({a.symbol for a in catalog.for_family("cudart")} - syms.keys()) == []
    assert attach.forwarders(str(LIBCUDART), syms) == {"__cudaLaunchKernel": "cudaLaunchKernel",
                                                        "__cudaLaunchKernel_ptsz": "cudaLaunchKernel_ptsz"}
