"""A port held for a process that binds it later: how TensorFlow's tasks get their ports.

A ``tf.distribute.Server`` task must know every task's ``host:port`` before any task starts
(the cluster spec), and it binds its own port itself, by number. So the port is picked first
and bound later, by another process: a race with anything else that binds a port meanwhile.

:class:`PortReservation` closes that race for every port the kernel hands out: it binds a
socket to the address and a port the kernel picks (``SO_REUSEADDR``, never listening) and
holds it while the task starts and runs. The kernel gives a held port to no other ``bind`` to
port 0 and to no outgoing connection, so only a process that asks for that very port number
could take it; the task itself can, because gRPC's listeners set ``SO_REUSEADDR`` too and the
held socket does not listen (Linux's bind-conflict rule). Should another process take the
port first all the same, the task fails to bind and says so, and the start fails naming it.
"""

from __future__ import annotations

import socket

__all__ = ["PortReservation"]


class PortReservation:
    """A port of ``address`` (an IPv4 or IPv6 address, ``%zone`` allowed) held until
    :meth:`release`; ``port`` is its number, ``host_port`` the ``host:port`` a cluster spec
    names. OSError when ``address`` is not one of this host's."""

    def __init__(self, address: str) -> None:
        bare, _, zone = address.partition("%")
        family = socket.AF_INET6 if ":" in bare else socket.AF_INET
        self.address = bare
        self._sock: socket.socket | None = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                scope = socket.if_nametoindex(zone) if zone else 0
                self._sock.bind((bare, 0, 0, scope))
            else:
                self._sock.bind((bare, 0))
        except BaseException:
            self._sock.close()
            raise
        self.port: int = self._sock.getsockname()[1]

    @property
    def host_port(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"{host}:{self.port}"

    def release(self) -> None:
        """Stop holding the port (a second call does nothing)."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def __repr__(self) -> str:
        return f"<PortReservation {self.host_port}{'' if self._sock else ' released'}>"
