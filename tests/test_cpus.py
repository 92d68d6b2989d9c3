"""CPU placement (--tfgrpc-cpus): parsing, the auto split by core, pinning threads and
processes, and the plugin end to end (the server's CPUs, the recorded placement, bad values)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.tuning import cpus
from pytest_tfgrpc.tuning.cpus import (
    CpuError,
    CpuPlacement,
    format_cpu_list,
    measuring_cpus,
    parse_cpu_list,
    pin_process,
    resolve_placement,
)
from pytest_tfgrpc.wire.fabric import resolve_fabric

SERVER = (sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server")
ALLOWED = frozenset(os.sched_getaffinity(0))
needs_two_cpus = pytest.mark.skipif(len(ALLOWED) < 2, reason="needs two usable CPUs")


@pytest.fixture
def placement() -> Iterator[CpuPlacement]:
    """The first two usable CPUs as client and server, made this process's placement."""
    first, second = sorted(ALLOWED)[:2]
    chosen = CpuPlacement(client=frozenset({first}), server=frozenset({second}))
    cpus.use_placement(chosen)
    yield chosen
    cpus.use_placement(None)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("0", {0}), ("0-3", {0, 1, 2, 3}), ("0-2,5", {0, 1, 2, 5}), (" 4 , 6-7 ", {4, 6, 7})],
)
def test_cpu_lists_parse_as_the_kernel_writes_them(text: str, expected: set[int]) -> None:
    assert parse_cpu_list(text) == expected
    assert parse_cpu_list(format_cpu_list(expected)) == expected


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("", "empty"),
        ("a", "'a' is not"),
        ("3-1", "'3-1' is not a CPU range"),
        ("-1", "'-1'"),
        ("1_0", "'1_0' is not a CPU number"),  # int() would take these
        ("+1", "'\\+1' is not a CPU number"),
        ("\uff11", "is not a CPU number"),  # a full-width digit
    ],
)
def test_bad_cpu_lists_name_the_part_at_fault(text: str, fault: str) -> None:
    with pytest.raises(CpuError, match=fault):
        parse_cpu_list(text)


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("0-30000000", "30000000"),
        ("0-3000000000", "3000000000"),
        ("65536", "65536"),
        ("1,70000-70001", "70000"),
        ("99999999999999999999-1", "99999999999999999999"),
        ("9" * 5000, "9" * 5000),  # more digits than int() converts
    ],
)
def test_huge_cpu_numbers_are_refused_before_they_are_expanded(text: str, number: str) -> None:
    with pytest.raises(CpuError, match=f"CPU {number} is above 65535, the largest CPU number"):
        parse_cpu_list(text)
    assert len(parse_cpu_list(f"0-{cpus.MAX_CPU}")) == cpus.MAX_CPU + 1
    assert parse_cpu_list("0001") == {1}


def test_format_gives_the_shortest_list() -> None:
    assert format_cpu_list({5, 0, 1, 2}) == "0-2,5"
    assert format_cpu_list({3}) == "3"


def _topology(root: Path, siblings: dict[int, str]) -> Path:
    for cpu, listed in siblings.items():
        folder = root / f"cpu{cpu}" / "topology"
        folder.mkdir(parents=True)
        (folder / "thread_siblings_list").write_text(listed + "\n")
    return root


def test_auto_splits_cores_in_halves_keeping_smt_siblings_together(tmp_path: Path) -> None:
    # 4 cores with 2 threads each, numbered as Intel does: cpu n and n+4 share a core.
    root = _topology(tmp_path, {n: f"{n % 4},{n % 4 + 4}" for n in range(8)})
    placed = resolve_placement("auto", frozenset(range(8)), sys_cpu=root)
    assert placed == CpuPlacement(client=frozenset({0, 4, 1, 5}), server=frozenset({2, 6, 3, 7}))


def test_auto_on_two_cores_puts_client_and_server_one_each(tmp_path: Path) -> None:
    root = _topology(tmp_path, {0: "0", 1: "1"})
    placed = resolve_placement("auto", frozenset({0, 1}), sys_cpu=root)
    assert placed == CpuPlacement(client=frozenset({0}), server=frozenset({1}))
    assert placed.describe() == "client 0, server 1"


def test_auto_leaves_one_core_unpinned(tmp_path: Path) -> None:
    root = _topology(tmp_path, {0: "0-1", 1: "0-1"})  # one core, two threads
    assert resolve_placement("auto", frozenset({0, 1}), sys_cpu=root) is None
    assert resolve_placement("auto", frozenset({3}), sys_cpu=tmp_path / "none") is None


