"""The interpreter-finalization probe: a uprobe on the entry of CPython's
Py_FinalizeEx and Py_Finalize in the file that holds the interpreter (the
python executable, static like Debian's /usr/bin/python3.11, or
libpython3.X.so of pyenv and conda builds).

From that entry on, the process is finalizing: CPython frees every object
left, so the tensors a program leaked are freed then, as if the program had
freed them.  bpf/c10.bpf.c marks the tensor events of a finalizing process
(FLAG_AT_EXIT, the events' `at_exit` column) and the tools count a tensor
freed only at exit as never freed.

The three names are probed: CPython 3.10-3.13 call Py_FinalizeEx from
Py_RunMain (through the PLT in a shared build, directly in a static one), an
embedding program may call Py_Finalize, and in 3.13 Py_Finalize jumps past
Py_FinalizeEx to the function both share, which Py_Exit calls too: a program
ending in sys.exit() or an uncaught SystemExit finalizes from Py_Exit without
entering Py_FinalizeEx (3.11 and 3.12 enter both; the first marks the
start).  One probe per file (pid -1): a
process that maps it later is covered, and the probe's pid filter
(pt_skip) keeps other processes out.

Where the program has it (the discover program is appended to the probes),
HOLD (bpf/discover.bpf.c) is attached in HANDLER's place: it marks the
process finalizing the same way, and at the first entry it stops a process
whose Python stacks are walked until the tracer has read the code objects
its stacks name (LateLoadWatcher.on_finalizing drains the stacks): a program
that makes its calls and exits at once is otherwise gone before they are
read, and its frames stay unnamed."""

from __future__ import annotations

import os
from typing import Callable

from ...probes import elf, pinned

SYMBOLS = ("Py_FinalizeEx", "Py_Finalize", "Py_Exit")
HANDLER = "pt_py_finalize"
HOLD = "pt_py_finalize_hold"


class FinalizeProbes:
    """Attach the probe to each interpreter file once, as processes using it are registered."""

    def __init__(self, bpf, *, say: Callable[[str], None], verbose: bool = False):
        self.bpf = bpf
        self.say = say
        self.verbose = verbose
        #: (dev, inode) of each interpreter file tried -> the symbols probed there (empty: none)
        self.files: dict[tuple[int, int], list[str]] = {}
        self._pins: list[pinned.PinnedFile] = []
        self._fn: bytes | None = None

    def watch(self, pid: int, path: str) -> None:
        """Probe the interpreter file ``path`` as ``pid`` mapped it, unless done."""
        found = _mapped(pid, path)
        if found is None or found in self.files:
            return
        dev, inode = found
        self.files[found] = []
        try:
            pin = pinned.pin(dev, inode, pinned.mapped_files(pid, dev, inode))
        except pinned.IdentityError:
            return  # the process exited before its file could be opened
        try:
            syms = elf.probe_symbols(pin.path, set(SYMBOLS))
            seen: set[int] = set()
            for name in SYMBOLS:
                sym = syms.get(name)
                if sym is None or sym.vaddr in seen:
                    continue
                seen.add(sym.vaddr)
                self.bpf.attach_uprobe(name=pin.path.encode(), addr=sym.vaddr, fn_name=self._handler(), pid=-1)
                self.files[found].append(name)
        except Exception as e:  # noqa: BLE001 - BCC raises bare Exception; a damaged file stays traced without it
            self.say(f"warning: {path}: interpreter finalization not probed ({type(e).__name__}: {e}); tensors "
                     "freed at exit count as freed")
        if self.files[found]:
            self._pins.append(pin)  # held until the probes go (pinned: a reused fd number)
            if self.verbose:
                self.say(f"PID {pid}: interpreter finalization probed at {', '.join(self.files[found])} ({path})")
        else:
            pin.close()

    def _handler(self) -> bytes:
        """HOLD where the program has it, else HANDLER (decided once)."""
        if self._fn is None:
            try:
                self.bpf.load_func(HOLD.encode(), self.bpf.KPROBE)
                self._fn = HOLD.encode()
            except Exception:  # noqa: BLE001 - BCC raises a bare Exception for a function it does not have
                self._fn = HANDLER.encode()
        return self._fn

    def close(self) -> None:
        """After the probes were removed (ProbeSet.detach takes every uprobe of the program)."""
        for pin in self._pins:
            pin.close()
        self._pins.clear()


def _mapped(pid: int, path: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of the file ``pid`` mapped at ``path``; None: gone."""
    d = f"/proc/{pid}/map_files"
    try:
        for name in sorted(os.listdir(d)):
            try:
                if os.readlink(f"{d}/{name}") == path:
                    st = os.stat(f"{d}/{name}")
                    return st.st_dev, st.st_ino
            except OSError:
                continue
    except OSError:
        return None
    return None
