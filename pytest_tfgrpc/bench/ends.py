"""Where a result's figures came from: the host and address of each end of what it measured.

A P2P result has two ends: the client (this host: the driver measures) and the server (here,
on an agent's host, or a cluster spec's task). A PS result has one end per PS task and per
worker. Hosts are the names their agents report (``tfgrpc-node --host-name``), this host's
name for what runs here, and the address itself for a server nothing here started.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TypeVar

from pytest_tfgrpc.results import BenchmarkResult, End

__all__ = ["cluster_ends", "p2p_ends", "source_address", "with_ends"]

R = TypeVar("R", bound=BenchmarkResult)


def _address_of(target: str) -> str:
    """The address part of ``host:port`` (``[v6]:port`` and ``v6%zone`` kept as they are)."""
    host = target.rsplit(":", 1)[0] if ":" in target else target
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def source_address(address: str) -> str:
    """The address this host's traffic to ``address`` leaves from (the kernel's route choice;
    no packet is sent); ``address`` itself if there is no route or it is not an address."""
    bare, _, zone = address.partition("%")
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    with contextlib.suppress(OSError, ValueError), socket.socket(family, socket.SOCK_DGRAM) as s:
        if family == socket.AF_INET6:
            scope = socket.if_nametoindex(zone) if zone else 0
            s.connect((bare, 9, 0, scope))
        else:
            s.connect((bare, 9))
        return str(s.getsockname()[0]).split("%")[0]
    return bare


def _host_of(handle: Any) -> str | None:
    """The host a handle's process runs on: its agent's name, this host's for a local one,
    None when nothing here started it."""
    launcher = getattr(handle, "launcher", None)
    if launcher is None:
        return None
    host = getattr(launcher, "host", None)
    return socket.gethostname() if host in (None, "local") else str(host)


def p2p_ends(server: Any, target: str) -> tuple[End, End]:
    """Client (this host, its source address toward ``target``) and server (``server``'s
    host, ``target``'s address)."""
    address = _address_of(target)
    host = _host_of(server) or str(getattr(server, "host", "") or address)
    return (
        End("client", socket.gethostname(), source_address(address)),
        End("server", host, address),
    )


def cluster_ends(cluster: Any) -> tuple[End, ...]:
    """Every PS task (its target's address) and worker (its host's fabric address) of a PS
    cluster; empty for a cluster that does not say where its processes run."""
    ps: Sequence[Any] = getattr(cluster, "ps", ())
    workers: Sequence[Any] = getattr(cluster, "workers", ())
    fabric = getattr(cluster, "fabric", None)
    ends = []
    for i, task in enumerate(ps):
        address = _address_of(str(getattr(task, "target", "")))
        ends.append(End(f"ps{i}", _host_of(task) or address, address))
    for j, worker in enumerate(workers):
        launcher = getattr(worker, "launcher", None)
        address = getattr(launcher, "address", None) or getattr(fabric, "address", "") or "?"
        ends.append(End(f"worker{j}", _host_of(worker) or "?", str(address)))
    return tuple(ends)


def with_ends(result: R, ends: tuple[End, ...]) -> R:
    """``result`` with ``ends``, unless it records its own already."""
    return result if result.ends or not ends else replace(result, ends=ends)