def test_auto_without_topology_takes_each_cpu_as_a_core(tmp_path: Path) -> None:
    placed = resolve_placement("auto", frozenset({2, 3, 5}), sys_cpu=tmp_path / "none")
    assert placed == CpuPlacement(client=frozenset({2}), server=frozenset({3, 5}))


def test_off_and_explicit_lists() -> None:
    assert resolve_placement("off", frozenset({0, 1})) is None
    assert resolve_placement("0-1:2-3", frozenset(range(4))) == CpuPlacement(
        frozenset({0, 1}), frozenset({2, 3})
    )


@pytest.mark.parametrize(
    ("value", "recorded"),
    [
        ("0:0", "client 0, server 0"),
        ("0-1:1", "client 0-1, server 1"),
        ("1:0-1", "client 1, server 0-1"),
        ("0-1:0-1", "client 0-1, server 0-1"),
    ],
)
def test_explicit_lists_may_overlap_and_the_record_shows_it(value: str, recorded: str) -> None:
    # One core for both is a legitimate experiment; auto never does it.
    placed = resolve_placement(value, frozenset({0, 1}))
    assert placed is not None and placed.describe() == recorded


@pytest.mark.parametrize(
    ("listed", "allowed", "fault"),
    [
        ({5}, {0, 1}, r"cannot run on CPU 5: not among the CPUs this process may use \(0-1\)"),
        ({1, 5}, {0, 1}, r"cannot run on CPU 5: not among"),
        ({1}, {0}, r"cannot run on CPU 1: not among the CPUs this process may use \(0\)"),
        ({2, 3, 7}, {0, 1, 4}, r"cannot run on CPUs 2-3,7: .* \(0-1,4\)"),
    ],
)
def test_cpus_outside_the_allowed_ones_are_refused(
    listed: set[int], allowed: set[int], fault: str
) -> None:
    with pytest.raises(CpuError, match=fault):
        cpus.require_allowed(frozenset(listed), frozenset(allowed))
    cpus.require_allowed(frozenset(listed) & frozenset(allowed), frozenset(allowed))


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("0", "'0' is not a placement: auto, off or CLIENT:SERVER"),
        ("0:", "the server CPUs: an empty CPU list"),
        (":1", "the client CPUs: an empty CPU list"),
        (
            "0:9",
            r"the server CPUs: cannot run on CPU 9: not among the CPUs this process may use "
            r"\(0-1\)",
        ),
        ("5-6:1", r"the client CPUs: cannot run on CPUs 5-6: not among .* \(0-1\)"),
        ("x:1", "the client CPUs: 'x' is not a CPU number"),
        ("0:1-0", "the server CPUs: '1-0' is not a CPU range"),
        ("0-30000000:1", "the client CPUs: '0-30000000': CPU 30000000 is above 65535"),
        ("automatic", "not a placement"),
    ],
)
def test_bad_placements_name_the_value_and_side(value: str, fault: str) -> None:
    with pytest.raises(CpuError, match=fault):
        resolve_placement(value, frozenset({0, 1}))


def _cpus_of_thread(tid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(tid))


@pytest.fixture
def idle_thread() -> Iterator[int]:
    """A thread of this process that waits (its native id); ended after the test."""
    started, stop = threading.Event(), threading.Event()
    tids: list[int] = []

    def idle() -> None:
        tids.append(threading.get_native_id())
        started.set()
        stop.wait(30)

    thread = threading.Thread(target=idle)
    thread.start()
    try:
        assert started.wait(10)
        yield tids[0]
    finally:
        stop.set()
        thread.join(10)


@needs_two_cpus
def test_measuring_pins_every_thread_and_gives_each_its_cpus_back(
    placement: CpuPlacement, idle_thread: int
) -> None:
    with measuring_cpus():
        assert _cpus_of_thread(0) == placement.client
        assert _cpus_of_thread(idle_thread) == placement.client  # a thread that was there
        inside: list[frozenset[int]] = []
        born = threading.Thread(target=lambda: inside.append(_cpus_of_thread(0)))
        born.start()
        born.join(10)
        assert inside == [placement.client]  # a new thread inherits the pin
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
        assert child.stdout.strip() == str(sorted(placement.client))  # and a process
    assert _cpus_of_thread(0) == ALLOWED
    assert _cpus_of_thread(idle_thread) == ALLOWED


