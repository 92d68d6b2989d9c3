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
ALLOCATOR_POLICIES = ("tuned", "default")

#: The largest mmap threshold glibc accepts on 64-bit (half its 64 MiB heap size): messages
#: up to 32 MiB then reuse heap memory instead of mapping and faulting in fresh pages.
MMAP_THRESHOLD = 32 << 20
#: Keep freed heap instead of returning it to the kernel after every large message.
TRIM_THRESHOLD = 1 << 30

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_applied: dict[str, str] = {}


def allocator_settings() -> dict[str, str]:
    """The allocator settings of this process: environment, and any applied in-process."""
    out = {f"env.{name}": os.environ[name] for name in ALLOCATOR_VARS if name in os.environ}
    out.update({f"mallopt.{name}": value for name, value in _applied.items()})
    return out


def tuned_environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the tuned allocator variables.

    Variables the user has set already are kept: their choice wins, and is recorded.
    """
    env = dict(os.environ if base is None else base)
    env.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))
    env.setdefault("MALLOC_TRIM_THRESHOLD_", str(TRIM_THRESHOLD))
    return env


def apply_policy(policy: str) -> dict[str, str] | None:
    """Apply an allocator policy to this process; return the environment for servers.

    ``"tuned"`` sets this process's thresholds now (``mallopt``) and returns an environment
    that sets them in every server it starts; ``"default"`` changes nothing and returns None.
    """
    if policy == "default":
        return None
    if policy != "tuned":
        known = ", ".join(ALLOCATOR_POLICIES)
        raise ValueError(f"unknown allocator policy {policy!r}; known: {known}")
    tune_allocator(
        mmap_threshold=int(os.environ.get("MALLOC_MMAP_THRESHOLD_", MMAP_THRESHOLD)),
        trim_threshold=int(os.environ.get("MALLOC_TRIM_THRESHOLD_", TRIM_THRESHOLD)),
    )
    return tuned_environment()


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
