"""numpy's large arrays on ordinary pages while the merge builds them.

numpy advises the kernel to back every array of 4 MiB or more with huge pages
(madvise MADV_HUGEPAGE).  Where transparent huge pages are `madvise` only and
memory is fragmented (defrag=madvise: the fault compacts memory first), the
first touch of such an array costs several times that of ordinary pages:
512 MiB took 2.3 s against 0.27 s on the 2-CPU machines this project is
measured on, and the merge's pass over 10^8 access samples spent 2.8 of its
15 CPU seconds faulting in the buffer of distinct pages.  The merge's large
arrays are written once and read a few times, which huge pages barely help.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


try:  # numpy >= 2: np._core; older: np.core (absent in some builds: then nothing changes)
    from numpy._core.multiarray import _set_madvise_hugepage
except ImportError:  # pragma: no cover
    _set_madvise_hugepage = None


@contextmanager
def ordinary_pages() -> Iterator[None]:
    """numpy allocates without the huge-page advice inside this block (the
    setting is the process's: arrays other threads make meanwhile too)."""
    if _set_madvise_hugepage is None:
        yield
        return
    before = _set_madvise_hugepage(False)
    try:
        yield
    finally:
        _set_madvise_hugepage(before)
