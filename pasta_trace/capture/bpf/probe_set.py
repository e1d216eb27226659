"""The probes of one capture: loading the BPF program, attaching it to each
library file once, and removing it at the end."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from dataclasses import replace
from typing import Callable, Iterator

import polars as pl

from ... import schema
from ...errors import PastaError
from ...probes import pinned, program, uprobe_link
from ..session import checks
from ..procs import discovery, reach
from ..output import manifest as mf
from ..procs.late_load import OpenedLibrary
from ..session.options import DEFAULT_NATIVE_PAGES, DEFAULT_STACK_PAGES, Options, names_pages


def program_spec(*, buffer_pages: int, aggregate: bool, filter_pids: bool, stack_depth: int | None = None,
                 stack_pages: int = DEFAULT_STACK_PAGES, aggregate_max: int = schema.DEFAULT_AGGREGATE_MAX,
                 native_stacks: str | None = None, native_pages: int = DEFAULT_NATIVE_PAGES,
                 allowed_uid: int | None = None) -> program.Spec:
    """The probes and discover programs of a capture with these settings (``allowed_uid``:
    capture.procs.reach), for probes.program.build; the names ring follows --buffer-pages."""
    return program.Spec(
        ring_pages=buffer_pages, names_pages=names_pages(buffer_pages), aggregate=aggregate,
        aggregate_max=aggregate_max, filter_pids=filter_pids, stack_depth=stack_depth, stack_pages=stack_pages,
        native_stacks=native_stacks, native_pages=native_pages, allowed_uid=allowed_uid,
    )


def handler_names() -> list[str]:
    """The BPF functions the catalog's instantiation lines define."""
    from ...probes import catalog

    return [n for a in catalog.APIS for n in program.handler_names(a) if n]


def load_program(opts: Options, say: Callable[[str], None] | None = None):
    """Compile and load the probes and discover programs (a bcc.BPF): the
    handlers from the cache (probes.compiled_cache) unless --no-bpf-cache.
    ``say`` is told what the cache did, with -v."""
    from ...probes import compiled_cache

    bcc = checks.import_bcc()
    spec = program_spec(buffer_pages=opts.buffer_pages, aggregate=opts.aggregate, filter_pids=opts.mode != "system",
                        stack_depth=opts.stack_depth_loaded, stack_pages=opts.stack_pages,
                        aggregate_max=opts.aggregate_max, native_stacks=opts.native_stacks_loaded,
                        native_pages=opts.native_pages, allowed_uid=reach.traced_uid())
    text = program.build(spec)
    note = say if say is not None and opts.verbose else (lambda _msg: None)
    try:
        if not opts.bpf_cache:
            return bcc.BPF(text=text)
        return compiled_cache.compile_program(bcc, text, lambda: program.build(replace(spec, apis=())), handler_names(),
                                             note)
    except Exception as e:  # noqa: BLE001 - BCC raises bare Exception
        raise PastaError(f"the BPF program did not load: {str(e).splitlines()[0]}",
                         hint="run `pasta-trace doctor`") from None


