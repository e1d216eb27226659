"""The signal frame of a remote call (pasta_trace/device/attach/remote.py): the
registers a thread resumes with, a system call's restart, the XSAVE image;
and the collector's attach entry points called in a process without a GPU."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import pytest

from pasta_trace.device.attach.ptrace import Regs
from pasta_trace.device.attach.remote import (FP_XSTATE_MAGIC1, FP_XSTATE_MAGIC2, FRAME_SIZE, fpstate_image,
                                              resume_regs, sigcontext, signal_xstate)
from pasta_trace.errors import PastaError

NO_SYSCALL = (1 << 64) - 1


def _regs(**kw) -> Regs:
    r = Regs()
    r.rip, r.rax, r.orig_rax, r.rdi = 0x401002, 0, NO_SYSCALL, 7
    for k, v in kw.items():
        setattr(r, k, v & ((1 << 64) - 1))
    return r


@pytest.mark.parametrize("ret, rip, rax", [
    (-512, 0x401000, 0),      # -ERESTARTSYS: read(0) again
    (-513, 0x401000, 0),      # -ERESTARTNOINTR
    (-514, 0x401000, 0),      # -ERESTARTNOHAND (poll, pause)
    (-516, 0x401000, 0),      # -ERESTART_RESTARTBLOCK (poll with a timeout): the call again, not restart_syscall
    (-4, 0x401002, -4),       # -EINTR: what the program was going to see anyway, left alone
    (5, 0x401002, 5),         # a finished read of 5 bytes
])
def test_an_interrupted_read_is_restarted_as_the_kernel_does(ret, rip, rax):
    back = resume_regs(_regs(rax=ret, orig_rax=0))
    assert (back.rip, back.rax & ((1 << 64) - 1), back.orig_rax, back.rdi) == (
        rip, rax & ((1 << 64) - 1), NO_SYSCALL, 7)


def test_a_thread_outside_a_system_call_resumes_where_it_was():
    r = _regs(rax=-512)  # rax that looks like a restart code, but no system call (orig_rax -1)
    assert resume_regs(r).as_tuple() == r.as_tuple()


def test_sigcontext_layout():
    r = _regs(r8=1, r15=8, rsp=0x7FFF0000, eflags=0x246, cs=0x33, ss=0x2B)
    sc = sigcontext(r, 0x7FFE0000)
    assert len(sc) == 256 and FRAME_SIZE == 440
    vals = struct.unpack_from("<18Q", sc)
    assert (vals[0], vals[7], vals[8], vals[15], vals[16], vals[17]) == (1, 8, 7, 0x7FFF0000, 0x401002, 0x246)
    assert struct.unpack_from("<4H", sc, 144) == (0x33, 0, 0, 0x2B)
    assert struct.unpack_from("<Q", sc, 184)[0] == 0x7FFE0000


def test_xsave_image_has_the_kernels_signal_frame_size():
    size, features = signal_xstate()
    assert size >= 576 and features & 3 == 3
    xstate = bytearray(max(size, 4096))
    struct.pack_into("<Q", xstate, 512, 0x7)  # XSTATE_BV: x87, SSE, AVX
    img = fpstate_image(bytes(xstate))
    magic1, ext, xfeatures, xsize = struct.unpack_from("<IIQI", img, 464)
    assert (magic1, ext, xsize, xfeatures) == (FP_XSTATE_MAGIC1, size + 4, size, 0x7 & features | 3)
    assert len(img) == size + 4 and struct.unpack_from("<I", img, size)[0] == FP_XSTATE_MAGIC2


def test_the_attach_entry_points_without_a_gpu(tmp_path):
    """Loaded by dlopen (neither LD_PRELOAD nor CUDA_INJECTION64_PATH), the
    collector records nothing by itself; start says why CUPTI cannot run and
    leaves no file and errno as it was; stop says it was not recording."""
    import ctypes

    from pasta_trace.device.attach.collector import collector_library

    try:
        ctypes.CDLL("libcuda.so.1")
        pytest.skip("a CUDA driver is installed here: CUPTI may run")
    except OSError:
        pass
    try:
        lib = collector_library()
    except PastaError as e:
        pytest.skip(str(e))
    code = f"""
import ctypes, os
os.chdir({str(tmp_path)!r})
lib = ctypes.CDLL({str(lib)!r}, use_errno=True)
if not hasattr(lib, "gp_cupti_attach_start"):
    print("stale"); raise SystemExit
res = ctypes.create_string_buffer(248)
ctypes.set_errno(1234)
lib.gp_cupti_attach_start(b"{tmp_path}/out.bin", res)
e = ctypes.get_errno()
rc, started = int.from_bytes(res.raw[:4], "little", signed=True), int.from_bytes(res.raw[4:8], "little")
print(rc, started, e, res.raw[8:].split(b"\\0")[0].decode().split(":")[0])
lib.gp_cupti_attach_stop(res)
print(int.from_bytes(res.raw[:4], "little"), res.raw[8:].split(b"\\0")[0].decode())
"""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "CUDA_INJECTION64_PATH")}
    env["GPU_PROBES_DIR"] = str(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    if r.stdout == "stale\n":
        pytest.skip("libgpu_probes_cupti.so predates the attach entry points: run scripts/build_gpu_probes.sh")
    assert r.stdout == "3 0 1234 CUPTI unavailable\n4 not recording\n"
    assert os.listdir(tmp_path) == []
