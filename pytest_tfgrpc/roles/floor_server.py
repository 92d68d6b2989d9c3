"""The raw-TCP transport floor: what the fabric gives before gRPC adds anything.

A floor server runs in its own process, bound to one address, and answers a tiny protocol. Every
operation starts with a header (op code, payload length) sent in the same buffer as its payload:

- ``ECHO``: the server reads the payload and sends the same bytes back (ping-pong latency);
- ``SINK_ACK``: the server reads the payload, then sends one acknowledgement byte (a push with one
  acknowledgement per tensor, as gRPC push-with-ack does);
- ``SINK``: the server reads the payload and answers nothing; a following ``ACK`` (length 0) asks
  for one acknowledgement byte once everything before it was read (a pure stream).

This module is the server side and the protocol; :class:`FloorServer` starts the server as a
child process through the same machinery as the tensor server
(:class:`~pytest_tfgrpc.roles.processes.ChildProcess`). The measuring client, timed by the
same loops as every gRPC figure, is :mod:`pytest_tfgrpc.bench.floor`.

Run ``python -m pytest_tfgrpc.roles.floor_server --bind HOST`` to serve: it prints one JSON line
``{"port": N, "pid": P}`` once listening, and exits on stdin EOF or SIGTERM. The native engine's
floor, ``tfgrpc-native-floor serve``, is the same server in C++ (``native/src/floor.cc``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import signal
import socket
import struct
import sys
import threading
from collections.abc import Mapping, Sequence

from pytest_tfgrpc.native import FLOOR_NAME, binaries
from pytest_tfgrpc.roles.processes import LOCAL, ChildProcess, Launcher, ServerError

OP_ECHO = 1
OP_SINK_ACK = 2
OP_SINK = 3
OP_ACK = 4

HEADER = struct.Struct("!BQ")
ACK_BYTE = b"\x06"
#: Largest payload one operation may carry (a guard against a corrupt header).
MAX_PAYLOAD = 2**34
#: The sink ops read through a buffer of this size: they never hold a whole tensor.
SINK_CHUNK = 4 * 1024 * 1024


class FloorError(ServerError):
    """The floor server could not start, or answered outside the protocol."""


# --------------------------------------------------------------------------------------------
# Server side (runs in the child process)
# --------------------------------------------------------------------------------------------


def _resolve_bind(host: str, port: int) -> tuple[socket.AddressFamily, tuple[object, ...]]:
    try:
        infos = socket.getaddrinfo(
            host,
            port,
            socket.AF_UNSPEC,
            socket.SOCK_STREAM,
            0,
            socket.AI_NUMERICHOST | socket.AI_PASSIVE,
        )
    except socket.gaierror as exc:
        raise FloorError(
            f"cannot bind to {host!r}: not a numeric IPv4/IPv6 address ({exc})"
        ) from exc
    family, _, _, _, sockaddr = infos[0]
    if ipaddress.ip_address(str(sockaddr[0]).split("%")[0]).is_unspecified:
        raise FloorError(f"refusing to bind to {host!r}: it means all interfaces, name one address")
    return family, tuple(sockaddr)


def listen(host: str, port: int = 0) -> socket.socket:
    """A listening TCP socket on exactly ``host`` (port 0: the OS picks one)."""
    family, sockaddr = _resolve_bind(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(sockaddr)
        sock.listen(16)
    except OSError as exc:
        sock.close()
        raise FloorError(f"cannot bind to {host!r} port {port}: {exc.strerror or exc}") from exc
    return sock


def recv_exact(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; FloorError if the peer closes first."""
    n = len(view)
    got = sock.recv_into(view)
    while got < n:
        if got == 0:
            raise FloorError("peer closed the connection in the middle of a message")
        k = sock.recv_into(view[got:])
        if k == 0:
            raise FloorError("peer closed the connection in the middle of a message")
        got += k


