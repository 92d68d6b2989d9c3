"""Transport telemetry across an emulated link: loss, a link's rate, the gate's context."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from test_emulated import properties

from pytest_tfgrpc import native
from pytest_tfgrpc.plugin.emulated import EmulatedHosts

Hosts = Callable[..., EmulatedHosts]

BANDWIDTH_SUITE = """
import pytest

@pytest.mark.message_profile(["{size}"])
def test_bandwidth(tfgrpc, tensor_server):
    tfgrpc.p2p_bandwidth(tensor_server)
"""


def shape(hosts: EmulatedHosts, name: str, *, limit: str, burst: str = "32kb") -> None:
    """Replace both ends' ``tbf`` of host ``name``'s link: 200 Mbit/s, ``limit`` bytes queued."""
    host = hosts.fabric.host(name)
    for prefix, dev in (([], host.link), (["ip", "netns", "exec", host.netns], host.iface)):
        subprocess.run(
            [*prefix, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "200mbit",
             "burst", burst, "limit", limit],
            check=True, timeout=10,
        )  # fmt: skip


def run_bandwidth(
    hosts: EmulatedHosts, pytester: pytest.Pytester, size: str, *args: str, failed: int = 0
) -> tuple[pytest.RunResult, dict[str, str]]:
    """One bandwidth test of ``size`` across ``hosts``: its outcome (``failed`` tests failing,
    by the gate) and its point's JUnit properties."""
    pytester.makepyfile(BANDWIDTH_SUITE.format(size=size))
    xml = pytester.path / "perf.xml"
    result = pytester.runpytest_subprocess(
        "--tfgrpc-iterations=10", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=3",
        *hosts.pytest_args(), f"--junitxml={xml}", *args, timeout=240,
    )  # fmt: skip
    result.assert_outcomes(passed=1 - failed, failed=failed)
    return result, properties(xml)[f"test_bandwidth[{hosts.fabric.bridge}]"]


def test_a_lossy_queue_is_named_as_the_limit_and_quoted_by_the_gate(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester
) -> None:
    """An uncapped link first (the baseline: no queue to overflow), then a tbf queue of 20
    packets at 200 Mbit/s, which drops: the sender retransmits, loss is the limit, and the
    gate fails the test as a regression with the retransmissions quoted beside the
    throughput it lost. Loss makes pushes stall on retransmission timeouts, so the lossy
    rounds vary widely, but every one of them is many times slower than any uncapped one:
    the change is far beyond both the tolerance and the noise, a regression every time.
    (On a busy machine the uncapped link drops a few too, in the receiving namespace's
    backlog: 722 per GB seen once at load 2.6; the queue of 20 drops many times more.)"""
    hosts = tfgrpc_emulated_hosts("lossy")
    point = "tfgrpc.p2p_bandwidth.1MiB"
    # 40 pushes in 10 rounds: enough for the gate to tell the loss's cost from its noise.
    steady = ("--tfgrpc-iterations=40", "--tfgrpc-max-seconds=8")
    _, props = run_bandwidth(hosts, pytester, "1MiB", *steady)
    uncapped = float(props[f"{point}.retransmits_per_MB"])
    (pytester.path / "perf.xml").rename(pytester.path / "base.xml")
    shape(hosts, "lossy", limit="30000")
    result, props = run_bandwidth(
        hosts, pytester, "1MiB", *steady, "--tfgrpc-baseline=base.xml", failed=1
    )
    assert int(props[f"{point}.retransmits"]) > 0
    assert float(props[f"{point}.retransmits_per_MB"]) > 10 * uncapped
    assert props[f"{point}.limit"].startswith("loss-bound: loss_share=")
    assert float(props[f"{point}.link_rate_MBps"]) == 25.0  # the agent's tbf, read there
    result.stdout.re_match_lines(
        [r"regression: .*p2p_bandwidth[ .]1MiB.* throughput: -.*; transport: "
         r"retransmissions [\d,.]+ -> [\d,.]+ per GB.*"]
    )  # fmt: skip


def test_a_deep_queue_runs_at_the_links_rate(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester
) -> None:
    """A queue deeper than TCP's window never drops: no retransmissions, the link's rate."""
    hosts = tfgrpc_emulated_hosts("deep", rate="200mbit")
    shape(hosts, "deep", limit="16mb")
    _, props = run_bandwidth(hosts, pytester, "4MiB")
    point = "tfgrpc.p2p_bandwidth.4MiB"
    assert props[f"{point}.retransmits"] == "0"
    assert 0.9 <= float(props[f"{point}.efficiency"]) <= 1.05, props[f"{point}.efficiency"]
    assert props[f"{point}.limit"].startswith("link-bound: efficiency=")


ENGINE_FAILURES = {
    # DEADLINE_EXCEEDED: "... (transport: after ...)"; a connection that broke mid-call says
    # so: "... INTERNAL: the connection broke mid-call (after ...)".
    "grpcio": r".*stream push of 1048576 B .* failed: .*\((transport: )?after [^;]+; [\d,]+ "
    r"retransmissions, RTT .*",
    # The native client's run ends with its connection: the last reading of it is quoted.
    "native": r".*native client, stream bandwidth of 1048576 B: .*\(transport: after .*; .*\)",
}


@pytest.mark.parametrize("engine", sorted(ENGINE_FAILURES))
def test_a_call_that_breaks_says_what_the_transport_saw(
    tfgrpc_emulated_hosts: Hosts, pytester: pytest.Pytester, engine: str
) -> None:
    """A queue of two packets: the push never completes, and the failure quotes the
    connection's retransmissions and RTT rather than gRPC's silence, for either engine."""
    if engine == "native" and (why := native.unavailable_reason()) is not None:
        pytest.skip(why)
    hosts = tfgrpc_emulated_hosts("broken", rate="200mbit")
    shape(hosts, "broken", limit="3000")
    pytester.makepyfile(BANDWIDTH_SUITE.format(size="1MiB"))
    result = pytester.runpytest_subprocess(
        "--tfgrpc-iterations=4", "--tfgrpc-warmup=1", "--tfgrpc-max-seconds=1",
        "--tfgrpc-warmup-seconds=1", *hosts.pytest_args(), f"--tfgrpc-engines={engine}",
        timeout=240,
    )  # fmt: skip
    result.assert_outcomes(failed=1)
    result.stdout.re_match_lines([ENGINE_FAILURES[engine]])
