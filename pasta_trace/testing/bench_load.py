"""The machine's load, printed by the benchmarks (scripts/bench_*.py) with their figures."""

from __future__ import annotations

from typing import Callable


def load_average() -> str:
    """The load average over 1, 5 and 15 minutes, as uptime prints it."""
    with open("/proc/loadavg") as f:
        return ", ".join(f.read().split()[:3])


def with_load(main: Callable[[], int]) -> int:
    """main(), with the load average printed before and after it."""
    print(f"load average {load_average()} at the start", flush=True)
    try:
        return main()
    finally:
        print(f"load average {load_average()} at the end", flush=True)
