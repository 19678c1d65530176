"""Handing freed heap memory back to the operating system, where the C library can (glibc's `malloc_trim`).

Once a large block has been freed, glibc raises its mmap threshold, so later blocks of that size come from the
per-thread heap arenas and stay resident when freed: a server that refused large bodies kept that memory. A trim
after such a body returns it, and is cheap. Where there is no `malloc_trim` (musl, macOS), this does nothing.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

__all__ = ["release_free_memory"]


def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)  # the C library this process already runs on
    except OSError:
        return None
    trim = getattr(libc, "malloc_trim", None)  # glibc only
    if trim is None:
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


_TRIM = _malloc_trim()


def release_free_memory() -> bool:
    """Give the heap's free pages back to the OS; False where the C library cannot."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True
