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

__all__ = ["EmulatedHosts", "tfgrpc_emulated_hosts"]


@dataclass(frozen=True)
class EmulatedHosts:
    """A built fabric with an agent in every host; ``token_file`` holds the agents' token."""

    fabric: EmulatedFabric
    agents: dict[str, HostAgent]
    token_file: str

    @property
    def token(self) -> str:
        return Path(self.token_file).read_text().strip()

    def agent_targets(self, names: Sequence[str] | None = None) -> list[str]:
        """``address:port`` of the agents of ``names`` (default: every host, in order)."""
        chosen = names if names is not None else [h.name for h in self.fabric.hosts]
        return [self.agents[name].target for name in chosen]

    def pytest_args(self, names: Sequence[str] | None = None) -> list[str]:
        """Options that make a pytest run (the driver, here) use these hosts' agents."""
        return [
            f"--fabric={self.fabric.bridge}",
            f"--tfgrpc-agents={','.join(self.agent_targets(names))}",
            f"--tfgrpc-agent-token-file={self.token_file}",
        ]


@pytest.fixture
def tfgrpc_emulated_hosts(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., EmulatedHosts]]:
    """A factory: ``build("ps0,ps1@200mbit,w0", rate="1gbit", agents=True)`` builds the hosts
    (``name[@rate]`` or a count), each link capped at its rate or ``rate``; removed with
    everything in them when the test ends. Skips the test where fabrics cannot be built."""
    # Imported here: registered in every run, this module costs nothing until used.
    from pytest_tfgrpc.hosts.emulated import HostAgent, can_build, emulated_fabric, parse_hosts

    ok, why = can_build()
    if not ok:
        pytest.skip(why)
    with contextlib.ExitStack() as stack:

        def build(hosts: str, *, rate: str | None = None, agents: bool = True) -> EmulatedHosts:
            fabric = stack.enter_context(emulated_fabric(parse_hosts(hosts, rate)))
            token_file = tmp_path_factory.mktemp("agent-token") / "token"
            token_file.write_text(secrets.token_hex(24) + "\n")
            token_file.chmod(0o600)
            started: dict[str, HostAgent] = {}
            if agents:
                for host in fabric.hosts:
                    started[host.name] = HostAgent(host, str(token_file))
                    stack.callback(started[host.name].stop)
            return EmulatedHosts(fabric, started, str(token_file))

        yield build
