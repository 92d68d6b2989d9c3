"""SLURM allocations as the plugin sees them: the nodes of a job step, and an agent on each.

Inside ``srun`` or ``sbatch``, SLURM describes the allocation in the environment:
``SLURM_JOB_NODELIST`` (a hostlist such as ``node[01-03,07]``; ``SLURM_NODELIST`` in older
releases), ``SLURM_TASKS_PER_NODE`` (``2(x3),1``: two tasks on each of three nodes, then one),
and ``SLURMD_NODENAME`` (the node this process runs on). Hostlists are expanded with
`python-hostlist <https://pypi.org/project/python-hostlist/>`_, the parser SLURM sites use.

The docs' ``srun`` recipe runs one ``tfgrpc-node`` per node and pytest on the first;
with ``--tfgrpc-agents=slurm`` the driver then uses every other node's agent, at
``TFGRPC_AGENT_PORT`` (default :data:`~pytest_tfgrpc.hosts.agent.DEFAULT_PORT`).
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

import hostlist

from pytest_tfgrpc.hosts.agent import DEFAULT_PORT

__all__ = ["PORT_ENV", "SlurmAllocation", "SlurmError", "agent_addresses", "slurm_allocation"]

PORT_ENV = "TFGRPC_AGENT_PORT"


class SlurmError(ValueError):
    """SLURM's environment cannot be read; the message names the variable and its value."""


@dataclass(frozen=True)
class SlurmAllocation:
    """The nodes of the allocation, in SLURM's order, tasks per node, and this node."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]
    this_node: str

    @property
    def peers(self) -> tuple[str, ...]:
        """Every node but this one (where pytest, the driver, runs)."""
        return tuple(node for node in self.nodes if node != self.this_node)


def expand_nodelist(text: str, variable: str = "SLURM_JOB_NODELIST") -> tuple[str, ...]:
    """``node[01-03,07]`` -> ``("node01", "node02", "node03", "node07")``; zero padding and
    several bracket groups (``r[1-2]n[01-02]``) as SLURM writes them. SlurmError otherwise."""
    try:
        nodes = tuple(hostlist.expand_hostlist(text.strip()))
    except hostlist.BadHostlist as exc:
        raise SlurmError(f"{variable}={text!r} is not a SLURM hostlist: {exc}") from None
    if not nodes:
        raise SlurmError(f"{variable}={text!r} names no node")
    return nodes


def expand_tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> tuple[int, ...]:
    """``2(x3),1`` -> ``(2, 2, 2, 1)``. SlurmError otherwise."""
    try:
        counts = tuple(int(n) for n in hostlist.parse_slurm_tasks_per_node(text.strip()))
    except (ValueError, TypeError, AttributeError, hostlist.BadHostlist) as exc:
        raise SlurmError(f"{variable}={text!r} is not SLURM's tasks-per-node form: {exc}") from None
    if not counts or any(n < 0 for n in counts):
        raise SlurmError(f"{variable}={text!r} is not SLURM's tasks-per-node form")
    return counts


def slurm_allocation(environ: Mapping[str, str]) -> SlurmAllocation | None:
    """The allocation described by ``environ``, or None outside SLURM (no node list)."""
    variable = "SLURM_JOB_NODELIST" if "SLURM_JOB_NODELIST" in environ else "SLURM_NODELIST"
    text = environ.get(variable, "")
    if not text.strip():
        return None
    nodes = expand_nodelist(text, variable)
    tasks_text = environ.get("SLURM_TASKS_PER_NODE", "")
    tasks = expand_tasks_per_node(tasks_text) if tasks_text.strip() else (1,) * len(nodes)
    if len(tasks) != len(nodes):
        raise SlurmError(
            f"SLURM_TASKS_PER_NODE={tasks_text!r} gives {len(tasks)} nodes, but"
            f" {variable}={text!r} names {len(nodes)}"
        )
    this_node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return SlurmAllocation(
        job_id=environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID", "")),
        nodes=nodes,
        tasks_per_node=tasks,
        this_node=this_node,
    )


def agent_addresses(environ: Mapping[str, str]) -> tuple[str, ...]:
    """``node:port`` of the agent on every node of the allocation but this one.

    SlurmError outside SLURM, with a bad port, or when no other node is left.
    """
    allocation = slurm_allocation(environ)
    if allocation is None:
        raise SlurmError("no SLURM allocation here: SLURM_JOB_NODELIST is not set")
    port_text = environ.get(PORT_ENV, str(DEFAULT_PORT))
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise SlurmError(f"{PORT_ENV}={port_text!r} is not a port from 1 to 65535")
    peers = allocation.peers
    if not peers:
        raise SlurmError(
            f"the allocation has no node besides this one ({allocation.this_node}):"
            " ask for at least two nodes"
        )
    return tuple(f"{node}:{port_text}" for node in peers)
