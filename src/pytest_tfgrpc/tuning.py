"""Allocator settings that shape large-message figures, and a record of them.

glibc hands every allocation above its mmap threshold fresh pages from the kernel, and
gives freed heap back above its trim threshold; a tensor benchmark allocates and frees
megabytes per message, so both change what is measured. Whatever is in force is recorded
with every result, so figures taken under different settings are never compared blindly.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

ALLOCATOR_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_applied: dict[str, str] = {}


def allocator_settings() -> dict[str, str]:
    """The allocator settings of this process: environment, and any applied in-process."""
    out = {f"env.{name}": os.environ[name] for name in ALLOCATOR_VARS if name in os.environ}
    out.update({f"mallopt.{name}": value for name, value in _applied.items()})
    return out


def tune_allocator(*, mmap_threshold: int, trim_threshold: int) -> bool:
    """Set glibc's mmap and trim thresholds in this running process (``mallopt``).

    The environment variables only act at process start; this acts now. Returns False where
    the C library has no ``mallopt`` (not glibc) or refuses a value.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold))
    ok = bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold)) and ok
    if ok:
        _applied["M_MMAP_THRESHOLD"] = str(mmap_threshold)
        _applied["M_TRIM_THRESHOLD"] = str(trim_threshold)
    return ok
