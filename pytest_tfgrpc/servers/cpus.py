"""Which CPUs the measuring client and the servers it starts run on (``--tfgrpc-cpus``).

A round trip on one host crosses two processes; where the scheduler puts them moves the
figure. On the 2-core CI machine, unpinned 1 KiB echo rounds fell into two modes (~200 us and
~360 us) that switched within a run and between runs, so runs of unchanged code differed by
up to 30 %; with the client on CPU 0 and the server on CPU 1 the rounds' spread fell from
~15 % to ~2 % (benchmarks/results/gate_calibration_notes.md). pyperf pins its workers and
Google Benchmark's guide to reducing variance says ``taskset``, for the same reason.

The **placement** gives the client and the server disjoint sets of CPUs, split by physical
core (SMT siblings stay on one side), so that neither waits for the other's core:

- ``auto`` (the default): the CPUs this process may use, split by core into two halves, the
  client the lower half; left unpinned when there is only one core.
- ``off``: nothing is pinned.
- ``CLIENT:SERVER``: two CPU lists in the kernel's cpulist form, e.g. ``0:1`` or ``0-3:4-7``.

The client is pinned while it measures P2P figures (every thread of the measuring process,
and so the processes it starts then, such as the native client); servers this host starts
for P2P tests (tensor server, floor server) are pinned for their lifetime. PS clusters are
left to the scheduler: their tasks outnumber the cores. The placement is recorded with every
result (``cpu_placement``) and in the run metadata, so that runs under other placements are
never compared blindly.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuError",
    "CpuPlacement",
    "current_placement",
    "format_cpu_list",
    "measuring_cpus",
    "parse_cpu_list",
    "pin_process",
    "pin_server",
    "placement_setting",
    "resolve_placement",
    "use_placement",
]

_SYS_CPU = Path("/sys/devices/system/cpu")


class CpuError(ValueError):
    """A CPU list or placement that cannot be used; the message names the value at fault."""


@dataclass(frozen=True)
class CpuPlacement:
    """Disjoint CPU sets (CPU numbers as the kernel counts them) for the measuring client
    and the servers started on this host."""

    client: frozenset[int]
    server: frozenset[int]

    def describe(self) -> str:
        """``client 0, server 1``: the recorded form."""
        return f"client {format_cpu_list(self.client)}, server {format_cpu_list(self.server)}"


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a kernel cpulist (``0``, ``0-3,6``, as in ``taskset -c`` and
    ``/sys/.../cpulist``). Raises :class:`CpuError` naming the part at fault."""
    cpus: set[int] = set()
    if not text.strip():
        raise CpuError("an empty CPU list")
    for part in text.split(","):
        low, dash, high = part.strip().partition("-")
        try:
            first = int(low)
            last = int(high) if dash else first
        except ValueError:
            raise CpuError(f"{part.strip()!r} is not a CPU number or range (e.g. 0-3)") from None
        if first < 0 or last < first:
            raise CpuError(f"{part.strip()!r} is not a CPU range: numbers from 0, low-high")
        cpus.update(range(first, last + 1))
    return frozenset(cpus)


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The shortest cpulist of ``cpus`` (``{0, 1, 2, 5}`` -> ``0-2,5``)."""
    ordered = sorted(cpus)
    parts: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(parts)


def _cores(allowed: frozenset[int], sys_cpu: Path) -> list[frozenset[int]]:
    """``allowed`` grouped by physical core (SMT siblings together), in CPU order; a CPU
    whose topology the kernel does not show is a core of its own."""
    cores: list[frozenset[int]] = []
    seen: set[int] = set()
    for cpu in sorted(allowed):
        if cpu in seen:
            continue
        siblings_file = sys_cpu / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = parse_cpu_list(siblings_file.read_text()) & allowed
        except (OSError, CpuError):
            siblings = frozenset({cpu})
        siblings |= {cpu}
        cores.append(siblings)
        seen |= siblings
    return cores


def resolve_placement(
    value: str, allowed: frozenset[int] | None = None, *, sys_cpu: Path = _SYS_CPU
) -> CpuPlacement | None:
    """The placement ``value`` (``auto``, ``off`` or ``CLIENT:SERVER``, see the module
    docstring) asks for on this host, among ``allowed`` (default: the CPUs this process may
    use); None for no pinning. Raises :class:`CpuError` for a malformed value or a CPU this
    process may not use."""
    allowed = frozenset(os.sched_getaffinity(0)) if allowed is None else allowed
    value = value.strip()
    if value == "off":
        return None
    if value == "auto":
        cores = _cores(allowed, sys_cpu)
        if len(cores) < 2:
            return None
        half = len(cores) // 2
        return CpuPlacement(
            client=frozenset().union(*cores[:half]), server=frozenset().union(*cores[half:])
        )
    client_text, colon, server_text = value.partition(":")
    if not colon:
        raise CpuError(
            f"{value!r} is not a placement: auto, off or CLIENT:SERVER CPU lists (e.g. 0:1)"
        )
    sides = {}
    for side, text in (("client", client_text), ("server", server_text)):
        try:
            cpus = parse_cpu_list(text)
        except CpuError as exc:
            raise CpuError(f"{value!r}: the {side} CPUs: {exc}") from None
        outside = cpus - allowed
        if outside:
            raise CpuError(
                f"{value!r}: the {side} CPUs {format_cpu_list(outside)} are not among the CPUs "
                f"this process may use ({format_cpu_list(allowed)})"
            )
        sides[side] = cpus
    return CpuPlacement(client=sides["client"], server=sides["server"])


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin_process(pid: int, cpus: frozenset[int]) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (threads it starts later inherit
    it). Threads that end meanwhile are skipped; raises ProcessLookupError when the process
    is gone, PermissionError when it is not ours."""
    if not _threads(pid):
        raise ProcessLookupError(f"process {pid} is gone")
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(tid, cpus)


_placement: CpuPlacement | None = None


def use_placement(placement: CpuPlacement | None) -> None:
    """Make ``placement`` the one this process measures under (None: unpinned)."""
    global _placement
    _placement = placement


def current_placement() -> CpuPlacement | None:
    """The placement this process measures under (:func:`use_placement`)."""
    return _placement


def placement_setting() -> dict[str, str]:
    """``{"cpu_placement": ...}``: how P2P figures of this process are placed, recorded with
    each result and in the run metadata."""
    return {"cpu_placement": _placement.describe() if _placement else "unpinned"}


def pin_server(pid: int | None) -> None:
    """Pin a server this host started (``pid``) to the placement's server CPUs; nothing
    without a placement, for a server started elsewhere (``pid`` None) or one that has
    already ended (its death is reported by whoever watches it)."""
    if _placement is not None and pid is not None:
        with contextlib.suppress(ProcessLookupError):
            pin_process(pid, _placement.server)


@contextlib.contextmanager
def measuring_cpus() -> Iterator[None]:
    """Run the block with every thread of this process on the placement's client CPUs, and
    give each thread back the CPUs it had (threads started in the block get the process's
    CPUs); nothing without a placement."""
    if _placement is None:
        yield
        return
    pid = os.getpid()
    before = {}
    for tid in _threads(pid):
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            before[tid] = frozenset(os.sched_getaffinity(tid))
    process_cpus = before.get(pid, frozenset(os.sched_getaffinity(0)))
    pin_process(pid, _placement.client)
    try:
        yield
    finally:
        for tid in _threads(pid):
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(tid, before.get(tid, process_cpus))
