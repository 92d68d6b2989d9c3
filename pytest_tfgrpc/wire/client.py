"""Client side of the tensor service: channels and the calls a benchmark times.

Calls carry bytes end to end (no serializers on the multicallables): in raw mode the bytes
are the tensor, in protobuf mode they are a TensorProto the benchmark encoded by hand.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, Protocol, TypeVar

import grpc
import grpc.aio

from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import (
    looks_like_tls_failure,
    open_aio_channel,
    open_channel,
    tls_failure,
    tls_mode,
)

T = TypeVar("T")


class BenchmarkError(RuntimeError):
    """A benchmark could not measure: an RPC failed, or an answer was wrong."""


class Server(Protocol):
    """What a benchmark needs of a server: where it is, and whether it died."""

    @property
    def target(self) -> str: ...

    @property
    def fabric(self) -> Fabric: ...

    def died(self, grace: float = 0.5) -> BaseException | None: ...


#: Slack of every deadline: connection set-up, a scheduler hiccup, the first HTTP/2 windows.
DEADLINE_SLACK_S: Final = 10.0
#: The rate a deadline assumes where the fabric's speed is unknown: 1 MB/s (8 Mbit/s), slow
#: enough for shaped and emulated links; a run's own time bound comes on top.
ASSUMED_RATE_BPS: Final = 1e6
#: Where the speed is known, a deadline assumes half of it (TCP, gRPC framing, contention).
SPEED_SHARE: Final = 0.5
#: How to give a run more time, for deadline errors.
RAISE_HINT: Final = (
    "raise it with --tfgrpc-max-seconds / --tfgrpc-warmup-seconds (ini tfgrpc_max_seconds) or "
    "@pytest.mark.tfgrpc_run(max_seconds=..., warmup_seconds=...)"
)


@dataclass(frozen=True)
class Deadline:
    """The deadline of one call, in seconds, and what it was made of (for error messages)."""

    seconds: float
    basis: str

    def describe(self) -> str:
        return f"{self.seconds:.3g} s ({self.basis})"


def call_deadline(nbytes: int, *, bound_s: float = 0.0, speed_mbps: int | None = None) -> Deadline:
    """The deadline of a call moving ``nbytes`` in a run allowed ``bound_s`` seconds.

    It is :data:`DEADLINE_SLACK_S`, plus the run's bound (a call may take as long as the
    run may), plus the bytes at half the fabric's speed ``speed_mbps`` where known, else at
    :data:`ASSUMED_RATE_BPS`: never unbounded, never shorter than the run allows."""
    if speed_mbps:
        rate = speed_mbps * 1e6 / 8 * SPEED_SHARE
        how = f"half the fabric's {speed_mbps} Mbit/s"
    else:
        rate = ASSUMED_RATE_BPS
        how = "the assumed minimum rate; fabric speed unknown"
    seconds = DEADLINE_SLACK_S + bound_s + nbytes / rate
    basis = (
        f"{DEADLINE_SLACK_S:g} s slack + run bound {bound_s:g} s + {nbytes} B at "
        f"{rate / 1e6:.3g} MB/s, {how}"
    )
    return Deadline(seconds, basis)


def rpc_timeout(nbytes: int, bound_s: float = 0.0, speed_mbps: int | None = None) -> float:
    """The seconds of :func:`call_deadline`."""
    return call_deadline(nbytes, bound_s=bound_s, speed_mbps=speed_mbps).seconds


def _call_code(error: BaseException) -> grpc.StatusCode | None:
    code = getattr(error, "code", None)
    if not callable(code):
        return None
    try:
        value = code()
    except Exception:  # an RpcError that is not a call has nothing to tell
        return None
    return value if isinstance(value, grpc.StatusCode) else None


def _call_details(error: BaseException) -> str:
    details = getattr(error, "details", None)
    if callable(details):
        try:
            text = details()
        except Exception:
            text = None
        if text:
            return " ".join(str(text).split())
    return type(error).__name__


def _probe_details(channel: grpc.Channel) -> str:
    """Why a channel does not connect, in gRPC's words: one call without waiting."""
    try:
        channel.unary_unary(grpc_settings.method("raw", "Status"))(b"", timeout=2.0)
    except grpc.RpcError as error:
        return _call_details(error)
    return ""


def unreachable(target: str, timeout: float, details: str) -> BenchmarkError:
    """The error for a server not reached within ``timeout`` s: a TLS handshake failure,
    a refused connection, or silence, told apart by gRPC's ``details``."""
    if (why := tls_failure(target, details)) is not None:
        return BenchmarkError(why)
    closed = "closed" in details.lower() or "reset" in details.lower()
    if closed and tls_mode() == "off":
        return BenchmarkError(
            f"{target} closed the connection during set-up: a TLS server answering a "
            f"plaintext client? (TLS handshake not attempted: no --tfgrpc-tls-* given) {details}"
        )
    if closed:
        return BenchmarkError(
            f"TLS handshake with {target} failed ({tls_mode()} on this side): the server closed "
            "the connection during it; it may require a client certificate this side lacks "
            f"(--tfgrpc-tls-cert/-key) or one signed by another CA. {details}"
        )
    why = f": {details}" if details else ""
    return BenchmarkError(f"no connection to {target} within {timeout:g} s{why}")


def _raise_death(server: Server | None) -> None:
    # A server that died before (or while) a client connects: its death, at once, not a
    # connection timeout.
    if server is not None and (death := server.died(grace=0)) is not None:
        raise death