class ProbeSet:
    """Which library files (by inode) have our probes, and what each got.

    ``known`` is told the (dev, inode) of each file that got probes, so that the
    discover program stops no process for opening it again.  A file that got
    none (still being written, say) is not kept: its next open tries again."""

    def __init__(self, bpf, *, known: Callable[[int, int], None], say: Callable[[str], None], verbose: bool):
        self.bpf = bpf
        self._known = known
        self._say = say
        self._verbose = verbose
        self.attached: dict[tuple[int, int], mf.LibraryEntry] = {}
        self.unprobed: dict[tuple[int, int], mf.LibraryEntry] = {}  # tried, no probe attached (yet)
        self.library_rows: list[dict] = []
        self.notes: list[str] = []
        self._written_libs = 0
        self._pins: list[pinned.PinnedFile] = []  # the files probed, open until detach

    @property
    def functions(self) -> int:
        return sum(len(e.symbols_attached) for e in self.attached.values())

    def entries(self) -> list[mf.LibraryEntry]:
        return [*self.attached.values(), *(e for k, e in self.unprobed.items() if k not in self.attached)]

    def has_probes(self, dev: int, inode: int) -> bool:
        return (dev, inode) in self.attached

    def filter_pid(self, pid: int) -> None:
        """Let events of ``pid`` through the program's PID filter."""
        t = self.bpf["pid_filter"]
        t[t.Key(pid)] = t.Leaf(1)

    def attach(self, lib: discovery.Library | OpenedLibrary, family: str | None = None) -> mf.LibraryEntry | None:
        """Attach the probes to a library file unless its inode already has them."""
        from ...probes import attach as probe_attach, elf

        key = (lib.dev, lib.inode)
        if key in self.attached:
            return None
        fam = (family or getattr(lib, "family", None) or discovery.family_of(lib.attach_path)
               or discovery.family_of(getattr(lib, "path", "")))
        if fam is None:
            return None
        path = getattr(lib, "ns_path", None) or lib.path
        try:
            pin = pinned.pin(lib.dev, lib.inode, candidates(lib))
        except pinned.IdentityError as e:
            if e.errno == errno.ENOENT:  # the process exited (or the file went) between the scan and the attach
                self.notes.append(f"{path}: gone before its probes were attached ({e.strerror})")
                return None
            # another file answers at its path now (a mount over it, a rename): attaching
            # there would probe that file under this one's name
            self.notes.append(f"{path}: not attached: {e.strerror}")
            self._say(f"warning: {self.notes[-1]}")
            return None
        try:
            res = probe_attach.attach_library(self.bpf, pin.path, fam)
        except Exception as e:  # noqa: BLE001 - any per-library failure stays with that library
            res = probe_attach.AttachResult(pin.path, errors=[f"{type(e).__name__}: {e}"])
        res.path = pin.source
        try:
            bid = elf.build_id(pin.path)  # read from the probed inode, not from whatever has its path now
        except Exception:  # noqa: BLE001 - a damaged or vanished ELF: no build-id, still traced
            bid = None
        if res.attached:
            # held until the probes are removed: a descriptor number used again for another
            # file would give BCC's perf-event uprobes the name of one already made
            self._pins.append(pin)
        else:
            pin.close()
        entry = mf.LibraryEntry(
            path=path, attach_path=pin.source, dev=pin.dev, inode=pin.inode, build_id=bid, family=fam,
            symbols_attached=res.attached, symbols_missing=res.missing, placements=res.placements,
            errors=res.errors, aliases=res.aliases,
        )
        if self._verbose:
            self._say(probe_attach.describe_missing(res, None))
            if res.placements:
                moved = {s: o for s, o in res.placements.items() if o}
                self._say(f"  probes past the symbol (offset): {moved}" if moved else "  all probes at the symbols")
        if not res.attached:
            if key not in self.unprobed:  # said once; tried again at every open
                self.notes.append(f"{path}: no probe attached ({'; '.join(res.errors[:3]) or 'no probed symbol'})")
                self._say(f"warning: {self.notes[-1]}")
            self.unprobed[key] = entry
            return entry
        self.attached[key] = entry
        self.library_rows.append({
            "path": path, "attach_path": pin.source, "dev": pin.dev, "inode": pin.inode, "build_id": bid,
            "family": fam, "symbols_attached": len(res.attached), "symbols_missing": len(res.missing),
        })
        self._known(lib.dev, lib.inode)
        return entry

    def write_libraries(self, writer) -> None:
        """Rewrite libraries.parquet when a library was attached since the last time."""
        if self.library_rows and len(self.library_rows) != self._written_libs:
            self._written_libs = len(self.library_rows)
            writer.write_frame(writer.dir / "libraries.parquet",
                               pl.DataFrame(self.library_rows, schema=schema.LIBRARIES_SCHEMA))

    def detach(self) -> None:
        """Remove the probes without making the user wait for the kernel.

        Closing a uprobe's perf event waits for RCU grace periods: 0.1-0.25 s
        per probe on our kernels, a minute for a few hundred probes (a
        uprobe_multi link, used where the kernel has them, about 20x less).  A
        detached grandchild inherits the descriptors and closes them; our own
        copies then close at once.

        Every exit path must come here once probes are attached.  BCC's own
        cleanup (BPF.cleanup, also run at interpreter exit) detaches each
        uprobe it still lists through tracefs: it opens uprobe_events to look
        for a leftover ``p_<path>_0x<offset>_bcc_<pid>`` entry, and where tracefs
        is not mounted that open fails and it raises "Failed to detach BPF from
        uprobe", although our probes, made by perf_event_open, have no tracefs
        entry and go when their fd closes.  So the fds are taken out of BCC's
        list first.  Removing is cleanup: a failure is a warning in the
        manifest's notes (shown by the summary), never a failed capture."""
        try:
            fds = [*self.bpf.uprobe_fds.values(), *uprobe_link.take(self.bpf)]
            self.bpf.uprobe_fds.clear()
            if fds:
                close_in_background(fds)
            self.bpf.cleanup()
        except Exception as e:  # noqa: BLE001 - BCC raises bare Exception
            self.notes.append(f"removing the probes: {type(e).__name__}: {e}")
        finally:
            for pin in self._pins:
                pin.close()
            self._pins.clear()


def candidates(lib: discovery.Library | OpenedLibrary) -> Iterator[str]:
    """Paths that may reach the file ``lib`` names, best first; pinned.pin
    keeps the first that is that very file.  After the path the scan or the
    stop gave, the process's own mappings of it (/proc/PID/map_files), which
    no mount or rename can redirect."""
    yield lib.attach_path
    if lib.pid > 0:
        yield from pinned.mapped_files(lib.pid, lib.dev, lib.inode)


#: the removal helper: a fresh, single-threaded interpreter (a fork of the
#: tracer, which runs threads, could inherit a lock held by one of them).  Its
#: child goes on alone (no zombie for the tracer, no terminal), waits until
#: the tracer's copies are closed, then closes the probes' last copies.
_CLOSER = (
    "import os,sys\n"
    "from concurrent.futures import ThreadPoolExecutor\n"
    "done=int(sys.argv[1])\n"
    "fds=[int(a) for a in sys.argv[2:]]\n"
    "if os.fork():\n"
    "    os._exit(0)\n"
    "while os.read(done,1):\n"
    "    pass\n"
    "with ThreadPoolExecutor(max_workers=16) as pool:\n"
    "    list(pool.map(os.close,fds))\n"
)


def close_in_background(fds: list[int]) -> None:
    """Close ``fds`` in a detached process, after this process has dropped
    its own copies: the last close of a probe is the one that waits for the
    kernel, and it must not be ours.  The helper inherits the uprobes and
    nothing else: an inherited copy of anything else (the discover
    tracepoints, the rings, the maps) would stay attached for as long as the
    removal takes."""
    done_r, done_w = os.pipe()
    try:
        helper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _CLOSER, str(done_r), *map(str, fds)],
                                  pass_fds=(done_r, *fds), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL, start_new_session=True, env={})
        helper.wait()
    finally:
        os.close(done_r)
        for fd in fds:
            os.close(fd)
        os.close(done_w)
