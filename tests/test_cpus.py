"""CPU placement (--tfgrpc-cpus): parsing, the auto split by core, pinning threads and
processes, and the plugin end to end (the server's CPUs, the recorded placement, bad values)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_tfgrpc.servers import cpus
from pytest_tfgrpc.servers.cpus import (
    CpuError,
    CpuPlacement,
    format_cpu_list,
    measuring_cpus,
    parse_cpu_list,
    pin_process,
    resolve_placement,
)

SERVER = (sys.executable, "-m", "pytest_tfgrpc.servers.tensor_server")
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
    [("", "empty"), ("a", "'a' is not"), ("3-1", "'3-1' is not a CPU range"), ("-1", "'-1'")],
)
def test_bad_cpu_lists_name_the_part_at_fault(text: str, fault: str) -> None:
    with pytest.raises(CpuError, match=fault):
        parse_cpu_list(text)


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
    ("value", "fault"),
    [
        ("0", "'0' is not a placement: auto, off or CLIENT:SERVER"),
        ("0:", "the server CPUs: an empty CPU list"),
        (":1", "the client CPUs: an empty CPU list"),
        ("0:9", "the server CPUs 9 are not among the CPUs this process may use"),
        ("x:1", "the client CPUs: 'x' is not a CPU number"),
        ("0:1-0", "the server CPUs: '1-0' is not a CPU range"),
        ("automatic", "not a placement"),
    ],
)
def test_bad_placements_name_the_value_and_side(value: str, fault: str) -> None:
    with pytest.raises(CpuError, match=fault):
        resolve_placement(value, frozenset({0, 1}))


def _cpus_of_thread(tid: int) -> frozenset[int]:
    return frozenset(os.sched_getaffinity(tid))


@needs_two_cpus
def test_measuring_pins_every_thread_and_gives_each_its_cpus_back(
    placement: CpuPlacement,
) -> None:
    started = threading.Event()
    stop = threading.Event()
    seen: dict[str, frozenset[int]] = {}

    def idle() -> None:
        seen["tid"] = frozenset({threading.get_native_id()})
        started.set()
        stop.wait(10)

    before = threading.Thread(target=idle)
    before.start()
    started.wait(10)
    (tid,) = seen["tid"]
    try:
        with measuring_cpus():
            assert _cpus_of_thread(0) == placement.client
            assert _cpus_of_thread(tid) == placement.client  # a thread that was there
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
        assert _cpus_of_thread(tid) == ALLOWED
    finally:
        stop.set()
        before.join(10)


def test_measuring_without_a_placement_changes_nothing() -> None:
    cpus.use_placement(None)
    with measuring_cpus():
        assert _cpus_of_thread(0) == ALLOWED
    assert cpus.placement_setting() == {"cpu_placement": "unpinned"}


@needs_two_cpus
def test_a_process_is_pinned_thread_by_thread() -> None:
    code = (
        "import threading, time, sys\n"
        "threading.Thread(target=time.sleep, args=(30,), daemon=True).start()\n"
        "print('ready', flush=True); sys.stdin.read()\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        server_cpu = frozenset({max(ALLOWED)})
        pin_process(child.pid, server_cpu)
        threads = os.listdir(f"/proc/{child.pid}/task")
        assert len(threads) >= 2
        assert all(_cpus_of_thread(int(t)) == server_cpu for t in threads)
    finally:
        child.kill()
        child.wait(10)
    with pytest.raises(ProcessLookupError):
        pin_process(child.pid, frozenset({0}))


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


@pytest.mark.parametrize("value", ["abc", "0:99", "9999", "", "2-1"])
def test_tfgrpc_server_refuses_bad_cpus(value: str) -> None:
    done = subprocess.run(
        [*SERVER, "--cpus", value],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert f"--cpus {value}:" in done.stderr


PINNED_TEST = """
import os, pathlib

def _allowed(pid):
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()

def test_pinned(tfgrpc, tensor_server):
    before = os.sched_getaffinity(0)
    result = tfgrpc.p2p_latency(tensor_server, ["1KiB"], iterations=20, warmup=2)
    assert os.sched_getaffinity(0) == before  # the client's CPUs are given back
    print("SERVER", _allowed(tensor_server.pid))
    print("RECORDED", result.settings["cpu_placement"])
"""


@needs_two_cpus
def test_plugin_pins_the_server_and_records_the_placement(pytester: pytest.Pytester) -> None:
    first, second = sorted(ALLOWED)[:2]
    pytester.makepyfile(PINNED_TEST)
    junit = pytester.path / "run.xml"
    result = pytester.runpytest_subprocess(
        "-s", f"--tfgrpc-cpus={first}:{second}", f"--junitxml={junit}"
    )
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        [f"*P2P CPUs client {first}, server {second}*", f"*SERVER {second}", "RECORDED client *"]
    )
    xml = junit.read_text()
    assert f'name="tfgrpc.meta.cpu_placement" value="client {first}, server {second}"' in xml


@needs_two_cpus
def test_plugin_off_leaves_the_server_unpinned(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(PINNED_TEST)
    result = pytester.runpytest_subprocess("-s", "--tfgrpc-cpus=off")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*P2P CPUs unpinned*", f"*SERVER {format_cpu_list(ALLOWED)}", "RECORDED unpinned"]
    )


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        ("0:999", "the server CPUs 999 are not among"),
        ("fast", "'fast' is not a placement"),
        ("0-:1", "the client CPUs: '0-' is not a CPU number"),
    ],
)
def test_plugin_refuses_a_bad_placement_naming_the_option(
    pytester: pytest.Pytester, value: str, fault: str
) -> None:
    pytester.makepyfile(PINNED_TEST)
    result = pytester.runpytest_subprocess(f"--tfgrpc-cpus={value}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: --tfgrpc-cpus: *{fault}*"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()


@pytest.mark.parametrize(
    ("old", "new"),
    [("client 0, server 1", "unpinned"), ("unpinned", "client 0-3, server 4-7"), (None, "x")],
)
def test_a_placement_differing_from_the_baselines_is_a_setup_mismatch(
    old: str | None, new: str
) -> None:
    from pytest_tfgrpc.report.junit import Baseline, Key, Measurement
    from pytest_tfgrpc.report.setup_check import check_metadata

    key = Key("t", "lo", "p2p_latency", "1KiB")
    meta = {"host": "n1", **({"cpu_placement": old} if old else {})}
    base = Baseline("a.xml", {key: Measurement(key, {})}, meta)
    (mismatch,) = check_metadata(base, {"host": "n1", "cpu_placement": new}, ["lo"])
    assert (
        mismatch.describe() == f"cpu_placement: baseline {old or '(not recorded)'}, current {new}"
    )
    assert check_metadata(base, meta, ["lo"]) == ()
