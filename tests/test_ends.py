"""Where a result's figures came from: the ends of P2P and PS results."""

from __future__ import annotations

import socket
from types import SimpleNamespace

from pytest_tfgrpc.bench.ends import cluster_ends, p2p_ends, source_address
from pytest_tfgrpc.report.record import read_record, result_properties
from pytest_tfgrpc.results import BenchmarkResult, End
from pytest_tfgrpc.roles.processes import LOCAL


def test_the_source_address_is_the_routes_choice() -> None:
    assert source_address("127.0.0.1") == "127.0.0.1"
    assert source_address("::1") == "::1"
    assert source_address("not an address") == "not an address"


def test_p2p_ends_name_the_agents_host_or_this_one() -> None:
    agent = SimpleNamespace(launcher=SimpleNamespace(host="node7", address="127.0.0.1"))
    client, server = p2p_ends(agent, "127.0.0.1:5000")
    assert client == End("client", socket.gethostname(), "127.0.0.1")
    assert server == End("server", "node7", "127.0.0.1")
    local = SimpleNamespace(launcher=LOCAL)
    assert p2p_ends(local, "[::1]:5000")[1] == End("server", socket.gethostname(), "::1")
    # A cluster spec's server: nothing here started it, its address is all that is known.
    assert p2p_ends(SimpleNamespace(), "127.0.0.1:9")[1].describe() == "server=127.0.0.1@127.0.0.1"


def test_cluster_ends_list_every_ps_task_and_worker() -> None:
    remote = SimpleNamespace(host="w0", address="198.18.0.3")
    cluster = SimpleNamespace(
        fabric=SimpleNamespace(address="127.0.0.1"),
        ps=[SimpleNamespace(target="127.0.0.1:7000", launcher=LOCAL)],
        workers=[SimpleNamespace(launcher=remote), SimpleNamespace(launcher=LOCAL)],
    )
    here = socket.gethostname()
    assert [e.describe() for e in cluster_ends(cluster)] == [
        f"ps0={here}@127.0.0.1",
        "worker0=w0@198.18.0.3",
        f"worker1={here}@127.0.0.1",
    ]


def test_ends_are_written_and_read_back_through_the_record() -> None:
    ends = (End("client", "here", "127.0.0.1"), End("server", "node7", "198.18.0.2"))
    result = BenchmarkResult(
        "p2p_latency", "echo", "lo", "198.18.0.2:5000", "raw", "unary", (), ends=ends
    )
    props = dict(result_properties(result))
    assert props["tfgrpc.echo.ends"] == "client=here@127.0.0.1 server=node7@198.18.0.2"
    assert read_record("t", list(props.items())).labels["echo"].ends == ends
