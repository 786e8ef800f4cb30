"""glibc's malloc told to keep large freed blocks in the process, for fits that allocate and free them at every step.

glibc serves an allocation above its mmap threshold (which it raises to at most 32 MiB) with fresh pages from the
kernel and gives them back when the block is freed. A Step I fit on the CPU at thousands of genes allocates its
batch × genes × hidden activations, tens of MiB each, at every step: each page of each of them is then faulted in
again, and the kernel's work makes up a good part of the step. With the threshold and the trim threshold raised, the
freed blocks stay in malloc's heap and the next step reuses them. The process's peak memory is unchanged. The memory
is not handed back to the system after the fit; later allocations reuse it.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger("cape")

__all__ = ["GLIBC_MMAP_THRESHOLD_MAX", "KEPT_BELOW", "keep_freed_blocks"]

#: The largest mmap threshold glibc picks by itself on a 64-bit system: blocks above it are always mapped afresh.
GLIBC_MMAP_THRESHOLD_MAX = 32 << 20

#: The threshold set: blocks up to this size come from malloc's heap and stay there when freed.
KEPT_BELOW = 1 << 30

_M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
_ENVIRONMENT = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")

_done = False


def keep_freed_blocks(block_bytes: int) -> bool:
    """Raise glibc's mmap and trim thresholds to :data:`KEPT_BELOW` where blocks of ``block_bytes`` would be mapped.

    Does nothing where ``block_bytes`` ≤ :data:`GLIBC_MMAP_THRESHOLD_MAX`, where the C library is not glibc, where the
    user set glibc's malloc options in the environment, or where this process already set them.

    Parameters
    ----------
    block_bytes
        Size of the blocks the caller will allocate and free repeatedly.

    Returns
    -------
    Whether the thresholds are now raised by this function (in this call or an earlier one).
    """
    global _done
    if _done:
        return True
    if block_bytes <= GLIBC_MMAP_THRESHOLD_MAX or platform.libc_ver()[0] != "glibc":
        return False
    if any(name in os.environ for name in _ENVIRONMENT):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # Both: with the mmap threshold alone, a free at the top of the heap would still trim its pages back.
    _done = bool(mallopt(_M_TRIM_THRESHOLD, KEPT_BELOW)) and bool(mallopt(_M_MMAP_THRESHOLD, KEPT_BELOW))
    if _done:
        logger.debug("glibc malloc: blocks up to %d MiB kept in the process when freed", KEPT_BELOW >> 20)
    return _done
