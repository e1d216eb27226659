"""Where in a function to put its uprobe.

A uprobe on an instruction the x86 kernel cannot emulate is executed out of
line with a second trap (about 10 us per call in our VM); on one it emulates
(push reg, jmp/jcc/call rel, nop) it costs a single trap (about 0.7 us).  The
real NVIDIA driver's exports start with a rip-relative ``cmpl`` followed by a
``je``, so the probe goes on the ``je``: every call passes through it and the
``cmpl`` changed nothing but flags, so argument registers, the stack and the
return address at ``[rsp]`` are exactly as at the symbol.
"""

from __future__ import annotations

from dataclasses import dataclass

import capstone

from pasta_trace.probes.elf import Sym
from pasta_trace.regular_file import open_library

#: Instructions that write nothing but flags (or nothing at all): probing
#: after them sees the same registers and stack as at the symbol.
FLAG_ONLY = frozenset({"cmp", "test", "endbr64"})
MAX_SKIPPED = 4
WINDOW = 64


@dataclass(frozen=True)
class Placement:
    offset: int  # bytes past the symbol
    reason: str


def emulated(code: bytes) -> str | None:
    """Name of the kernel-emulated form ``code`` (one instruction) has, or None.

    Matches the opcodes arch/x86/kernel/uprobes.c emulates, without prefixes
    (a prefix makes the kernel fall back to single-stepping)."""
    b0 = code[0]
    if len(code) == 1 and 0x50 <= b0 <= 0x57:
        return "push"
    if len(code) == 2 and b0 == 0x41 and 0x50 <= code[1] <= 0x57:
        return "push"
    if b0 in (0xEB, 0xE9):
        return "jmp"
    if b0 == 0xE8:
        return "call"
    if 0x70 <= b0 <= 0x7F or (b0 == 0x0F and len(code) == 6 and 0x80 <= code[1] <= 0x8F):
        return "jcc"
    if code == b"\x90" or (b0 == 0x0F and len(code) > 2 and code[1] == 0x1F):
        return "nop"
    return None


def choose_offset(code: bytes, address: int = 0) -> Placement:
    """Placement for a function whose first bytes are ``code``."""
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    skipped: list[str] = []
    for insn in md.disasm(code, address):
        form = emulated(bytes(insn.bytes))
        off = insn.address - address
        if form is not None:
            if not skipped:
                return Placement(0, f"first instruction ({insn.mnemonic}) is emulated")
            return Placement(off, f"{insn.mnemonic} at +{off} is emulated; skipped {', '.join(skipped)} (flags only)")
        if insn.mnemonic not in FLAG_ONLY or len(skipped) == MAX_SKIPPED:
            break
        skipped.append(insn.mnemonic)
    first = next(md.disasm(code, address), None)
    what = first.mnemonic if first else "undecodable bytes"
    return Placement(0, f"no emulated instruction reachable without a state change ({what}): symbol")


#: Instructions a pure forwarder may run before its jump: a frame set up and
#: torn down again leaves registers and the stack as they were at the symbol.
_FORWARDER_PROLOGUE = {("endbr64", ""), ("push", "rbp"), ("mov", "rbp, rsp"), ("pop", "rbp")}


def forward_target(code: bytes, address: int = 0) -> int | None:
    """The address a function jumps to if all it does is jump there (libcudart
    13's ``__cudaLaunchKernel`` is ``push rbp; mov rbp,rsp; pop rbp; jmp
    cudaLaunchKernel``): the callee then runs with the same arguments, stack
    and return address.  None for any other function."""
    md = capstone.Cs(capstone.CS_ARCH_X86, capstone.CS_MODE_64)
    pushed = 0
    for insn in md.disasm(code, address):
        if (insn.mnemonic, insn.op_str) in _FORWARDER_PROLOGUE:
            pushed += {"push": 1, "pop": -1}.get(insn.mnemonic, 0)
            continue
        if insn.mnemonic == "jmp" and insn.op_str.startswith("0x") and pushed == 0:
            return int(insn.op_str, 16)
        return None
    return None


def read_code(path: str, sym: Sym) -> bytes:
    """The first bytes of ``sym`` (at most WINDOW)."""
    with open_library(path) as f:  # a regular file only: a FIFO put in its place would block
        f.seek(sym.file_offset)
        return f.read(min(sym.size or WINDOW, WINDOW))


def choose_probe_offset(path: str, sym: Sym) -> Placement:
    """Placement of the probe for ``sym`` in the library at ``path``."""
    return choose_offset(read_code(path, sym), sym.vaddr)
