"""The tensor server: a real gRPC server in its own process, bound to one fabric address.

Run as ``tfgrpc-server --fabric ib0`` (or ``python -m pytest_tfgrpc.roles.tensor_server``).
When it serves, it prints one JSON line (``{"target": ..., "pid": ..., "fabric": ...}``) on stdout;
with ``--exit-on-stdin-eof`` it also stops when its stdin closes, which is how the plugin
makes sure no server outlives the pytest process that started it, however that ends.
``--engine native`` checks the same flags, then becomes the native C++ server
(``tfgrpc-native-server``, the same services and ready line) by ``exec``.

Every method exists twice: in ``tfgrpc.TensorService`` (TensorProto messages, decoded and
encoded by hand as TensorFlow does) and in ``tfgrpc.RawTensorService`` (opaque bytes, no
protobuf work at all). Handlers are generic and take bytes, so neither mode pays for
protobuf's generated (de)serializers.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any

import grpc

from pytest_tfgrpc.native import ENGINES, NativeNotBuilt, binaries
from pytest_tfgrpc.results import process_cpu_ns
from pytest_tfgrpc.roles.idle import IDLE_STREAM_S, IdleWatch
from pytest_tfgrpc.roles.parameter_server import ParameterServer, refusing_malformed
from pytest_tfgrpc.tuning.allocator import ALLOCATOR_POLICIES, allocator_settings, apply_policy
from pytest_tfgrpc.tuning.cpus import CpuError, parse_cpu_list, pin_process, require_allowed
from pytest_tfgrpc.units import UnitError, parse_duration_ns, parse_size
from pytest_tfgrpc.wire import codec, grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.fabric import Fabric, FabricError, resolve_fabric
from pytest_tfgrpc.wire.security import (
    ENV_VARS,
    TOKEN_ENV,
    TlsError,
    TlsFiles,
    add_port,
    current_tls,
    load_tls,
    tls_mode,
    use_tls,
)
from pytest_tfgrpc.wire.tensors import make_content

_ALLOCATOR_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_ARENA_MAX")
#: Environment variable with the largest tensor a server takes (how a run hands it over).
MAX_TENSOR_ENV = "TFGRPC_MAX_TENSOR_BYTES"


#: Below this a delay is held by spinning: a sleep that short overshoots by tens of
#: microseconds (timer slack), too coarse to slow a 300 us echo by a chosen 1.2x.
SPIN_BELOW_S = 0.002


def hold(delay_s: float) -> None:
    """Hold the caller back ``delay_s`` seconds: by spinning on the clock when shorter than
    :data:`SPIN_BELOW_S` (precise, and a CPU cost like a slower code path has), else by
    sleeping."""
    if delay_s >= SPIN_BELOW_S:
        time.sleep(delay_s)
        return
    end = time.perf_counter() + delay_s
    while time.perf_counter() < end:
        pass


class _Counters:
    """Messages and bytes received, for the Status RPC."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.messages = 0
        self.nbytes = 0

    def add(self, messages: int, nbytes: int) -> None:
        with self._lock:
            self.messages += messages
            self.nbytes += nbytes


#: The most an over-limit stream push is read (and dropped) before it is refused.
_DRAIN_BYTES = 64 << 20


def _announced_bytes(context: grpc.ServicerContext) -> int | None:
    """The message size a stream announced in its metadata, if it is a number."""
    for key, value in context.invocation_metadata():
        if key == grpc_settings.MESSAGE_BYTES_KEY:
            with contextlib.suppress(ValueError):
                return int(value)
    return None


def _message_bytes(context: grpc.ServicerContext, limit: int) -> int:
    for key, value in context.invocation_metadata():
        if key == grpc_settings.MESSAGE_BYTES_KEY:
            try:
                size = int(value)
            except ValueError:
                break
            if size < 0:
                break
            _check_limit(context, size, limit, "a pushed message", grpc_settings.FRAMING_BYTES)
            return size
    context.abort(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"a stream must announce its message size in '{grpc_settings.MESSAGE_BYTES_KEY}' metadata",
    )
    raise AssertionError("unreachable")  # abort raises


