"""The summary and the HTML report of a real run with two engines on two fabrics (loopback and
a veth link) and a PS test: each engine's fabrics side by side, best and worst marked, the
engines beside each other with their ratio, and each PS task's load with the slowest marked."""

from __future__ import annotations

import re

import pytest
from conftest import QUICK
from netns import VethLink
from test_record import TableText

CONFTEST = """
import grpc

from pytest_tfgrpc import Engine, Measured, ServerProcess


class BareEcho(Engine):
    '''The plugin's tensor server, held back 3 ms a reply off loopback, measured by a bare
    grpcio client.'''

    name = "bare"

    def start_server(self, provision):
        delay = [] if provision.fabric.name == "lo" else ["--delay", "3ms"]
        return ServerProcess.start(provision.fabric, env=provision.env, extra_args=delay)

    def echo(self, server, tensor, *, mode, rpc, run):
        channel = grpc.insecure_channel(server.target)
        try:
            echo = channel.unary_unary("/tfgrpc.RawTensorService/Echo")
            return Measured.timed(lambda: echo(tensor.content), run)
        finally:
            channel.close()


def pytest_tfgrpc_add_engines(registry):
    registry.add(BareEcho())
"""

SUITE = """
import pytest

@pytest.mark.tfgrpc_engines("grpcio", "bare", server="bare")
@pytest.mark.message_profile(["1KiB"])
def test_echo(tfgrpc, tensor_server):
    tfgrpc.p2p_latency(tensor_server)

@pytest.mark.message_profile("resnet50", scale=0.01)
@pytest.mark.ps_topology(ps=2, workers=1)
def test_ps(tfgrpc, ps_cluster):
    tfgrpc.ps_throughput(ps_cluster)
"""


def test_two_engines_on_two_fabrics_and_ps_tasks_in_the_summary_and_html(
    pytester: pytest.Pytester, link: VethLink
) -> None:
    veth = link.root_if
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_views=SUITE)
    html = pytester.path / "report.html"
    result = pytester.runpytest_subprocess(
        *QUICK, f"--fabric=lo,{veth}", f"--tfgrpc-html={html}", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=6)
    summary = result.stdout.str().split("= tfgrpc =", 1)[1].splitlines()
    start = next(i for i, line in enumerate(summary) if line.startswith("test_views.py::test_echo"))
    echo = [line.split() for line in summary[start : start + 6]]
    # one group: each engine's fabrics side by side, then the engines' ratio per fabric
    assert echo[0][:5] == ["test_views.py::test_echo", "p2p_latency", "1KiB", "grpcio", "lo"]
    assert [row[:2] for row in echo[1:6]] == [
        ["grpcio", veth], ["bare", "lo"], ["bare", veth], ["grpcio/bare", "lo"],
        ["grpcio/bare", veth],
    ]  # fmt: skip
    # the veth fabric's server is 3 ms slower a reply: worst for both engines' clients
    assert [row[-1] for row in echo[:4]] == ["best", "worst", "best", "worst"]
    for row in echo[4:6]:
        assert re.fullmatch(r"x[0-9.e+-]+", row[2]), row
    header = next(line for line in summary if line.startswith("test "))
    assert header.split()[:5] == ["test", "benchmark", "size", "engine", "fabric"]
    # the PS test's tasks, each fabric's with one marked slowest (the placement's busiest)
    at = summary.index("PS load per task:")
    loads = [line.split() for line in summary[at + 2 : at + 6]]
    assert [row[0].startswith("test_views.py::test_ps") for row in loads] == [1, 0, 1, 0]
    tasks = [row[4] if len(row) > 7 else row[0] for row in loads]
    assert tasks == ["ps0", "ps1", "ps0", "ps1"]
    assert sum(row[-1] == "slowest" for row in loads) == 2
    # the HTML shows the same
    page = TableText()
    page.feed(html.read_text())
    assert [h for h in page.headers if " on " in h][:6] == [
        "grpcio on lo", f"grpcio on {veth}", "bare on lo", f"bare on {veth}",
        "grpcio/bare on lo", f"grpcio/bare on {veth}",
    ]  # fmt: skip
    marks = [cell.split()[-1] for cell in page.cells if cell.endswith(("best", "worst"))]
    assert marks[:4] == ["best", "worst", "best", "worst"]  # test_echo's table comes first
    assert sum(cell.endswith(" slowest") for cell in page.cells) == 2
    assert html.read_text().count("PS load per task") == 2
