"""Which CPUs the measuring client and the servers it starts run on (``--tfgrpc-cpus``).

A round trip on one host crosses two processes; where the scheduler puts them moves the
figure. On the 2-core CI machine, unpinned 1 KiB echo rounds fell into two modes (~200 us and
~360 us) that switched within a run and between runs, so runs of unchanged code differed by
up to 30 %; with the client on CPU 0 and the server on CPU 1 the rounds' spread fell from
~15 % to ~2 % (benchmarks/results/gate_calibration_notes.md). pyperf pins its workers and
Google Benchmark's guide to reducing variance says ``taskset``, for the same reason.

The **placement** names the CPUs of the client and those of the server:

- ``auto`` (the default): the CPUs this process may use, split by physical core into two
  disjoint halves (SMT siblings stay on one side), the client the lower half, so that neither
  waits for the other's core; left unpinned when there is only one core.
- ``off``: nothing is pinned.
- ``CLIENT:SERVER``: two CPU lists in the kernel's cpulist form, e.g. ``0:1`` or ``0-3:4-7``.
  They may overlap (``0:0`` measures client and server sharing one core, a legitimate
  experiment); the recorded placement shows both lists as given.

The client is pinned while it measures P2P figures (every thread of the measuring process,
and so the processes it starts then, such as the native client); servers this host starts
for P2P tests (tensor server, floor server) are pinned for their lifetime, when this host
knows their process (a ``.pid`` of a local process). PS clusters are left to the scheduler:
their tasks outnumber the cores. The run's placement is recorded in the run metadata, and
each P2P result records what happened to its client and server (``cpu_placement``: ``client
0, server 1``, or ``client 0, server unpinned (...)`` for a server started elsewhere), so that
runs under other placements are never compared blindly.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "MAX_CPU",
    "CpuError",
    "CpuPlacement",
    "current_placement",
    "format_cpu_list",
    "measuring_cpus",
    "parse_cpu_list",
    "pin_child_server",
    "pin_process",
    "pin_server",
    "placement_setting",
    "release_server",
    "require_allowed",
    "resolve_placement",
    "result_placement",
    "server_pinned",
    "use_placement",
]

_SYS_CPU = Path("/sys/devices/system/cpu")
#: The largest CPU number a CPU list may name: far above any machine's (Linux's NR_CPUS is at
#: most 8192), low enough that a list is checked before it is expanded into a set.
MAX_CPU = 65535
_CPU_RANGE = re.compile(r"(?P<first>[0-9]+)(?:-(?P<last>[0-9]+))?", re.ASCII)


class CpuError(ValueError):
    """A CPU list or placement that cannot be used; the message names the value at fault."""


@dataclass(frozen=True)
class CpuPlacement:
    """CPU sets (CPU numbers as the kernel counts them) for the measuring client and the
    servers started on this host: disjoint under ``auto``, as given (maybe overlapping) for
    explicit lists."""

    client: frozenset[int]
    server: frozenset[int]

    def describe(self) -> str:
        """``client 0, server 1``: the recorded form."""
        return f"client {format_cpu_list(self.client)}, server {format_cpu_list(self.server)}"


def parse_cpu_list(text: str) -> frozenset[int]:
    """The CPUs of a kernel cpulist (``0``, ``0-3,6``, as in ``taskset -c`` and
    ``/sys/.../cpulist``), each from 0 to :data:`MAX_CPU`. Raises :class:`CpuError` naming
    the part at fault."""
    cpus: set[int] = set()
    if not text.strip():
        raise CpuError("an empty CPU list")
    for part in text.split(","):
        part = part.strip()
        match = _CPU_RANGE.fullmatch(part)
        if match is None:
            raise CpuError(f"{part!r} is not a CPU number or range (e.g. 0-3)")
        # Bounded before anything is expanded (or a long digit string converted).
        for number in filter(None, (match["first"], match["last"])):
            if len(number.lstrip("0")) > len(str(MAX_CPU)) or int(number) > MAX_CPU:
                raise CpuError(
                    f"{part!r}: CPU {number} is above {MAX_CPU}, the largest CPU number accepted"
                )
        first = int(match["first"])
        last = int(match["last"] or first)
        if last < first:
            raise CpuError(f"{part!r} is not a CPU range: numbers from 0, low-high")
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
            require_allowed(cpus, allowed)
        except CpuError as exc:
            raise CpuError(f"{value!r}: the {side} CPUs: {exc}") from None
        sides[side] = cpus
    return CpuPlacement(client=sides["client"], server=sides["server"])


def _cannot_run(who: str | None, cpus: Iterable[int]) -> str:
    cpus = sorted(cpus)
    where = f"CPU {cpus[0]}" if len(cpus) == 1 else f"CPUs {format_cpu_list(cpus)}"
    return f"cannot run {who} on {where}" if who else f"cannot run on {where}"


def require_allowed(
    cpus: frozenset[int], allowed: frozenset[int] | None = None, *, who: str | None = None
) -> None:
    """Raise :class:`CpuError` (``cannot run on CPU 5: not among the CPUs this process may
    use (0-1)``; ``who``, e.g. ``the server``, after ``run``) unless every CPU of ``cpus``
    is among ``allowed`` (default: the CPUs this process may use now), so that a CPU list
    neither names CPUs this host lacks nor leaves the CPUs a ``taskset`` or cpuset gave."""
    allowed = frozenset(os.sched_getaffinity(0)) if allowed is None else allowed
    outside = cpus - allowed
    if outside:
        raise CpuError(
            f"{_cannot_run(who, outside)}: not among the CPUs this process may use "
            f"({format_cpu_list(allowed)})"
        )


def _threads(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def _affinity(tid: int) -> str:
    try:
        return format_cpu_list(os.sched_getaffinity(tid))
    except OSError:
        return "unknown"


def pin_process(pid: int, cpus: frozenset[int], *, who: str | None = None) -> None:
    """Pin every thread of process ``pid`` to ``cpus`` (threads it starts later inherit
    it), and check that the kernel gave each thread all of them.

    Threads that end meanwhile are skipped. Raises ProcessLookupError when the process is
    gone, and :class:`CpuError` (leading with ``cannot run <who> on CPU n``; ``who``
    defaults to ``process <pid>``) when the kernel refuses the CPUs or gives fewer: CPUs
    that do not exist or are offline, outside the process's cpuset (a cgroup it was moved
    into), or a process that is not ours. Threads pinned before a refusal stay pinned:
    giving them their CPUs back is the caller's (:func:`measuring_cpus` does).
    """
    who = who or f"process {pid}"
    threads = _threads(pid)
    if not threads:
        raise ProcessLookupError(f"process {pid} is gone")
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
            got = frozenset(os.sched_getaffinity(tid))
        except ProcessLookupError:
            continue  # a thread that ended meanwhile
        except OSError as exc:
            cannot = _cannot_run(who, cpus)
            if exc.errno == errno.EINVAL:  # no CPU of the list is online and in its cpuset
                raise CpuError(
                    f"{cannot}: not among the CPUs it may use now ({_affinity(tid)})"
                ) from None
            if exc.errno == errno.EPERM:
                raise CpuError(f"{cannot}: not permitted (not this user's process)") from None
            raise CpuError(f"{cannot}: {exc.strerror or exc}") from None
        if got != cpus:  # the kernel kept only the CPUs it may use
            raise CpuError(
                f"{_cannot_run(who, cpus - got)}: not among the CPUs it may use now (the "
                f"kernel gave it {format_cpu_list(got)} of {format_cpu_list(cpus)})"
            )


# The run's placement, the servers this process pinned (pids) and the measurements under way
# (threads of one test may measure at once); _lock guards the last two.
_placement: CpuPlacement | None = None
_lock = threading.Lock()
_pinned: set[int] = set()
_measuring = 0
_saved: tuple[dict[int, frozenset[int]], frozenset[int]] = ({}, frozenset())
#: The option whose placement pins, named in errors.
_OPTION = "--tfgrpc-cpus"


def use_placement(placement: CpuPlacement | None) -> None:
    """Make ``placement`` the one this process measures under (None: unpinned)."""
    global _placement
    _placement = placement


def current_placement() -> CpuPlacement | None:
    """The placement this process measures under (:func:`use_placement`)."""
    return _placement


def placement_setting() -> dict[str, str]:
    """``{"cpu_placement": ...}``: the placement the run asked for (``client 0, server 1`` or
    ``unpinned``), recorded in the run metadata and the header. A result records what
    happened instead (:func:`result_placement`)."""
    return {"cpu_placement": _placement.describe() if _placement else "unpinned"}


def result_placement(server_pid: int | None) -> dict[str, str]:
    """``{"cpu_placement": ...}`` of a P2P result measured against the server of process
    ``server_pid`` (None: no process known here): ``client 0, server 1`` when this process
    pinned that server (:func:`pin_server`), ``client 0, server unpinned (...)`` when not
    (a cluster spec's server, one a node agent started, an engine's server without a
    ``.pid``), ``unpinned`` without a placement. The client is always pinned under one."""
    placement = _placement
    if placement is None:
        return {"cpu_placement": "unpinned"}
    if server_pinned(server_pid):
        return {"cpu_placement": placement.describe()}
    why = "no local pid" if server_pid is None else "started elsewhere"
    client = format_cpu_list(placement.client)
    return {"cpu_placement": f"client {client}, server unpinned ({why})"}


def pin_server(pid: object, *, who: str = "the server") -> bool:
    """Pin the server of process ``pid``, which this host started, to the placement's server
    CPUs for its lifetime, and remember it (:func:`server_pinned`) until
    :func:`release_server`. Whether it was pinned: not without a placement, for a ``pid``
    that is no process id (None: a server started elsewhere), or a server that has already
    ended (its death is reported by whoever watches it). Raises :class:`CpuError` (naming
    ``who`` and ``--tfgrpc-cpus``) when the kernel refuses the CPUs; the caller stops the
    server."""
    placement = _placement
    if placement is None or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        pin_process(pid, placement.server, who=f"{who} ({_OPTION})")
    except ProcessLookupError:
        return False
    with _lock:
        _pinned.add(pid)
    return True


def pin_child_server(pid: object, *, who: str = "the server") -> bool:
    """:func:`pin_server` for a server this process started itself without the plugin's
    fixtures (``ServerProcess.start`` in a suite's own fixture): pinned when ``pid`` is a
    child process of this one and not pinned yet, so that client and server are never half
    placed. Whether it is pinned now."""
    if server_pinned(pid):
        return True
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:  # /proc/PID/stat: "pid (comm) state ppid ...", comm may hold spaces and parentheses
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return False
    if len(fields) < 2 or fields[1] != str(os.getpid()):
        return False
    return pin_server(pid, who=who)


def release_server(pid: object) -> None:
    """Forget that the server of process ``pid`` was pinned (it has stopped, and its pid may
    be reused)."""
    with _lock:
        _pinned.difference_update([pid])


def server_pinned(pid: object) -> bool:
    """Whether :func:`pin_server` pinned process ``pid`` and it has not been released."""
    with _lock:
        return pid in _pinned


@contextlib.contextmanager
def measuring_cpus() -> Iterator[None]:
    """Run the block with every thread of this process on the placement's client CPUs, and
    give each thread back the CPUs it had (threads started in the block get the process's
    CPUs); nothing without a placement.

    Blocks may overlap (P2P calls in threads of one test): the first to enter saves every
    thread's CPUs and pins, the last to leave gives them back. Raises :class:`CpuError`
    (naming ``--tfgrpc-cpus``) when the kernel refuses the client CPUs, every thread's CPUs
    given back first.
    """
    placement = _placement
    if placement is None:
        yield
        return
    _start_measuring(placement.client)
    try:
        yield
    finally:
        _stop_measuring()


def _start_measuring(cpus: frozenset[int]) -> None:
    global _measuring, _saved
    with _lock:
        if _measuring == 0:
            pid = os.getpid()
            saved: dict[int, frozenset[int]] = {}
            for tid in _threads(pid):
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    saved[tid] = frozenset(os.sched_getaffinity(tid))
            process_cpus = saved.get(pid) or frozenset(os.sched_getaffinity(0))
            try:
                pin_process(pid, cpus, who=f"the P2P client ({_OPTION})")
            except BaseException:
                _restore(saved, process_cpus)
                raise
            _saved = (saved, process_cpus)
        _measuring += 1


def _stop_measuring() -> None:
    global _measuring, _saved
    with _lock:
        _measuring -= 1
        if _measuring == 0:
            saved, _saved = _saved, ({}, frozenset())
            _restore(*saved)


def _restore(saved: dict[int, frozenset[int]], process_cpus: frozenset[int]) -> None:
    """Give every thread of this process the CPUs of ``saved`` (a thread started since:
    ``process_cpus``), all threads tried before a refusal is raised."""
    refused = []
    for tid in _threads(os.getpid()):
        cpus = saved.get(tid, process_cpus)
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue
        except OSError as exc:
            refused.append(f"thread {tid} its CPUs {format_cpu_list(cpus)} ({exc.strerror})")
    if refused:
        raise CpuError(
            f"cannot give the P2P client back its CPUs ({_OPTION}): {'; '.join(refused)}; "
            f"it stays on {_affinity(os.getpid())}"
        )
