"""Hosts by name: every address a name resolves to, and a name that does not resolve yet.

A host named in ``--tfgrpc-agents`` may resolve to several addresses (``localhost``: ``::1``
and ``127.0.0.1``; a dual-stack node: its IPv6 and IPv4 addresses), and the one a service
listens on need not be the first. A name may also not resolve yet: a Kubernetes headless
service is published in DNS only once its pod is ready, as an agent started with the driver
may not listen yet. :func:`listening_address` waits for both within one bound.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

__all__ = ["HostNotReached", "Resolver", "listening_address", "system_addresses"]

#: ``(host, port) -> addresses`` in the order to try them; raises OSError (``socket.gaierror``)
#: for a name that does not resolve.
Resolver = Callable[[str, int], Sequence[str]]

#: How long one connection attempt may take, and the pause between rounds.
_CONNECT_S = 1.0
_PAUSE_S = 0.2


class HostNotReached(OSError):
    """A name that did not resolve, or none of whose addresses accepted a connection, within
    the bound."""


def system_addresses(host: str, port: int) -> tuple[str, ...]:
    """Every address ``host`` resolves to (``getaddrinfo``), each once, in its order."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return tuple(dict.fromkeys(str(info[4][0]) for info in infos))


def listening_address(
    host: str, port: int, timeout: float, *, resolver: Resolver = system_addresses
) -> str:
    """The first address of ``host`` (by ``resolver``) that accepts a TCP connection on
    ``port``, trying every one in turn and, until ``timeout`` s have passed, resolving and
    trying again: a name that does not resolve yet and a service that does not listen yet are
    waited for alike. Raises :class:`HostNotReached` naming the host, the addresses tried and
    why each failed (or why the name did not resolve)."""
    deadline = time.monotonic() + timeout
    while True:
        failures: dict[str, str] = {}
        try:
            addresses = tuple(resolver(host, port))
        except (OSError, UnicodeError) as exc:
            unresolved = f"{host!r} does not resolve: {exc}"
            addresses = ()
        else:
            unresolved = f"{host!r} resolves to no address"
        for address in addresses:
            remaining = deadline - time.monotonic()
            try:
                with socket.create_connection(
                    (address, port), timeout=max(0.05, min(_CONNECT_S, remaining))
                ):
                    return address
            except OSError as exc:
                failures[address] = exc.strerror or type(exc).__name__
        if time.monotonic() + _PAUSE_S >= deadline:
            break
        time.sleep(_PAUSE_S)
    if not failures:
        raise HostNotReached(f"{unresolved} (waited {timeout:g} s)")
    tried = "; ".join(f"{address}: {why}" for address, why in failures.items())
    raise HostNotReached(
        f"no address of {host} accepted a connection on port {port} within {timeout:g} s ({tried})"
    )
