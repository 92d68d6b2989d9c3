"""The ``tfgrpc_emulated_hosts`` fixture: a cluster on one machine, an agent in every host.

::

    def test_slow_ps(tfgrpc_emulated_hosts, pytester):
        hosts = tfgrpc_emulated_hosts("ps0@200mbit,ps1,w0,w1", rate="1gbit")
        result = pytester.runpytest(*hosts.pytest_args(), ...)

Each call builds an emulated fabric (:mod:`pytest_tfgrpc.hosts.emulated`), starts
``tfgrpc-node`` in every host with a fresh token, and removes everything (processes,
namespaces, links) when the test ends, whatever ends it. Without root, the test is skipped
with the reason. Registered in every run (pytest must know the fixture to collect), it imports
the emulation machinery only when a test requests it, and does not wake the rest of the plugin.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pytest_tfgrpc.hosts.emulated import EmulatedFabric, HostAgent
    from pytest_tfgrpc.wire.security import TlsFiles

__all__ = ["EmulatedHosts", "build_emulated_hosts", "tfgrpc_emulated_hosts"]


@dataclass(frozen=True)
class EmulatedHosts:
    """A built fabric with an agent in every host; ``token_file`` holds the agents' token.
    ``tls``: the driver's certificate, key and CA when the hosts were built with TLS (each
    agent then has a certificate of its own, for its own address, from that CA)."""

    fabric: EmulatedFabric
    agents: dict[str, HostAgent]
    token_file: str
    tls: TlsFiles | None = None

    @property
    def token(self) -> str:
        return Path(self.token_file).read_text().strip()

    def agent_targets(self, names: Sequence[str] | None = None) -> list[str]:
        """``address:port`` of the agents of ``names`` (default: every host, in order)."""
        chosen = names if names is not None else [h.name for h in self.fabric.hosts]
        return [self.agents[name].target for name in chosen]

    def pytest_args(self, names: Sequence[str] | None = None) -> list[str]:
        """Options that make a pytest run (the driver, here) use these hosts' agents."""
        args = [
            f"--fabric={self.fabric.bridge}",
            f"--tfgrpc-agents={','.join(self.agent_targets(names))}",
            f"--tfgrpc-agent-token-file={self.token_file}",
        ]
        if self.tls is not None:  # the run's TLS; its CA verifies the agents too
            args += [f"--tfgrpc-tls-{k}={getattr(self.tls, k)}" for k in ("cert", "key", "ca")]
        return args


def _issue(fabric: EmulatedFabric, where: Path) -> dict[str, TlsFiles]:
    """A CA, and a certificate for each host's address (and the driver's) that it signed."""
    pytest.importorskip("trustme", reason="tls=True needs trustme (the dev extra)")
    from pytest_tfgrpc.hosts.emulated import issue_certificates

    return issue_certificates(fabric, where)


def build_emulated_hosts(
    stack: contextlib.ExitStack,
    tmp_path_factory: pytest.TempPathFactory,
    hosts: str,
    *,
    rate: str | None = None,
    agents: bool = True,
    tls: bool = False,
    agent_args: Sequence[str] = (),
) -> EmulatedHosts:
    """Build ``hosts`` as :func:`tfgrpc_emulated_hosts` does, removed when ``stack`` closes (a
    fixture of wider scope than a test builds its hosts with this). Skips the calling test
    where fabrics cannot be built. ``agent_args``: more options of every host's
    ``tfgrpc-node`` (``--tf-python PATH``)."""
    # Imported here: registered in every run, this module costs nothing until used.
    from pytest_tfgrpc.hosts.emulated import HostAgent, can_build, emulated_fabric, parse_hosts

    ok, why = can_build()
    if not ok:
        pytest.skip(why)
    fabric = stack.enter_context(emulated_fabric(parse_hosts(hosts, rate)))
    token_file = tmp_path_factory.mktemp("agent-token") / "token"
    token_file.write_text(secrets.token_hex(24) + "\n")
    token_file.chmod(0o600)
    pki = _issue(fabric, tmp_path_factory.mktemp("pki")) if tls else None
    started: dict[str, HostAgent] = {}
    if agents:
        for host in fabric.hosts:
            extra = list(agent_args)
            if pki is not None:  # the host's own identity, for its agent and roles
                own = pki[host.name]
                extra += [f"--tls-{k}={getattr(own, k)}" for k in ("cert", "key", "ca")]
            started[host.name] = HostAgent(host, str(token_file), extra_args=extra)
            stack.callback(started[host.name].stop)
    driver = pki["_driver"] if pki is not None else None
    return EmulatedHosts(fabric, started, str(token_file), driver)


@pytest.fixture
def tfgrpc_emulated_hosts(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EmulatedHosts]]:
    """A factory: ``build("ps0,ps1@200mbit,w0", rate="1gbit", agents=True)`` builds the hosts
    (``name[@rate]`` or a count), each link capped at its rate or ``rate``; removed with
    everything in them when the test ends. Skips the test where fabrics cannot be built.
    ``tls=True`` gives every host and the driver a certificate for its own address from one
    fresh CA (trustme, the ``dev`` extra): the agents and the roles they start serve mutual
    TLS, and :meth:`EmulatedHosts.pytest_args` hands the run the driver's files.
    ``agent_args``: more options of every agent (``agent_args=["--tf-python", PATH]``)."""
    with contextlib.ExitStack() as stack:

        def build(
            hosts: str,
            *,
            rate: str | None = None,
            agents: bool = True,
            tls: bool = False,
            agent_args: Sequence[str] = (),
        ) -> EmulatedHosts:
            return build_emulated_hosts(
                stack,
                tmp_path_factory,
                hosts,
                rate=rate,
                agents=agents,
                tls=tls,
                agent_args=agent_args,
            )

        yield build