@needs_two_cpus
@pytest.mark.parametrize("first_out", ["first in", "second in"])
def test_overlapping_measurements_give_every_thread_its_cpus_back_once_all_end(
    placement: CpuPlacement, idle_thread: int, first_out: str
) -> None:
    # Two P2P calls in threads of one test. The idle thread has CPUs of its own to get back.
    own = frozenset({max(ALLOWED)})
    os.sched_setaffinity(idle_thread, own)
    names = ("first in", "second in")
    entered = {name: threading.Event() for name in names}
    leave = {name: threading.Event() for name in names}
    seen: dict[str, frozenset[int]] = {}

    def measure(name: str) -> None:
        with measuring_cpus():
            seen[name] = _cpus_of_thread(0)
            entered[name].set()
            leave[name].wait(10)

    threads = {name: threading.Thread(target=measure, args=(name,)) for name in names}
    try:
        for name in names:
            threads[name].start()
            assert entered[name].wait(10)
        leave[first_out].set()
        threads[first_out].join(10)
        # The other still measures: every thread stays on the client's CPUs.
        assert _cpus_of_thread(0) == placement.client
        assert _cpus_of_thread(idle_thread) == placement.client
    finally:
        for name in names:
            leave[name].set()
            threads[name].join(10)
    assert seen == {name: placement.client for name in names}
    assert _cpus_of_thread(0) == ALLOWED
    assert _cpus_of_thread(idle_thread) == own


@needs_two_cpus
@pytest.mark.parametrize("refused", ["a CPU the host lacks", "the second thread"])
def test_a_pin_refused_part_way_gives_every_thread_its_cpus_back(
    monkeypatch: pytest.MonkeyPatch, idle_thread: int, refused: str
) -> None:
    own = frozenset({max(ALLOWED)})
    os.sched_setaffinity(idle_thread, own)
    first = min(ALLOWED)
    client = frozenset({first})
    if refused == "a CPU the host lacks":  # this thread gets CPU first, then the check fails
        asked = client | {4000}
        fault = r"cannot run the P2P client \(--tfgrpc-cpus\) on CPU 4000: not among"
    else:  # as if the idle thread had been moved into a cpuset cgroup
        asked = client
        fault = r"cannot run the P2P client \(--tfgrpc-cpus\) on CPU .*: not among .* now"
        real = os.sched_setaffinity

        def refuse_idle(tid: int, cpus: frozenset[int]) -> None:
            if tid == idle_thread and cpus == client:
                raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
            real(tid, cpus)

        monkeypatch.setattr(os, "sched_setaffinity", refuse_idle)
    cpus.use_placement(CpuPlacement(client=asked, server=own))
    try:
        with pytest.raises(CpuError, match=fault), measuring_cpus():
            raise AssertionError("measured on CPUs the kernel refused")
        assert _cpus_of_thread(0) == ALLOWED
        assert _cpus_of_thread(idle_thread) == own
        monkeypatch.undo()
        # Nothing is left counted: the next measurement pins and gives back.
        cpus.use_placement(CpuPlacement(client=client, server=own))
        with measuring_cpus():
            assert _cpus_of_thread(idle_thread) == client
        assert _cpus_of_thread(0) == ALLOWED
        assert _cpus_of_thread(idle_thread) == own
    finally:
        cpus.use_placement(None)


