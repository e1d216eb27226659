"""What the benchmarks (scripts/bench_*.py) print beside their figures: the machine's load, and the
CPU time of the processes they measure."""

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


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (OSError: gone)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def process_ticks(pid: int) -> int:
    """utime + stime of one process, its threads included, in clock ticks
    (os.sysconf("SC_CLK_TCK") a second).  OSError where it is gone."""
    f = _stat(pid)
    return int(f[11]) + int(f[12])


def parent_of(pid: int) -> int:
    """The PID of its parent.  OSError where it is gone."""
    return int(_stat(pid)[1])
