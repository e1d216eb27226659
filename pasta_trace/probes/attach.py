"""Attach the catalog's handlers to one library file."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from elftools.common.exceptions import ELFError

from pasta_trace.probes import catalog, elf, placement, program, uprobe_link


@dataclass
class AttachResult:
    path: str
    attached: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    placements: dict[str, int] = field(default_factory=dict)  # symbol -> offset past it
    errors: list[str] = field(default_factory=list)
    #: symbols not attached because another probed symbol has the same
    #: address, or because they only jump to one (placement.forward_target):
    #: their events carry that symbol's api.  alias -> attached symbol
    aliases: dict[str, str] = field(default_factory=dict)
    probes: int = 0  # uprobes + uretprobes created


def attach_library(
    bpf,
    path: str,
    family: str,
    apis: tuple[catalog.Api, ...] = catalog.APIS,
    *,
    at_symbol: bool = False,
) -> AttachResult:
    """Attach every probed ``family`` symbol that ``path`` exports (pid=-1,
    so processes that map the file later are covered).  ``path`` may go
    through ``/proc/PID/root`` to reach a container's file.  Missing symbols
    and failed attaches are reported, never raised.  ``at_symbol`` puts every
    probe on the symbol itself instead of the chosen placement (to compare)."""
    result = AttachResult(path)
    wanted = catalog.for_family(family, apis)
    try:
        syms = elf.probe_symbols(path, {a.symbol for a in wanted})
        forwards = forwarders(path, syms)
    except (OSError, ELFError) as e:
        result.errors.append(f"{path}: cannot read its ELF symbols: {e}")
        return result
    by_address: dict[int, str] = {}
    for api in wanted:
        sym = syms.get(api.symbol)
        if sym is None:
            result.missing.append(api.symbol)
            continue
        first = by_address.setdefault(sym.vaddr, api.symbol)
        if first != api.symbol:
            result.aliases[api.symbol] = first
            continue
        if api.symbol in forwards:
            result.aliases[api.symbol] = forwards[api.symbol]
            continue
        entry_fn, return_fn = program.handler_names(api)
        try:
            offset = 0 if at_symbol else placement.choose_probe_offset(path, sym).offset
            if uprobe_link.available():
                at = sym.file_offset + offset
                uprobe_link.attach(bpf, entry_fn, path, at)
                result.probes += 1
                if return_fn:
                    uprobe_link.attach(bpf, return_fn, path, at, retprobe=True)
                    result.probes += 1
            else:
                addr = sym.vaddr + offset
                bpf.attach_uprobe(name=path.encode(), addr=addr, fn_name=entry_fn.encode(), pid=-1)
                result.probes += 1
                if return_fn:
                    bpf.attach_uretprobe(name=path.encode(), addr=addr, fn_name=return_fn.encode(), pid=-1)
                    result.probes += 1
        except Exception as e:  # noqa: BLE001 - BCC raises bare Exception
            result.errors.append(f"{api.symbol}: {e}")
            continue
        result.attached.append(api.symbol)
        result.placements[api.symbol] = offset
    return result


def forwarders(path: str, syms: dict[str, elf.Sym]) -> dict[str, str]:
    """Probed symbols that only jump to another probed symbol -> that symbol.
    Probing both would report one call twice; the target sees the same
    arguments and return address, so it alone is probed."""
    at = {s.vaddr: name for name, s in syms.items()}
    out = {}
    for name, sym in syms.items():
        target = at.get(placement.forward_target(placement.read_code(path, sym), sym.vaddr))
        if target is not None and target != name:
            out[name] = target
    return out


def describe_missing(result: AttachResult, version: str | None) -> str:
    """One paragraph for ``-v`` and the manifest: what this library lacks."""
    ver = f" (version {version})" if version else ""
    lines = [f"{result.path}{ver}: {len(result.attached)} probed symbols attached, {len(result.missing)} missing"]
    if result.missing:
        lines.append("  missing (not exported by this version): " + ", ".join(sorted(result.missing)))
    if result.aliases:
        lines.append(
            "  aliases (same address, or a jump to it: reported under the second): "
            + ", ".join(f"{a}={b}" for a, b in sorted(result.aliases.items()))
        )
    for err in result.errors:
        lines.append(f"  error: {err}")
    return "\n".join(lines)


def detach_all(bpf) -> None:
    """Close every uprobe of ``bpf``: its uprobe_multi links, and its perf-event fds.  BCC's own
    cleanup also edits tracefs's ``uprobe_events``, which fails (and raises)
    where tracefs is not mounted, although the probes were created through
    perf_event_open and closing the fd removes them."""
    from bcc import lib  # local: importing bcc needs the system package

    for fd in uprobe_link.take(bpf):
        os.close(fd)
    for ev_name, fd in list(bpf.uprobe_fds.items()):
        lib.bpf_close_perf_event_fd(fd)
        bpf._del_uprobe_fd(ev_name)  # keeps BCC's open-probe count right
