"""Keep freed memory in the process (glibc): the private step's buffers are not faulted in anew.

A private step holds, between the norms and the clipped sum, every layer's per-example
factors (a text transformer's per-example weight gradients: about 12 MB at batch 64). With
glibc's default, dynamic thresholds that memory goes back to the operating system when it
is freed and every page is faulted in (and zeroed) again at the next step: 3,168 minor page
faults a step against 800 for the non-private step, 15 % of the private step's CPU time
(``benchmarks/dpsgd.py``, docs/dpsgd_engine.md). :func:`keep_freed_memory` sets glibc's
``M_TRIM_THRESHOLD`` (the free memory at the top of the heap kept instead of returned) to
1 GiB and ``M_MMAP_THRESHOLD`` (the size above which a block gets pages of its own, returned
at ``free``) to 32 MiB, its largest value, once per process. Peak memory is unchanged (the
buffers are alive at the peak anyway); what changes is that the process keeps its heap at
its high-water mark between steps, as with ``MALLOC_TRIM_THRESHOLD_`` /
``MALLOC_MMAP_THRESHOLD_`` in the environment. Values are never affected. Elsewhere (macOS,
Windows, musl) nothing is done.

>>> from renyi.dpsgd._memory import keep_freed_memory
>>> keep_freed_memory() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform
import sys

__all__ = ["keep_freed_memory"]

#: glibc's ``malloc.h`` parameter numbers for ``mallopt``
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: free heap top kept (bytes) and the largest allowed mmap threshold on 64-bit glibc
TRIM_THRESHOLD = 1 << 30
MMAP_THRESHOLD = 32 << 20

_done: bool | None = None


def keep_freed_memory() -> bool:
    """Make glibc keep freed memory for reuse (see the module docstring); once per process.

    Returns whether the thresholds are set (``False`` where the C library is not glibc or
    refused a value). Called by :meth:`renyi.dpsgd.PrivacyEngine.make_private` unless
    ``keep_freed_memory=False``.
    """
    global _done
    if _done is not None:
        return _done
    _done = False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success, 0 on a refused value
    ok = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and ok
    _done = ok
    return ok
