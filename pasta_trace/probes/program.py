"""The BPF program text: schema header + configuration + bpf/*.bpf.c + one
instantiation line per probed API, generated from the catalog so that ids,
kinds and shapes come from one table."""

from __future__ import annotations

from pathlib import Path

from pasta_trace import schema
from pasta_trace.probes import catalog, offsets

BPF_DIR = Path(__file__).resolve().parents[2] / "bpf"
SOURCES = ("pasta.h", "cuda.bpf.c", "hip.bpf.c")

DEFAULT_RING_PAGES = 1024  # 4 MiB with 4 KiB pages: ~30k events between drains
DEFAULT_NAMES_PAGES = 64
AGG_MAX = 65536
PID_FILTER_MAX = 4096


def handler_names(api: catalog.Api) -> tuple[str, str | None]:
    """Names of the BPF functions for ``api``: (entry, return or None)."""
    return f"pt_e_{api.symbol}", (f"pt_r_{api.symbol}" if api.ret else None)


def instantiation(api: catalog.Api) -> str:
    return f"{api.macro}({api.symbol}, {catalog.API_ID[api.symbol]}, {int(api.kind)}, {api.arg})"


def _power_of_two(name: str, n: int) -> None:
    if n < 1 or n & (n - 1):
        raise ValueError(f"{name} must be a power of two, got {n}")


def build_bpf_text(
    *,
    ring_pages: int = DEFAULT_RING_PAGES,
    names_pages: int = DEFAULT_NAMES_PAGES,
    aggregate: bool = False,
    filter_pids: bool = False,
    apis: tuple[catalog.Api, ...] = catalog.APIS,
) -> str:
    """C text for ``bcc.BPF(text=...)``.  ``apis`` limits the handlers that
    are compiled (attach only those); their ids stay the catalog's."""
    _power_of_two("ring_pages", ring_pages)
    _power_of_two("names_pages", names_pages)
    config = [
        f"#define PT_RING_PAGES {ring_pages}",
        f"#define PT_NAMES_PAGES {names_pages}",
        f"#define PT_AGG_MAX {AGG_MAX}",
        f"#define PT_PID_FILTER_MAX {PID_FILTER_MAX}",
    ]
    if aggregate:
        config.append("#define PT_AGGREGATE 1")
    if filter_pids:
        config.append("#define PT_FILTER_PIDS 1")
    parts = [schema.bpf_c_header(), "\n".join(config) + "\n", offsets.c_defines()]
    parts += [(BPF_DIR / s).read_text() for s in SOURCES]
    parts.append("/* generated from pasta_trace/probes/catalog.py */\n" + "".join(instantiation(a) + "\n" for a in apis))
    return "\n".join(parts)