def _check_limit(
    context: grpc.ServicerContext, nbytes: int, limit: int, what: str, framing: int = 0
) -> None:
    """Refuse, with RESOURCE_EXHAUSTED, a request that would make this server allocate more
    than ``limit`` bytes of tensor (``framing`` bytes of message around it allowed): a few
    bytes of request must not cost gigabytes."""
    if nbytes > limit + framing:
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what} of {nbytes} B refused: this server takes tensors of at most {limit} B "
            "(tfgrpc-server --max-tensor-bytes; plugin-started servers: the test's largest size)",
        )


class TensorService:
    """The handlers of both services; ``mode`` decides whether bytes are decoded as tensors."""

    def __init__(
        self,
        mode: str,
        target: str,
        fabric: str,
        counters: _Counters,
        delay_s: float = 0.0,
        max_tensor_bytes: int = grpc_settings.MAX_TENSOR_BYTES,
        environment: dict[str, str] | None = None,
        idle: IdleWatch | None = None,
    ) -> None:
        self.delay_s = delay_s
        self.max_tensor_bytes = max_tensor_bytes
        self.environment = environment or {}
        self.mode = mode
        self.protobuf = mode == "protobuf"
        self.target = target
        self.fabric = fabric
        self.counters = counters
        self._pull_cache: dict[tuple[int, str], bytes] = {}
        self._pull_lock = threading.Lock()
        #: Times out calls whose request does not come (a stranger's idle stream).
        self.idle = idle or IdleWatch()

    # --- latency -------------------------------------------------------------------------
    def _check_message(self, context: grpc.ServicerContext, request: bytes, what: str) -> None:
        framing = grpc_settings.FRAMING_BYTES if self.protobuf else 0
        _check_limit(context, len(request), self.max_tensor_bytes, what, framing)

    def echo(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._check_message(context, request, "an echoed message")
        self.counters.add(1, len(request))
        if self.delay_s:
            hold(self.delay_s)
        if self.protobuf:
            tensor = codec.decode_tensor(request)
            return codec.encode_tensor(tensor.content, tensor.dtype, tensor.shape)
        return request

    def echo_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        for request in requests:
            yield self.echo(request, context)

    # --- worker -> PS --------------------------------------------------------------------
    def push(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._check_message(context, request, "a pushed message")
        if self.delay_s:
            hold(self.delay_s)
        if self.protobuf:
            codec.decode_tensor(request)
        self.counters.add(1, len(request))
        return codec.encode_ack(len(request), 1)

    def push_stream(
        self, requests: Iterator[bytes], context: grpc.ServicerContext
    ) -> Iterator[bytes]:
        """Slices of messages of a size announced in metadata; one Ack per whole message."""
        announced = _announced_bytes(context)
        if (
            announced is not None
            and announced > self.max_tensor_bytes + grpc_settings.FRAMING_BYTES
        ):
            # Refused once the client has sent what it announced (read and dropped: it costs
            # no memory), up to _DRAIN_BYTES: a client whose writes are still under way would
            # get gRPC's "Internal error from Core" for a failed write, not this status.
            drained = 0
            for request in requests:
                drained += len(request)
                if drained >= min(announced, _DRAIN_BYTES):
                    break
        message_bytes = _message_bytes(context, self.max_tensor_bytes)
        received = 0
        messages = 0
        first: memoryview | None = None
        for request in requests:
            data = codec.chunk_data(request) if self.protobuf else request
            if first is None:
                first = memoryview(data)
            received += len(data)
            if received < message_bytes:
                continue
            if received > message_bytes:
                context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"slices overran the announced message size: {received} > {message_bytes}",
                )
            if self.protobuf:
                # Decode the header from the first slice and check the content length
                # against what arrived, without joining the slices into one buffer.
                _, _, offset, length = codec.content_span(first)
                if offset + length != message_bytes:
                    context.abort(
                        grpc.StatusCode.INVALID_ARGUMENT,
                        f"TensorProto of {offset + length} bytes in a {message_bytes} B message",
                    )
            messages += 1
            self.counters.add(1, received)
            if self.delay_s:
                hold(self.delay_s)
            yield codec.encode_ack(received, messages)
            received = 0
            first = None

    # --- PS -> worker (RecvTensor) -------------------------------------------------------
    def _encoded(self, nbytes: int, dtype: str) -> bytes:
        # A PS owns its tensors before a worker asks: encode once, as TensorFlow's zero-copy
        # send path hands gRPC the existing tensor buffer.
        key = (nbytes, dtype)
        with self._pull_lock:
            cached = self._pull_cache.get(key)
            if cached is None:
                content, dt, shape = make_content(nbytes, dtype=dtype)
                cached = codec.encode_tensor(content, dt, shape) if self.protobuf else content
                self._pull_cache = {key: cached}  # keep one: a sweep must not hoard memory
            return cached

    def pull(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.delay_s:
            hold(self.delay_s)
        nbytes, dtype, _ = codec.decode_pull_request(request)
        _check_limit(context, nbytes, self.max_tensor_bytes, "a pull")
        return self._encoded(nbytes, dtype)

    def pull_stream(self, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        if self.delay_s:
            hold(self.delay_s)
        nbytes, dtype, chunk = codec.decode_pull_request(request)
        _check_limit(context, nbytes, self.max_tensor_bytes, "a pull")
        chunk = chunk or grpc_settings.DEFAULT_CHUNK_BYTES
        view = memoryview(self._encoded(nbytes, dtype))
        for start in range(0, len(view), chunk):
            piece = view[start : start + chunk]
            yield codec.encode_chunk(piece) if self.protobuf else piece.tobytes()

    # --- status --------------------------------------------------------------------------
    def status(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        user_ns, system_ns = process_cpu_ns()
        reply = service_pb2.ServerStatus(
            pid=os.getpid(),
            target=self.target,
            fabric=self.fabric,
            messages_received=self.counters.messages,
            bytes_received=self.counters.nbytes,
            cpu_user_ns=user_ns,
            cpu_system_ns=system_ns,
            grpc_version=grpc.__version__,
            environment=self.environment,
        )
        return bytes(reply.SerializeToString())

    def handler(self) -> grpc.GenericRpcHandler:
        service = (
            grpc_settings.RAW_SERVICE if self.mode == "raw" else grpc_settings.PROTOBUF_SERVICE
        )
        unary: dict[str, Callable[[Any, Any], Any]] = {
            "Echo": _refusing(self.echo, "TensorProto"),
            "Push": _refusing(self.push, "TensorProto"),
            "Pull": _refusing(self.pull, "PullRequest"),
            "Status": self.status,
        }
        # Every method reads its requests as a stream under the idle bound.
        watch = self.idle
        handlers = {
            name: grpc.stream_unary_rpc_method_handler(watch.first(fn))
            for name, fn in unary.items()
        }
        streams = {
            "EchoStream": watch.each(_refusing_stream(self.echo_stream, "TensorProto")),
            "PushStream": watch.each(_refusing_stream(self.push_stream, "TensorProto slice")),
            "PullStream": watch.first(_refusing_stream(self.pull_stream, "PullRequest")),
        }
        for name, handle in streams.items():
            handlers[name] = grpc.stream_stream_rpc_method_handler(handle)
        return grpc.method_handlers_generic_handler(service, handlers)


def _refusing(fn: Callable[[Any, Any], Any], message: str) -> Callable[[Any, Any], Any]:
    """``fn`` refusing a request it cannot decode: INVALID_ARGUMENT naming ``message``."""

    def handle(request: Any, context: grpc.ServicerContext) -> Any:
        with refusing_malformed(context, message):
            return fn(request, context)

    return handle


def _refusing_stream(
    fn: Callable[[Any, Any], Iterator[bytes]], message: str
) -> Callable[[Any, Any], Iterator[bytes]]:
    """:func:`_refusing` for a handler whose replies are a stream."""

    def handle(request: Any, context: grpc.ServicerContext) -> Iterator[bytes]:
        with refusing_malformed(context, message):
            yield from fn(request, context)

    return handle


def build_server(
    host: str,
    port: int,
    fabric: str,
    *,
    workers: int,
    delay_s: float = 0.0,
    max_tensor_bytes: int = grpc_settings.MAX_TENSOR_BYTES,
    job_token: str | None = None,
    environment: dict[str, str] | None = None,
    idle_s: float = IDLE_STREAM_S,
) -> tuple[grpc.Server, str]:
    """A started-to-be server bound to ``host:port`` only (TLS under the process's setting,
    :mod:`pytest_tfgrpc.wire.security`); returns it and its target.

    ``delay_s`` holds every tensor-service reply back that long: an injected slowdown, for
    checking that performance gates catch one. ``max_tensor_bytes`` is the largest tensor a
    request may make it receive or allocate (larger: RESOURCE_EXHAUSTED); ``job_token`` the
    token PS calls must carry (None: PS calls refused). ``environment`` is what its Status
    call reports (allocator, TLS, limits). The server takes
    :func:`~pytest_tfgrpc.wire.grpc_settings.max_concurrent_rpcs` calls at once over all
    connections (beyond: RESOURCE_EXHAUSTED), and a tensor-service call whose request message
    does not come within ``idle_s`` seconds is cancelled (:mod:`pytest_tfgrpc.roles.idle`).
    """
    # gRPC's receive limit stays at its maximum: a message over it is refused by the core as
    # "Internal error from Core" mid-stream; the handlers refuse with a message instead.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tfgrpc"),
        options=grpc_settings.SERVER_OPTIONS,
        maximum_concurrent_rpcs=grpc_settings.max_concurrent_rpcs(workers),
    )
    bound = add_port(server, f"{host}:{port}")
    target = f"{host}:{bound}"
    counters = _Counters()
    idle = IdleWatch(idle_s)
    server.add_generic_rpc_handlers(
        [
            TensorService(
                mode, target, fabric, counters, delay_s, max_tensor_bytes, environment, idle
            ).handler()
            for mode in grpc_settings.MODES
        ]
    )
    server.add_generic_rpc_handlers(ParameterServer(job_token, idle).handlers())
    return server, target


def _check_bindable(fabric: Fabric, port: int) -> str | None:
    """Why ``fabric:port`` cannot be bound, or None. gRPC's own bind error does not say."""
    with socket.socket(fabric.socket_family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC does
        try:
            probe.bind(fabric.sockaddr(port))
        except OSError as exc:
            return f"cannot bind {fabric.target(port)}: {exc.strerror or exc}"
    return None


def _watch_stdin(server: grpc.Server, done: threading.Event) -> None:
    try:
        while sys.stdin.buffer.read(65536):
            pass
    finally:
        server.stop(grace=None)
        done.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tfgrpc-server",
        description="Serve pytest-tfgrpc's tensor service on one network interface.",
    )
    parser.add_argument("--fabric", default="lo", help="interface to bind to (default: lo)")
    parser.add_argument("--port", type=int, default=0, help="port (default: one the OS picks)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default="grpcio",
        help="grpcio (this Python server, the default) or native (tfgrpc-native-server, the "
        "C++ server built by tfgrpc-build-native; the same service, flags and ready line)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="handler threads (default: 16); native: completion-queue threads, 1-64 (default: "
        "1, the lowest latency)",
    )
    parser.add_argument(
        "--delay",
        default="0s",
        help="fault injection: hold every tensor-service reply back this long (e.g. 200us)",
    )
    parser.add_argument(
        "--cpus",
        metavar="LIST",
        help="run on these CPUs only (a cpulist, e.g. 1 or 4-7; among the CPUs it may use), as "
        "the plugin pins the servers it starts (--tfgrpc-cpus); default: wherever the "
        "scheduler puts it",
    )
    parser.add_argument(
        "--allocator",
        choices=ALLOCATOR_POLICIES,
        default=os.environ.get("TFGRPC_ALLOCATOR") or "tuned",
        help="glibc allocator policy, as the plugin applies to the servers it starts: 'tuned' "
        "(large-message memory stays on the heap) or 'default' (glibc left alone). Default: "
        "$TFGRPC_ALLOCATOR (how a run hands its policy over), else 'tuned'. Reported by Status.",
    )
    parser.add_argument(
        "--max-tensor-bytes",
        default=os.environ.get(MAX_TENSOR_ENV) or None,
        help="largest tensor a request may make the server receive or allocate, e.g. 64MiB "
        f"(default: ${MAX_TENSOR_ENV}, else {grpc_settings.MAX_TENSOR_BYTES} B, gRPC's limit); "
        "larger requests are refused with RESOURCE_EXHAUSTED",
    )
    for name, what in (
        ("cert", "PEM certificate chain to serve TLS with (with --tls-key)"),
        ("key", "PEM private key of --tls-cert"),
        ("ca", "PEM CA bundle: require client certificates signed by it (mutual TLS)"),
    ):
        parser.add_argument(
            f"--tls-{name}",
            default=os.environ.get(ENV_VARS[name]) or None,
            metavar="FILE",
            help=f"{what} (default: ${ENV_VARS[name]})",
        )
    parser.add_argument(
        "--exit-on-stdin-eof",
        action="store_true",
        help="stop when stdin closes (how a parent process ties the server's life to its own)",
    )
    args = parser.parse_args(argv)
    if not 0 <= args.port <= 65535:
        parser.error(f"--port {args.port}: a port is a number from 0 to 65535")
    try:
        fabric = resolve_fabric(args.fabric)
    except FabricError as exc:
        parser.error(str(exc))
    if args.cpus is not None:
        # Before the server starts its threads, which inherit the CPUs.
        try:
            cpus = parse_cpu_list(args.cpus)
            # Never CPUs this host lacks, nor outside those a taskset or cpuset gave it.
            require_allowed(cpus, who="the server")
            pin_process(os.getpid(), cpus, who="the server")
        except CpuError as exc:
            parser.error(f"--cpus {args.cpus}: {exc}")
    try:
        delay_s = parse_duration_ns(args.delay) / 1e9
    except UnitError as exc:
        parser.error(f"--delay: {exc}")
    limited = args.max_tensor_bytes is not None
    max_tensor_bytes = grpc_settings.MAX_TENSOR_BYTES
    try:
        if limited:
            max_tensor_bytes = parse_size(args.max_tensor_bytes)
    except UnitError as exc:
        parser.error(f"--max-tensor-bytes: {exc}")
    if max_tensor_bytes > grpc_settings.MAX_TENSOR_BYTES:
        parser.error(
            f"--max-tensor-bytes {max_tensor_bytes}: {grpc_settings.too_large(max_tensor_bytes)}"
        )
    try:
        use_tls(load_tls(TlsFiles(args.tls_cert, args.tls_key, args.tls_ca), "--tls-"))
    except TlsError as exc:
        parser.error(str(exc))
    tls = current_tls()
    if tls is not None and tls.cert is None:
        parser.error("--tls-ca needs --tls-cert and --tls-key: a TLS server needs an identity")
    problem = _check_bindable(fabric, args.port)
    if problem:
        parser.error(problem)
    if args.engine == "native":
        threads = 1 if args.workers is None else args.workers
        if not 1 <= threads <= 64:
            parser.error(f"--workers {threads}: the native server takes 1 to 64 threads")
        try:
            program = binaries().server
        except NativeNotBuilt as exc:
            parser.error(f"--engine native: {exc}")
        native_argv = [
            str(program), "--host", fabric.host, "--port", str(args.port),
            "--fabric", fabric.name, "--delay-ns", str(int(delay_s * 1e9)),
            "--threads", str(threads),
            *(["--max-tensor-bytes", str(max_tensor_bytes)] if limited else []),
            *(["--exit-on-stdin-eof"] if args.exit_on_stdin_eof else []),
        ]  # fmt: skip
        # Pinned above (exec keeps the CPUs); its allocator and TLS through the environment.
        tuned = apply_policy(args.allocator)
        env = {k: v for k, v in (tuned or os.environ).items() if k not in ENV_VARS.values()}
        env.update(tls.files.env() if tls is not None else {})
        os.execve(native_argv[0], native_argv, env)
    workers = 16 if args.workers is None else args.workers
    # The same allocator policy as plugin-started servers get (there through the
    # environment, here in-process before the first large allocation), and reported.
    apply_policy(args.allocator)
    environment = {
        **{k: os.environ[k] for k in _ALLOCATOR_VARS if k in os.environ},
        **allocator_settings(),
        "allocator": args.allocator,
        "tls": tls_mode(),
        "max_tensor_bytes": str(max_tensor_bytes),
    }
    server, target = build_server(
        fabric.host,
        args.port,
        fabric.name,
        workers=workers,
        delay_s=delay_s,
        max_tensor_bytes=max_tensor_bytes,
        job_token=os.environ.get(TOKEN_ENV) or None,
        environment=environment,
    )
    # Everything allocated so far lives as long as the server: keep the cyclic collector
    # from walking it again and again while it serves (a few percent of a 1 KiB echo).
    gc.freeze()
    server.start()
    done = threading.Event()
    if args.exit_on_stdin_eof:
        threading.Thread(target=_watch_stdin, args=(server, done), daemon=True).start()
    print(json.dumps({"target": target, "pid": os.getpid(), "fabric": fabric.name}), flush=True)
    try:
        server.wait_for_termination()
    except KeyboardInterrupt:
        server.stop(grace=1.0).wait(2.0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
