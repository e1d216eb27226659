"""Keep freed memory for reuse in a process that moves a flood of records.

glibc gives a freed block of 128 KiB or more back to the kernel (and trims
the heap's free top) at once, so every batch of records read, copied or
decoded lands in pages the kernel must find and clear again.  In a VM whose
page cache is full that cost as much as the rest of the events writer's work
together (perf: clear_page and page faults were 40-60% of its CPU in a
flood).  With the thresholds raised, blocks up to 32 MiB (glibc's largest
mmap threshold) come from the heap and freed ones are used again.
"""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
#: glibc's upper bound for M_MMAP_THRESHOLD on 64-bit (4 * 1024 * 1024 * sizeof(long))
MMAP_THRESHOLD_MAX = 32 << 20


def keep_freed_memory(trim_bytes: int = 1 << 30) -> bool:
    """Raise this process's malloc thresholds; False where it cannot (not
    glibc): nothing changes then but speed."""
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on (as own_process, checks)
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in (
        (M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_TRIM_THRESHOLD, trim_bytes), (M_TOP_PAD, 64 << 20)))