def connect(target: str, timeout: float = 10.0, *, server: Server | None = None) -> grpc.Channel:
    """A connected channel to ``target`` (under the process's TLS setting), or
    BenchmarkError saying why not; ``server``'s death, if it dies meanwhile, at once.

    It waits with short Status calls that wait for the connection, not with
    ``channel_ready_future``, whose polling thread outlives a channel closed early."""
    channel = open_channel(target, grpc_settings.CHANNEL_OPTIONS)
    status = channel.unary_unary(grpc_settings.method("raw", "Status"))
    deadline = time.monotonic() + timeout
    attempts = 0
    try:
        while True:
            _raise_death(server)
            try:
                status(b"", timeout=_POLL_S, wait_for_ready=True)
                return channel
            except grpc.RpcError as error:
                if _call_code(error) is not grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise unreachable(target, timeout, _call_details(error)) from None
                if time.monotonic() >= deadline:
                    raise unreachable(target, timeout, _probe_details(channel)) from None
            attempts += 1
            if attempts % _PROBE_EVERY == 0:
                # A refused connection may be a server still starting; a failed TLS
                # handshake or a connection closed during set-up will not get better.
                details = _probe_details(channel)
                if _hopeless(details):
                    raise unreachable(target, timeout, details) from None
    except BaseException:
        channel.close()
        raise


async def connect_aio(
    target: str, timeout: float = 10.0, *, server: Server | None = None
) -> grpc.aio.Channel:
    """:func:`connect` for asyncio channels."""
    channel = open_aio_channel(target, grpc_settings.CHANNEL_OPTIONS)
    deadline = time.monotonic() + timeout
    try:
        while True:
            _raise_death(server)
            try:
                await asyncio.wait_for(channel.channel_ready(), _POLL_S)
                return channel
            except asyncio.TimeoutError:
                if time.monotonic() >= deadline:
                    break
        try:
            await channel.unary_unary(grpc_settings.method("raw", "Status"))(b"", timeout=2.0)
            details = ""
        except grpc.RpcError as error:
            details = _call_details(error)
        raise unreachable(target, timeout, details)
    except BaseException:
        await channel.close()
        raise


#: How often a connecting client looks whether its server is still alive.
_POLL_S: Final = 0.1
#: Every this many polls, a connecting client asks gRPC why it is not connected yet.
_PROBE_EVERY: Final = 5


def _hopeless(details: str) -> bool:
    text = details.lower()
    return looks_like_tls_failure(details) or "socket closed" in text or "reset by peer" in text


def run_async(coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None) -> T:
    """Run a coroutine on a private event loop (the benchmark API itself is synchronous):
    ``loop``, kept open for the next coroutine (a loop per round of a benchmark costs tens
    of milliseconds of grpc.aio set-up), else a new one closed after."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise BenchmarkError(
            "stream benchmarks run their own event loop and cannot be called from a running "
            "one; call them from a plain (non-async) test"
        )
    if loop is not None:
        return loop.run_until_complete(coro)
    private = asyncio.new_event_loop()
    try:
        return private.run_until_complete(coro)
    finally:
        private.close()


def explain(
    error: BaseException,
    server: Server,
    what: str,
    deadline: Deadline | None = None,
    seen: str = "",
) -> BaseException:
    """The error to raise for a failed call, in one line: the server's death if that is
    what happened; else the status, gRPC's details, and for a deadline, the deadline and
    its basis and how to raise it. ``seen`` is what the transport showed meanwhile
    (``after 22 s; 528 retransmissions, RTT 210 ms``), said in place of gRPC's silence or
    after its details. Works for sync and asyncio (stream) errors alike."""
    death = server.died()
    if death is not None:
        return death
    code = _call_code(error)
    details = _call_details(error)
    name = code.name if code is not None else "error"
    where = f"{what} to {getattr(server, 'name', 'server')} at {server.target}"
    if code is grpc.StatusCode.DEADLINE_EXCEEDED and deadline is not None:
        return BenchmarkError(
            f"{where} failed: DEADLINE_EXCEEDED: the deadline was {deadline.describe()}; "
            + RAISE_HINT
            + (f" (transport: {seen})" if seen else "")
        )
    if code is grpc.StatusCode.UNAVAILABLE and (why := tls_failure(server.target, details)):
        return BenchmarkError(f"{where} failed: {why}")
    if code is grpc.StatusCode.INTERNAL and details == _CORE_TRANSPORT_ERROR:
        # gRPC's core gives this when the connection breaks in the middle of a message (a
        # server killed mid-push): say what happened, not the generic text.
        if not _accepts_connections(server.target):
            return BenchmarkError(
                f"{where} failed: UNAVAILABLE: the connection broke mid-call and "
                f"{server.target} no longer accepts connections (the server is gone)"
            )
        cause = seen or "gRPC gave no cause"
        return BenchmarkError(f"{where} failed: INTERNAL: the connection broke mid-call ({cause})")
    return BenchmarkError(
        f"{where} failed: {name}: {details}" + (f" (transport: {seen})" if seen else "")
    )


#: What gRPC's core says of a transport that failed mid-message, and nothing more.
_CORE_TRANSPORT_ERROR = "Internal error from Core"


def _accepts_connections(target: str, timeout: float = 1.0) -> bool:
    """Whether ``host:port`` (``[v6%zone]:port`` too) accepts a TCP connection now."""
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False