def _serve_connection(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    header = bytearray(HEADER.size)
    hview = memoryview(header)
    buf = bytearray(SINK_CHUNK)
    view = memoryview(buf)
    try:
        while True:
            got = conn.recv_into(hview)
            if got == 0:
                return  # clean close between operations
            if got < HEADER.size:
                recv_exact(conn, hview[got:])
            op, length = HEADER.unpack(header)
            if length > MAX_PAYLOAD:
                return
            if op == OP_ECHO:
                if length > len(buf):
                    buf = bytearray(length)
                    view = memoryview(buf)
                recv_exact(conn, view[:length])
                conn.sendall(view[:length])
            elif op in (OP_SINK_ACK, OP_SINK):
                remaining = length
                while remaining:
                    k = min(remaining, len(buf))
                    recv_exact(conn, view[:k])
                    remaining -= k
                if op == OP_SINK_ACK:
                    conn.sendall(ACK_BYTE)
            elif op == OP_ACK:
                conn.sendall(ACK_BYTE)
            else:
                return  # unknown op: the stream is out of sync, drop it
    except (OSError, FloorError):
        return
    finally:
        conn.close()


def _accept_loop(listener: socket.socket) -> None:
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # listener closed: shutting down
        threading.Thread(target=_serve_connection, args=(conn,), daemon=True).start()


def _on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the floor protocol until stdin reaches EOF or SIGTERM arrives."""
    parser = argparse.ArgumentParser(
        prog="python -m pytest_tfgrpc.roles.floor_server", description=__doc__
    )
    parser.add_argument("--bind", required=True, help="IPv4 or IPv6 address to listen on")
    parser.add_argument("--port", type=int, default=0, help="port (default 0: the OS picks)")
    args = parser.parse_args(argv)
    # The parent shuts us down through stdin; a Ctrl-C to the process group is its business.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        listener = listen(args.bind, args.port)
    except FloorError as exc:
        print(f"floor: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        threading.Thread(target=_accept_loop, args=(listener,), daemon=True).start()
        port = listener.getsockname()[1]
        print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)
        while os.read(0, 4096):
            pass
    finally:
        listener.close()
    return 0


# --------------------------------------------------------------------------------------------
# Process handle (parent side)
# --------------------------------------------------------------------------------------------


class FloorServer(ChildProcess):
    """A floor server process bound to ``host``: ``.port``, ``.address``, ``.pid``.

    Started with :meth:`start`, which returns once it listens; it is tied to this process as
    a tensor server is (stdin lifeline, own session, stopped by
    :func:`~pytest_tfgrpc.roles.processes.stop_all`), and a context manager.
    """

    def __init__(
        self,
        host: str,
        port: int = 0,
        *,
        env: Mapping[str, str] | None = None,
        launcher: Launcher = LOCAL,
        engine: str = "grpcio",
    ) -> None:
        if engine == "native":
            # Through an agent the program is the agent host's own build, named by its name.
            program = FLOOR_NAME if launcher is not LOCAL else str(binaries().floor)
            argv = [program, "serve", "--bind", host]
        else:
            argv = [sys.executable, "-m", "pytest_tfgrpc.roles.floor_server", "--bind", host]
        name = f"{'native ' if engine == 'native' else ''}floor server on {host!r}"
        if launcher is not LOCAL:
            name += f" (host {launcher.host})"
        super().__init__([*argv, "--port", str(port)], name=name, env=env, launcher=launcher)
        self.host = host
        #: What serves the floor: ``grpcio`` (this module, Python) or ``native``
        #: (``tfgrpc-native-floor``, C++, the same protocol).
        self.engine = engine
        self._port: int | None = None

    @classmethod
    def start(
        cls,
        host: str,
        port: int = 0,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 15.0,
        launcher: Launcher = LOCAL,
        engine: str = "grpcio",
    ) -> FloorServer:
        """Start a floor server on ``host`` and return once it listens; FloorError (with the
        end of its stderr) if it cannot bind or does not come up within ``ready_timeout``.
        With a node agent's ``launcher``, it runs on that agent's host, bound to the agent's
        fabric address (``host`` is then that address, and ``port`` the OS's choice).
        ``engine="native"`` serves with ``tfgrpc-native-floor`` (here, or through an agent
        from that host's build; :class:`~pytest_tfgrpc.native.NativeNotBuilt` when it is not
        built here, the agent's refusal naming the host when it is not built there)."""
        handle = cls(host, port, env=env, launcher=launcher, engine=engine)
        try:
            handle._port = int(handle.read_ready_line(ready_timeout, FloorError)["port"])
        except BaseException:
            handle.stop()
            raise
        return handle

    @property
    def port(self) -> int:
        if self._port is None:
            raise FloorError(f"{self.name} is not ready")
        return self._port

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)


if __name__ == "__main__":
    sys.exit(main())
