"""The process's C library, loaded once, for the few calls torch does not expose (madvise,
mallopt)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

__all__ = ["linux_libc"]


@functools.cache
def linux_libc() -> ctypes.CDLL | None:
    """Linux's libc with errno kept for the callers, or None elsewhere (the constants the
    callers pass are Linux's) or where no libc is found."""
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    return None if name is None else ctypes.CDLL(name, use_errno=True)
