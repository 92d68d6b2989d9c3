"""Client side of the tensor service: channels and the calls a benchmark times.

Calls carry bytes end to end (no serializers on the multicallables): in raw mode the bytes
are the tensor, in protobuf mode they are a TensorProto the benchmark encoded by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, Protocol, TypeVar

import grpc
import grpc.aio

from pytest_tfgrpc.wire import channels as transport
from pytest_tfgrpc.wire.fabric import Fabric

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


def rpc_timeout(nbytes: int) -> float:
    """A deadline for one call moving ``nbytes``: generous, but never unbounded."""
    return 10.0 + nbytes / 10e6


def connect(target: str, timeout: float = 10.0) -> grpc.Channel:
    """A connected channel to ``target``, or BenchmarkError if it is not reachable."""
    channel = grpc.insecure_channel(target, options=transport.CHANNEL_OPTIONS)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
    except grpc.FutureTimeoutError:
        channel.close()
        raise BenchmarkError(f"no connection to {target} within {timeout:g} s") from None
    return channel


async def connect_aio(target: str, timeout: float = 10.0) -> grpc.aio.Channel:
    channel = grpc.aio.insecure_channel(target, options=transport.CHANNEL_OPTIONS)
    try:
        await asyncio.wait_for(channel.channel_ready(), timeout)
    except asyncio.TimeoutError:
        await channel.close()
        raise BenchmarkError(f"no connection to {target} within {timeout:g} s") from None
    return channel


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


def explain(error: grpc.RpcError, server: Server, what: str) -> BaseException:
    """The error to raise for a failed call: the server's death if that is what happened."""
    death = server.died()
    if death is not None:
        return death
    code = error.code() if isinstance(error, grpc.Call) else None
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    name = code.name if code is not None else "error"
    return BenchmarkError(f"{what} to {server.target} failed: {name}: {details}")
