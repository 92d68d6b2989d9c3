"""gRPC settings shared by tensor servers and clients, and the method paths they speak.

One place decides the channel arguments, so a server and its clients never disagree on
message limits or flow control.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Final

#: TensorFlow sets both message limits to INT32_MAX on channels and servers
#: (grpc_channel.cc, grpc_server_lib.cc); gRPC's own receive default (4 MiB) would refuse
#: the weight tensors of real models.
MAX_MESSAGE_BYTES: Final = 2**31 - 1

#: What a message carries beside the tensor's bytes at most: a TensorProto's header
#: (dtype, shape, the content's tag and length) and its ack; the largest tensor any
#: benchmark sends in one message is the limit less this.
FRAMING_BYTES: Final = 64
#: The largest tensor, in bytes, a benchmark accepts: one gRPC message, less the framing.
MAX_TENSOR_BYTES: Final = MAX_MESSAGE_BYTES - FRAMING_BYTES


#: gRPC core's own log (the C core's lines, through absl): its level, read when gRPC starts.
CORE_LOG_ENV: Final = "GRPC_VERBOSITY"
#: Off in the processes the plugin runs, unless the environment says otherwise
#: (``GRPC_VERBOSITY=ERROR``, ``INFO``, ``DEBUG`` show it). Left unset, grpcio writes lines
#: such as ``I1202 ... chttp2_transport.cc] ... Got goaway`` when a peer dies, into the
#: captured output of a test whose failure already says, in one line, what died.
CORE_LOG_DEFAULT: Final = "NONE"


def quiet_core_log(environ: MutableMapping[str, str]) -> None:
    """Turn gRPC core's log off in ``environ`` (a process's, before gRPC starts, so the
    processes it starts inherit it too) unless it sets :data:`CORE_LOG_ENV` itself."""
    environ.setdefault(CORE_LOG_ENV, CORE_LOG_DEFAULT)


def too_large(nbytes: int) -> str:
    """Why a tensor of ``nbytes`` cannot travel in one gRPC message."""
    return (
        f"message size {nbytes} B exceeds the largest tensor one gRPC message carries: "
        f"{MAX_TENSOR_BYTES} B (2 GiB - 1, the message limit, less {FRAMING_BYTES} B of framing)"
    )


#: Streamed tensors travel in slices of this many bytes unless a test asks otherwise.
DEFAULT_CHUNK_BYTES: Final = 1 << 20

#: A fixed HTTP/2 stream window instead of BDP probing: probing let fresh connections
#: stick at a third of the bandwidth pulling 4 MiB tensors on this kind of machine.
LOOKAHEAD_BYTES: Final = 8 << 20

COMMON_OPTIONS: Final[tuple[tuple[str, int], ...]] = (
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.http2.lookahead_bytes", LOOKAHEAD_BYTES),
)

#: Compression off on every server (only ``identity`` enabled): gRPC decompresses a message
#: before any handler sees its size, so 510 KiB of gzip would grow to the 2 GiB message limit
#: before a tensor limit could refuse it. A compressed call is refused (UNIMPLEMENTED) unread.
NO_COMPRESSION: Final = (("grpc.compression_enabled_algorithms_bitset", 1),)

#: A connection without a call for this long is closed (the client reconnects when it needs
#: to): idle connections do not pile up on a long-running server.
MAX_CONNECTION_IDLE_MS: Final = 300_000

#: HTTP/2 streams one connection may hold at once on a tensor server (its
#: SETTINGS_MAX_CONCURRENT_STREAMS). gRPC core counts a stream until its call is done, reset
#: by the client or not ("overload protection", on by default), and refuses one beyond
#: (REFUSED_STREAM): a stranger's rapid reset (CVE-2023-44487) or idle streams on one
#: connection hold at most this many calls. A benchmark client makes one or two calls at a time
#: on a connection (``streams=N`` opens N connections); gRPC clients queue calls beyond.
#: A call counts until grpcio releases it: a call cancelled while queued for a thread is
#: released once a thread has seen it (:mod:`pytest_tfgrpc.roles.idle` breaks the reference
#: cycle grpcio makes of it, which would keep it until the cyclic collector ran), so a client's
#: connection whose calls expired behind a stranger's idle streams is answered again after.
MAX_STREAMS_PER_CONNECTION: Final = 16


def stream_bound(streams: int) -> tuple[tuple[str, int], ...]:
    """The server options bounding each connection to ``streams`` concurrent streams."""
    return (("grpc.max_concurrent_streams", streams),)


#: ``so_reuseport`` off: with gRPC's default a second server "binds" a port already in use
#: and clients are silently balanced across two unrelated servers.
SERVER_OPTIONS: Final = (
    *COMMON_OPTIONS,
    *NO_COMPRESSION,
    *stream_bound(MAX_STREAMS_PER_CONNECTION),
    ("grpc.so_reuseport", 0),
    ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
)


def max_concurrent_rpcs(threads: int) -> int:
    """Calls a server with ``threads`` handler threads takes at once, over all connections;
    beyond, a call is refused at once (RESOURCE_EXHAUSTED) instead of queueing without bound.
    Four times the threads: a PS's workers each push and pull at once (its threads are sized
    for that), and the queue absorbs bursts, and a stranger's idle streams until they are
    cancelled (:mod:`pytest_tfgrpc.roles.idle`)."""
    return 4 * threads


CHANNEL_OPTIONS: Final = (
    *COMMON_OPTIONS,
    # Each benchmark gets its own connection, never one shared with another channel.
    ("grpc.use_local_subchannel_pool", 1),
)

#: Metadata key announcing the size of one streamed message, in bytes.
MESSAGE_BYTES_KEY: Final = "x-tfgrpc-message-bytes"

PROTOBUF_SERVICE: Final = "tfgrpc.TensorService"
RAW_SERVICE: Final = "tfgrpc.RawTensorService"
MODES: Final = ("raw", "protobuf")


def method(mode: str, name: str) -> str:
    """The full method path of ``name`` in the service of ``mode`` ("raw" or "protobuf")."""
    if mode == "raw":
        return f"/{RAW_SERVICE}/{name}"
    if mode == "protobuf":
        return f"/{PROTOBUF_SERVICE}/{name}"
    raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
