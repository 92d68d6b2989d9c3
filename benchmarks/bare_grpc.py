"""What a hand-written script gets from bare grpcio: the contenders the plugin must not lose to.

Servers run in their own process (``python benchmarks/bare_grpc.py serve --bind HOST --kind
sync|aio``), bound to one address on a port the OS picks, ``grpc.so_reuseport`` off, message
limits raised to 2**31-1. They print ``{"port": N, "pid": P}`` once serving and exit on stdin EOF
or SIGTERM. Handlers are generic and raw-bytes (no serializers), so protobuf costs nothing here.

Client measurements, each returning every timed operation in ns:

- :func:`unary_echo`: sync unary echo (latency);
- :func:`aio_unary_echo`: ``grpc.aio`` unary echo (latency);
- :func:`aio_stream_pingpong`: ``grpc.aio`` stream-stream ping-pong on one long-lived stream;
- :func:`client_stream_push`: a tensor as 1 MiB chunks on a client stream, one ack per tensor;
- :func:`unary_push`: the whole tensor in one unary call, one ack.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent import futures
from types import TracebackType
from typing import IO, Any

import grpc
import grpc.aio
import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.roles.processes import end_process

SERVICE = "bare.Bare"
ECHO = f"/{SERVICE}/Echo"
PUSH = f"/{SERVICE}/Push"
PUSH_STREAM = f"/{SERVICE}/PushStream"
ECHO_STREAM = f"/{SERVICE}/EchoStream"
ACK = b"\x06"
CHUNK = 1024 * 1024
MAX_MESSAGE = 2**31 - 1

SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
]
# The proxy switch is off so that an http_proxy in the environment can never send the traffic
# anywhere but the address asked for.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.enable_http_proxy", 0),
]

# --------------------------------------------------------------------------------------------
# Servers (child process)
# --------------------------------------------------------------------------------------------


def _echo(request: bytes, context: grpc.ServicerContext) -> bytes:
    return request


def _push(request: bytes, context: grpc.ServicerContext) -> bytes:
    return ACK


def _push_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> bytes:
    for _ in requests:
        pass
    return ACK


def _echo_stream(requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    yield from requests


async def _aecho(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _apush(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return ACK


async def _apush_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> bytes:
    async for _ in requests:
        pass
    return ACK


async def _aecho_stream(
    requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    async for message in requests:
        yield message


def _handler(aio: bool) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(_aecho if aio else _echo),
            "Push": grpc.unary_unary_rpc_method_handler(_apush if aio else _push),
            "PushStream": grpc.stream_unary_rpc_method_handler(
                _apush_stream if aio else _push_stream
            ),
            "EchoStream": grpc.stream_stream_rpc_method_handler(
                _aecho_stream if aio else _echo_stream
            ),
        },
    )


def _address(host: str) -> str:
    return f"[{host}]:0" if ":" in host else f"{host}:0"


def _read_stdin_until_eof() -> None:
    while os.read(0, 4096):
        pass


def _ready(port: int) -> None:
    if port == 0:
        raise SystemExit("bare_grpc: could not bind (grpc returned port 0)")
    print(json.dumps({"port": port, "pid": os.getpid()}), flush=True)


def _serve_sync(host: str, workers: int) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers),
        handlers=[_handler(aio=False)],
        options=SERVER_OPTIONS,
    )
    try:
        port = server.add_insecure_port(_address(host))
    except RuntimeError as exc:
        raise SystemExit(f"bare_grpc: cannot bind to {host!r}: {exc}") from exc
    server.start()
    try:
        _ready(port)
        _read_stdin_until_eof()
    finally:
        server.stop(grace=1.0).wait(5.0)


async def _serve_aio(host: str) -> None:
    server = grpc.aio.server(handlers=[_handler(aio=True)], options=SERVER_OPTIONS)
    try:
        port = server.add_insecure_port(_address(host))
    except RuntimeError as exc:
        raise SystemExit(f"bare_grpc: cannot bind to {host!r}: {exc}") from exc
    await server.start()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def wait_eof() -> None:
        _read_stdin_until_eof()
        loop.call_soon_threadsafe(stop.set)

    eof = threading.Thread(target=wait_eof, daemon=True)
    try:
        _ready(port)
        eof.start()
        await stop.wait()
    finally:
        await server.stop(grace=1.0)


def serve(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bare_grpc.py serve")
    parser.add_argument("--bind", required=True)
    parser.add_argument("--kind", choices=("sync", "aio"), default="sync")
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if args.kind == "sync":

        def on_term(signum: int, frame: object) -> None:
            raise SystemExit(0)

        signal.signal(signal.SIGTERM, on_term)
        _serve_sync(args.bind, args.workers)
    else:
        asyncio.run(_serve_aio(args.bind))
    return 0


# --------------------------------------------------------------------------------------------
# Server process handle
# --------------------------------------------------------------------------------------------


class BareServer:
    """A bare grpcio server process (``kind`` sync or aio); a context manager that never leaks.

    ``env`` is the process environment (None: this process's), so the allocator variables
    every other server of a run gets reach this one too.
    """

    def __init__(self, host: str, kind: str = "sync", *, env: dict[str, str] | None = None) -> None:
        self.host = host
        self.kind = kind
        self.env = env
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def target(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def __enter__(self) -> BareServer:
        argv = [sys.executable, os.path.abspath(__file__), "serve", "--bind", self.host]
        argv += ["--kind", self.kind]
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, env=self.env
        )
        weakref.finalize(self, end_process, self._proc, 5.0)
        try:
            self._wait_ready(30.0)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"bare {self.kind} server not ready in {timeout} s")
                chunk = os.read(self._proc.stdout.fileno(), 4096)
                if not chunk:
                    assert self._stderr is not None
                    self._stderr.seek(0)
                    tail = self._stderr.read().decode(errors="replace")[-2000:]
                    raise RuntimeError(
                        f"bare {self.kind} server exited with {self._proc.wait()}: {tail}"
                    )
                line += chunk
        self.port = int(json.loads(line)["port"])

    def stop(self) -> None:
        if self._proc is not None:
            end_process(self._proc, 5.0)
            if self._proc.stdout is not None:
                self._proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# Clients
# --------------------------------------------------------------------------------------------


def payload(size: int) -> bytes:
    return (np.arange(size, dtype=np.uint64) * 2654435761 >> 13).astype(np.uint8).tobytes()


def _timed_loop(
    op: Any, *, iterations: int, warmup: int, max_seconds: float
) -> npt.NDArray[np.int64]:
    """Run ``op`` ``warmup`` times, then time up to ``iterations`` runs (at least one)."""
    clock = time.perf_counter_ns
    deadline = clock() + int(max_seconds * 1e9)
    for _ in range(warmup):
        if clock() >= deadline:
            break
        op()
    samples = np.empty(iterations, dtype=np.int64)
    n = 0
    while n < iterations:
        t0 = clock()
        op()
        t1 = clock()
        samples[n] = t1 - t0
        n += 1
        if t1 >= deadline:
            break
    taken: npt.NDArray[np.int64] = samples[:n].copy()
    return taken


def _channel(target: str) -> grpc.Channel:
    channel = grpc.insecure_channel(target, options=CHANNEL_OPTIONS)
    grpc.channel_ready_future(channel).result(timeout=10)
    return channel


def unary_echo(
    target: str, size: int, *, iterations: int, warmup: int = 10, max_seconds: float = 10.0
) -> npt.NDArray[np.int64]:
    """Sync unary echo round trips."""
    data = payload(size)
    with _channel(target) as channel:
        call = channel.unary_unary(ECHO)
        if call(data, timeout=60) != data:
            raise RuntimeError("bare grpc echo returned different bytes")
        return _timed_loop(
            lambda: call(data, timeout=60),
            iterations=iterations,
            warmup=warmup,
            max_seconds=max_seconds,
        )


def unary_push(
    target: str, size: int, *, iterations: int, warmup: int = 2, max_seconds: float = 10.0
) -> npt.NDArray[np.int64]:
    """The whole tensor in one unary call, until its acknowledgement."""
    data = payload(size)
    with _channel(target) as channel:
        call = channel.unary_unary(PUSH)
        return _timed_loop(
            lambda: call(data, timeout=120),
            iterations=iterations,
            warmup=warmup,
            max_seconds=max_seconds,
        )


def client_stream_push(
    target: str,
    size: int,
    *,
    iterations: int,
    warmup: int = 2,
    max_seconds: float = 10.0,
    chunk: int = CHUNK,
) -> npt.NDArray[np.int64]:
    """A tensor as ``chunk``-byte messages on one client stream per tensor, one ack each."""
    data = payload(size)
    # Chunks cut before timing: the slicing copies are not the transport's cost.
    chunks = [data[i : i + chunk] for i in range(0, size, chunk)] or [b""]
    with _channel(target) as channel:
        call = channel.stream_unary(PUSH_STREAM)
        return _timed_loop(
            lambda: call(iter(chunks), timeout=120),
            iterations=iterations,
            warmup=warmup,
            max_seconds=max_seconds,
        )


async def _aio_pingpong(
    target: str, data: bytes, iterations: int, warmup: int, max_seconds: float
) -> npt.NDArray[np.int64]:
    clock = time.perf_counter_ns
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = channel.stream_stream(ECHO_STREAM)(timeout=max_seconds + 60)
        deadline = clock() + int(max_seconds * 1e9)
        await call.write(data)
        if await call.read() != data:
            raise RuntimeError("bare grpc stream echo returned different bytes")
        for _ in range(warmup):
            if clock() >= deadline:
                break
            await call.write(data)
            await call.read()
        samples = np.empty(iterations, dtype=np.int64)
        n = 0
        while n < iterations:
            t0 = clock()
            await call.write(data)
            await call.read()
            t1 = clock()
            samples[n] = t1 - t0
            n += 1
            if t1 >= deadline:
                break
        await call.done_writing()
        await call.code()
    taken: npt.NDArray[np.int64] = samples[:n].copy()
    return taken


def aio_stream_pingpong(
    target: str, size: int, *, iterations: int, warmup: int = 10, max_seconds: float = 10.0
) -> npt.NDArray[np.int64]:
    """Round trips of ``size`` bytes on one long-lived ``grpc.aio`` stream-stream call."""
    return asyncio.run(_aio_pingpong(target, payload(size), iterations, warmup, max_seconds))


async def _aio_unary(
    target: str, data: bytes, iterations: int, warmup: int, max_seconds: float
) -> npt.NDArray[np.int64]:
    clock = time.perf_counter_ns
    async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        call = channel.unary_unary(ECHO)
        if await call(data, timeout=60) != data:
            raise RuntimeError("bare grpc aio echo returned different bytes")
        deadline = clock() + int(max_seconds * 1e9)
        for _ in range(warmup):
            if clock() >= deadline:
                break
            await call(data, timeout=60)
        samples = np.empty(iterations, dtype=np.int64)
        n = 0
        while n < iterations:
            t0 = clock()
            await call(data, timeout=60)
            t1 = clock()
            samples[n] = t1 - t0
            n += 1
            if t1 >= deadline:
                break
    taken: npt.NDArray[np.int64] = samples[:n].copy()
    return taken


def aio_unary_echo(
    target: str, size: int, *, iterations: int, warmup: int = 10, max_seconds: float = 10.0
) -> npt.NDArray[np.int64]:
    """``grpc.aio`` unary echo round trips (one call each) on one channel."""
    return asyncio.run(_aio_unary(target, payload(size), iterations, warmup, max_seconds))


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        return serve(args[1:])
    print("usage: bare_grpc.py serve --bind HOST [--kind sync|aio]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