def test_measuring_without_a_placement_changes_nothing() -> None:
    cpus.use_placement(None)
    with measuring_cpus():
        assert _cpus_of_thread(0) == ALLOWED
    assert cpus.placement_setting() == {"cpu_placement": "unpinned"}


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    """A process of ours with two threads (a server stand-in), killed after the test."""
    code = (
        "import threading, time, sys\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)


def _cpus_of_threads(pid: int) -> set[frozenset[int]]:
    return {_cpus_of_thread(int(t)) for t in os.listdir(f"/proc/{pid}/task")}


@needs_two_cpus
def test_a_process_is_pinned_thread_by_thread(child: subprocess.Popen[str]) -> None:
    server_cpu = frozenset({max(ALLOWED)})
    pin_process(child.pid, server_cpu)
    assert len(os.listdir(f"/proc/{child.pid}/task")) >= 2
    assert _cpus_of_threads(child.pid) == {server_cpu}
    child.kill()
    child.wait(10)
    with pytest.raises(ProcessLookupError):
        pin_process(child.pid, frozenset({0}))


@pytest.mark.parametrize(
    ("listed", "fault"),
    [
        # The kernel refuses a list of which no CPU is usable (EINVAL, as after a move into a
        # cpuset cgroup) ...
        ({4000}, r"cannot run the server on CPU 4000: not among the CPUs it may use now \({}\)"),
        ({4000, 4001}, r"cannot run the server on CPUs 4000-4001: not among .* now \({}\)"),
        # ... and keeps only the usable CPUs of one that has some.
        ({0, 4000}, r"on CPU 4000: .* \(the kernel gave it 0 of 0,4000\)"),
        ({0, 9, 4000}, r"on CPUs 9,4000: .* \(the kernel gave it 0 of 0,9,4000\)"),
    ],
)
def test_cpus_the_kernel_refuses_are_a_clear_error(
    child: subprocess.Popen[str], listed: set[int], fault: str
) -> None:
    if 0 not in ALLOWED or len(ALLOWED) > 9:
        pytest.skip("needs CPU 0 and fewer than 10 usable CPUs")
    before = _cpus_of_threads(child.pid)
    with pytest.raises(CpuError, match=fault.replace("{}", format_cpu_list(ALLOWED))):
        pin_process(child.pid, frozenset(listed), who="the server")
    if 0 not in listed:  # a refusal changes nothing
        assert _cpus_of_threads(child.pid) == before


@pytest.mark.parametrize(
    ("error", "fault"),
    [
        (errno.EPERM, "cannot run process .* on CPU 0: not permitted"),
        (errno.EFAULT, "cannot run process .* on CPU 0: Bad address"),
    ],
)
def test_other_affinity_refusals_are_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, child: subprocess.Popen[str], error: int, fault: str
) -> None:
    def refuse(tid: int, cpus: object) -> None:
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    with pytest.raises(CpuError, match=fault):
        pin_process(child.pid, frozenset({0}))


@needs_two_cpus
def test_a_result_records_whether_this_host_pinned_its_server(
    placement: CpuPlacement, child: subprocess.Popen[str]
) -> None:
    client, server = format_cpu_list(placement.client), format_cpu_list(placement.server)
    elsewhere = f"client {client}, server unpinned (started elsewhere)"
    assert cpus.result_placement(None) == {
        "cpu_placement": f"client {client}, server unpinned (no local pid)"
    }
    assert cpus.result_placement(child.pid) == {"cpu_placement": elsewhere}
    assert cpus.pin_server(child.pid)
    assert _cpus_of_threads(child.pid) == {placement.server}
    assert cpus.result_placement(child.pid) == {
        "cpu_placement": f"client {client}, server {server}"
    }
    assert cpus.result_placement(child.pid + 1) == {"cpu_placement": elsewhere}
    cpus.release_server(child.pid)  # stopped: its pid may be another process's next
    assert cpus.result_placement(child.pid) == {"cpu_placement": elsewhere}
    # The run's policy is what was asked, whatever each server got.
    assert cpus.placement_setting() == {"cpu_placement": f"client {client}, server {server}"}
    cpus.use_placement(None)
    assert cpus.result_placement(child.pid) == {"cpu_placement": "unpinned"}
    assert not cpus.pin_server(child.pid)


@pytest.mark.parametrize("pid", [None, 0, -1, True, "self", "1", 1.0])
def test_only_a_process_id_is_pinned(
    monkeypatch: pytest.MonkeyPatch, placement: CpuPlacement, pid: object
) -> None:
    pinned: list[object] = []
    monkeypatch.setattr(cpus, "pin_process", lambda *args, **kwargs: pinned.append(args))
    assert not cpus.pin_server(pid)
    assert pinned == []
    assert not cpus.server_pinned(pid)


@needs_two_cpus
def test_a_server_that_has_ended_is_not_pinned(
    placement: CpuPlacement, child: subprocess.Popen[str]
) -> None:
    child.kill()
    child.wait(10)
    assert not cpus.pin_server(child.pid)
    assert not cpus.server_pinned(child.pid)


def test_a_server_the_kernel_will_not_pin_is_a_clear_error_naming_the_option(
    child: subprocess.Popen[str],
) -> None:
    cpus.use_placement(CpuPlacement(client=frozenset({0}), server=frozenset({4000})))
    try:
        with pytest.raises(
            CpuError, match=r"cannot run the floor server \(--tfgrpc-cpus\) on CPU 4000"
        ):
            cpus.pin_server(child.pid, who="the floor server")
    finally:
        cpus.use_placement(None)
    assert not cpus.server_pinned(child.pid)


def _allowed_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no Cpus_allowed_list")


@needs_two_cpus
def test_tfgrpc_server_cpus_option_pins_it() -> None:
    server_cpu = max(ALLOWED)
    proc = subprocess.Popen(
        [*SERVER, "--fabric", "lo", "--cpus", str(server_cpu), "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline()
        threads = os.listdir(f"/proc/{proc.pid}/task")
        assert {_allowed_of(proc.pid)} == {str(server_cpu)}
        assert all(_cpus_of_thread(int(t)) == {server_cpu} for t in threads)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("abc", "'abc' is not a CPU number"),
        ("0:99", "'0:99' is not a CPU number"),
        ("", "an empty CPU list"),
        ("2-1", "'2-1' is not a CPU range"),
        ("0-3000000000", "CPU 3000000000 is above 65535, the largest CPU number accepted"),
        ("0-30000000", "CPU 30000000 is above 65535"),
        # CPUs this host lacks, alone or beside one it has, are never silently dropped.
        ("9999", "cannot run the server on CPU 9999: not among the CPUs this process may use"),
        (f"{min(ALLOWED)},4000", "cannot run the server on CPU 4000: not among the CPUs"),
        (f"{min(ALLOWED)},4000-4001", "cannot run the server on CPUs 4000-4001: not among"),
    ],
)
def test_tfgrpc_server_refuses_bad_cpus(value: str, fault: str) -> None:
    done = subprocess.run(
        [*SERVER, "--cpus", value], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    assert line.startswith(f"tfgrpc-server: error: --cpus {value}: ")
    assert fault in line
    assert "Traceback" not in done.stderr


@needs_two_cpus
@pytest.mark.parametrize("given", ["second", "both"])
def test_tfgrpc_server_keeps_within_the_cpus_it_was_given(given: str) -> None:
    # As under `taskset -c <first>`: --cpus may narrow the CPUs it was given, never leave them.
    first, second = sorted(ALLOWED)[:2]
    value = str(second) if given == "second" else f"{first}-{second}"
    start = (
        f"import os, sys; os.sched_setaffinity(0, {{{first}}}); "
        "from pytest_tfgrpc.roles.tensor_server import main; sys.exit(main(sys.argv[1:]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", start, "--cpus", value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert (
        f"error: --cpus {value}: cannot run the server on CPU {second}: not among the CPUs "
        f"this process may use ({first})"
    ) in done.stderr


#: Prints the CPUs of the tensor server, each result's recorded placement, and each floor
#: server this host pins.
PINNED_CONFTEST = """
import pathlib
import pytest_tfgrpc.bench.floor as floor

def allowed(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()

def show(results):
    for result in results:
        print("RECORDED", result.label, result.settings["cpu_placement"])

_pin_server = floor.pin_server

def _watched(pid, **kwargs):
    pinned = _pin_server(pid, **kwargs)
    print("FLOOR SERVER", allowed(pid) if pinned else "not pinned")
    return pinned

floor.pin_server = _watched
"""
PINNED_TEST = """
import os
from conftest import allowed, show

def test_pinned(tfgrpc, tensor_server):
    before = os.sched_getaffinity(0)
    tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=20, warmup=2, floor=True)
    assert os.sched_getaffinity(0) == before  # the client's CPUs are given back
    print("SERVER", allowed(tensor_server.pid))
    show(tfgrpc.results)
"""


def _run_placed(
    pytester: pytest.Pytester, conftest: str, test: str
) -> tuple[pytest.RunResult, str]:
    """Run ``test`` (one that passes) with ``--tfgrpc-cpus=<first CPU>:<second CPU>``: its
    output and its JUnit XML."""
    first, second = sorted(ALLOWED)[:2]
    pytester.makeconftest(conftest)
    pytester.makepyfile(test)
    junit = pytester.path / "run.xml"
    result = pytester.runpytest_subprocess(
        "-s", f"--tfgrpc-cpus={first}:{second}", f"--junitxml={junit}"
    )
    result.assert_outcomes(passed=1)
    return result, junit.read_text()


@needs_two_cpus
def test_plugin_pins_the_server_and_records_the_placement(pytester: pytest.Pytester) -> None:
    first, second = sorted(ALLOWED)[:2]
    result, xml = _run_placed(pytester, PINNED_CONFTEST, PINNED_TEST)
    placed = f"client {first}, server {second}"
    result.stdout.fnmatch_lines(
        [
            f"*P2P CPUs {placed}*",
            f"*FLOOR SERVER {second}",
            f"*SERVER {second}",
            f"RECORDED p2p_latency {placed}",
            f"RECORDED p2p_latency_floor {placed}",
        ]
    )
    assert f'name="tfgrpc.meta.cpu_placement" value="{placed}"' in xml


@needs_two_cpus
def test_plugin_off_leaves_the_server_unpinned(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(PINNED_CONFTEST)
    pytester.makepyfile(PINNED_TEST)
    result = pytester.runpytest_subprocess("-s", "--tfgrpc-cpus=off")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [
            "*P2P CPUs unpinned*",
            f"*SERVER {format_cpu_list(ALLOWED)}",
            "RECORDED p2p_latency unpinned",
            "RECORDED p2p_latency_floor unpinned",
        ]
    )
    assert "FLOOR SERVER" not in result.stdout.str()


#: An engine whose server has no .pid (as example_suites/custom_ps's MyPS): the plugin's
#: tensor server behind a handle that does not tell its process.
NO_PID_ENGINE = """
import grpc
from pytest_tfgrpc import Engine, Measured, ServerProcess

class NoPid:
    def __init__(self, fabric, env):
        self.process = ServerProcess.start(fabric, env=env)
        self.target, self.fabric = self.process.target, fabric

    def died(self, grace=0.5):
        return self.process.died(grace)

    def stop(self):
        self.process.stop()

class NoPidEngine(Engine):
    name = "nopid"

    def start_server(self, provision):
        return NoPid(provision.fabric, provision.env)

    def echo(self, server, tensor, *, mode, rpc, run):
        with grpc.insecure_channel(server.target) as channel:
            call = channel.unary_unary("/tfgrpc.RawTensorService/Echo")
            return Measured.timed(lambda: call(tensor.content), run)

def pytest_tfgrpc_add_engines(registry):
    registry.add(NoPidEngine())
"""


@needs_two_cpus
def test_a_server_this_host_did_not_pin_is_recorded_unpinned(pytester: pytest.Pytester) -> None:
    first, second = sorted(ALLOWED)[:2]
    test = textwrap.dedent(
        """
        import pytest
        from conftest import allowed, show

        @pytest.mark.tfgrpc_engines("nopid")
        def test_no_pid(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=20, warmup=2, floor=True)
            print("SERVER", allowed(tensor_server.process.pid))
            show(tfgrpc.results)
        """
    )
    result, xml = _run_placed(pytester, PINNED_CONFTEST + NO_PID_ENGINE, test)
    unpinned = f"client {first}, server unpinned (no local pid)"
    result.stdout.fnmatch_lines(
        [
            f"*P2P CPUs client {first}, server {second}*",  # what the run asked for
            f"*SERVER {format_cpu_list(ALLOWED)}",
            f"RECORDED p2p_latency {unpinned}",
            f"RECORDED p2p_latency_floor {unpinned}",
        ]
    )
    assert "FLOOR SERVER" not in result.stdout.str()  # like the server it stands beside
    assert f'name="tfgrpc.meta.cpu_placement" value="client {first}, server {second}"' in xml


@needs_two_cpus
def test_a_cluster_specs_server_is_recorded_unpinned(pytester: pytest.Pytester) -> None:
    first, second = sorted(ALLOWED)[:2]
    server = subprocess.Popen(
        [*SERVER, "--fabric", "lo", "--exit-on-stdin-eof"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        started = json.loads(server.stdout.readline())
        spec = pytester.path / "cluster.json"
        spec.write_text(json.dumps({"cluster": {"ps": [started["target"]]}}))
        pytester.makeconftest(PINNED_CONFTEST)
        pytester.makepyfile(
            """
            from conftest import show

            def test_remote(tfgrpc, tensor_server):
                assert tensor_server.pid is None
                tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=20, warmup=2)
                show(tfgrpc.results)
            """
        )
        result = pytester.runpytest_subprocess(
            "-s", f"--tfgrpc-cpus={first}:{second}", f"--tfgrpc-cluster={spec}"
        )
        result.assert_outcomes(passed=1)
        result.stdout.fnmatch_lines(
            [f"*RECORDED p2p_latency client {first}, server unpinned (no local pid)"]
        )
        assert _allowed_of(server.pid) == format_cpu_list(ALLOWED)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)


@needs_two_cpus
@pytest.mark.parametrize("pin", [True, False])
def test_the_floor_server_is_pinned_only_beside_a_pinned_server(
    monkeypatch: pytest.MonkeyPatch, placement: CpuPlacement, pin: bool
) -> None:
    from pytest_tfgrpc.bench import floor

    seen: list[tuple[int, set[frozenset[int]], bool]] = []

    def watched(pid: int, **kwargs: str) -> bool:
        pinned = cpus.pin_server(pid, **kwargs)
        seen.append((pid, _cpus_of_threads(pid), cpus.server_pinned(pid)))
        return pinned

    monkeypatch.setattr(floor, "pin_server", watched)
    point = SizeResult.from_samples(64, 64, np.array([1], dtype=np.int64), 1)
    measured = BenchmarkResult("p2p_latency", "p2p_latency", "lo", "x", "raw", "unary", (point,))
    run = RunSpec(5, 1, max_seconds=5.0, warmup_seconds=1.0)
    got = floor.transport_floor(resolve_fabric("lo"), measured, run, pin=pin)
    assert [size.size_bytes for size in got.sizes] == [64]
    if pin:
        ((pid, threads, pinned),) = seen
        assert threads == {placement.server} and pinned
        assert not cpus.server_pinned(pid)  # released once the floor server stopped
    else:
        assert seen == []


#: A placement that goes bad after the run started (as when the pytest process is moved into a
#: cpuset cgroup without those CPUs): CPU 4000 for the server, then for the client.
GONE_CPU_TEST = """
import dataclasses, os, pathlib, threading
import pytest
from pytest_tfgrpc.tuning import cpus

@pytest.fixture
def cpu_gone(request, tfgrpc):
    placed = cpus.current_placement()
    cpus.use_placement(dataclasses.replace(placed, **{request.param: frozenset({4000})}))
    yield
    cpus.use_placement(placed)

def threads_cpus():
    # Every thread's CPUs (those started meanwhile too): this process's CPUs, all of them.
    cpus = set()
    for task in os.listdir("/proc/self/task"):
        try:
            cpus.add(frozenset(os.sched_getaffinity(int(task))))
        except ProcessLookupError:
            continue  # a thread that ended since the listing
    return cpus

@pytest.mark.parametrize("cpu_gone", ["server"], indirect=True)
def test_server_cpu_gone(cpu_gone, tensor_server):
    pass

@pytest.mark.parametrize("cpu_gone", ["client"], indirect=True)
def test_client_cpu_gone(tfgrpc, tensor_server, cpu_gone):
    try:
        tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=20, warmup=2)
    finally:
        assert threads_cpus() == {frozenset(ALL)}

def test_after(tfgrpc, tensor_server):
    # No server of the failed setup is left running, and this process kept its CPUs.
    children = [
        int(pid)
        for task in pathlib.Path("/proc/self/task").iterdir()
        for pid in (task / "children").read_text().split()
    ]
    servers = [
        pid for pid in children
        if b"tensor_server" in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert servers == [tensor_server.pid]
    assert os.sched_getaffinity(0) == ALL

def test_two_calls_in_threads(tfgrpc, tensor_server):
    errors = []

    def measure(label):
        try:
            tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=300, warmup=2, label=label)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=measure, args=(f"t{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert threads_cpus() == {frozenset(ALL)}
"""


@needs_two_cpus
def test_cpus_refused_mid_run_fail_the_test_clearly_and_leave_nothing_pinned(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(GONE_CPU_TEST.replace("ALL", repr(set(ALLOWED))))
    result = pytester.runpytest_subprocess("--tfgrpc-cpus=auto")
    result.assert_outcomes(passed=2, failed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*test_server_cpu_gone*: cannot run the grpcio tensor server (--tfgrpc-cpus) on "
            "CPU 4000: not among the CPUs it may use now*",
            "*CpuError: cannot run the P2P client (--tfgrpc-cpus) on CPU 4000: not among the "
            "CPUs it may use now*",
        ]
    )
    assert "INTERNALERROR" not in result.stdout.str()


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("0:999", "the server CPUs: cannot run on CPU 999: not among"),
        ("fast", "'fast' is not a placement"),
        ("0-:1", "the client CPUs: '0-' is not a CPU number"),
        ("0-30000000:1", "the client CPUs: '0-30000000': CPU 30000000 is above 65535"),
        ("0:1-4000000000", "the server CPUs: '1-4000000000': CPU 4000000000 is above 65535"),
    ],
)
@pytest.mark.parametrize("source", ["--tfgrpc-cpus", "tfgrpc_cpus (ini)"])
def test_plugin_refuses_a_bad_placement_naming_where_it_came_from(
    pytester: pytest.Pytester, value: str, fault: str, source: str
) -> None:
    pytester.makepyfile("def test_x(tfgrpc):\n    pass\n")
    # In this process: a refused placement pins nothing (a process of its own costs a second).
    before = os.sched_getaffinity(0)
    if source.startswith("--"):
        result = pytester.runpytest(f"--tfgrpc-cpus={value}")
    else:
        pytester.makeini(f"[pytest]\ntfgrpc_cpus = {value}\n")
        result = pytester.runpytest()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {source}: *{fault}*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert os.sched_getaffinity(0) == before


def _header_of(value: str) -> str:
    placed = resolve_placement(value)
    return f"*P2P CPUs {placed.describe() if placed else 'unpinned'}"


@pytest.mark.parametrize(
    ("ini", "args", "expected"),
    [
        # An empty value is no value, as for the other tfgrpc options.
        ("tfgrpc_cpus =", (), "auto"),
        ("tfgrpc_cpus =   ", (), "auto"),
        (None, ("--tfgrpc-cpus=",), "auto"),
        (None, ("--tfgrpc-cpus= ",), "auto"),
        ("tfgrpc_cpus = off", ("--tfgrpc-cpus=",), "off"),  # the ini file's, then
        ("tfgrpc_cpus = fast", ("--tfgrpc-cpus=off",), "off"),  # the command line wins
    ],
)
def test_an_empty_placement_is_no_placement_given(
    pytester: pytest.Pytester, ini: str | None, args: tuple[str, ...], expected: str
) -> None:
    pytester.makepyfile("def test_x(tfgrpc):\n    pass\n")
    if ini is not None:
        pytester.makeini(f"[pytest]\n{ini}\n")
    before = os.sched_getaffinity(0)
    result = pytester.runpytest(*args)  # in this process: a test that measures nothing pins nothing
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([_header_of(expected)])
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize(
    ("old", "new"),
    [("client 0, server 1", "unpinned"), ("unpinned", "client 0-3, server 4-7"), (None, "x")],
)
def test_a_placement_differing_from_the_baselines_is_a_setup_mismatch(
    old: str | None, new: str
) -> None:
    from pytest_tfgrpc.report.junit import Baseline
    from pytest_tfgrpc.report.record import Key, Measurement
    from pytest_tfgrpc.report.setup_check import check_metadata

    key = Key("t", "lo", "p2p_latency", "1KiB")
    meta = {"host": "n1", **({"cpu_placement": old} if old else {})}
    base = Baseline("a.xml", {key: Measurement(key, {})}, meta)
    (mismatch,) = check_metadata(base, {"host": "n1", "cpu_placement": new}, ["lo"])
    assert (
        mismatch.describe() == f"cpu_placement: baseline {old or '(not recorded)'}, current {new}"
    )
    assert check_metadata(base, meta, ["lo"]) == ()


@needs_two_cpus
def test_a_server_a_suite_started_itself_is_pinned_when_measured_and_no_other_process(
    placement: CpuPlacement, child: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A suite's own fixture (ServerProcess.start) leaves its server to the scheduler: the
    # driver pins it before measuring, when it is a child of this process.
    assert cpus.pin_child_server(child.pid) is True
    threads = os.listdir(f"/proc/{child.pid}/task")
    assert all(_cpus_of_thread(int(t)) == placement.server for t in threads)
    assert cpus.result_placement(child.pid)["cpu_placement"] == placement.describe()
    cpus.release_server(child.pid)
    # Never a process that is not ours to place: this process's parent, init, a bad pid.
    tried: list[object] = []

    def recorded(pid: object, **kw: object) -> bool:
        tried.append(pid)
        return True

    monkeypatch.setattr(cpus, "pin_server", recorded)
    for pid in (os.getppid(), 1, os.getpid(), None, -3, True, 99_999_999):
        assert cpus.pin_child_server(pid) is False, pid
    assert tried == []
