"""Running the native measuring client, and reading the samples it writes.

The client (``native/src/client.cc``) measures one message size against one server and writes
every sample to stdout as int64 nanoseconds, in this little-endian form (also what
:func:`encode_run` writes, so the Python engine's stream workers share the reader):

``b"TFGN"``, u32 version (1), u32 streams; i64 size_bytes, wire_bytes, wall_ns,
client_user_ns, client_system_ns, server_user_ns, server_system_ns; then per stream:
i64 count, i64 elapsed_ns, i64 start_ns (after the earliest stream's start), count x i64.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.native import binaries
from pytest_tfgrpc.results import CpuTime

MAGIC = b"TFGN"
VERSION = 1
_HEAD = struct.Struct("<4sII7q")
_STREAM = struct.Struct("<3q")
#: The letter that opens the client's line on its pause socket (``--pause-fd``) per phase.
_PHASES = {"s": "start", "e": "end"}


@dataclass(frozen=True)
class ClientPause:
    """What the client told at a pause (``--pause-fd``), while it waits with its connections
    open.

    ``phase``: ``start`` or ``end`` of its measured phase; ``pid``: the client's process id;
    ``ends``: its measured connections' ends, ``(local, peer)`` each as ``address:port`` or
    ``[v6]:port`` (its streams', not its status channel's); ``run_queue_wait_ns``: its
    threads' run-queue wait so far, as it read it itself (ns; None where it could not);
    ``read_ns``: what telling all that took it (ns: the telemetry's cost in the client).
    """

    phase: str
    pid: int
    ends: tuple[tuple[str, str], ...]
    run_queue_wait_ns: int | None
    read_ns: int


#: Called at each pause; the client goes on when it returns.
Pause = Callable[[ClientPause], None]


class NativeClientError(RuntimeError):
    """The native client failed: a call failed or was answered wrongly, or it could not run."""


@dataclass(frozen=True, eq=False)
class StreamSamples:
    """One stream's measured phase: every sample (ns), its wall time, and its start (ns after
    the earliest stream's start)."""

    samples_ns: npt.NDArray[np.int64]
    elapsed_ns: int
    start_ns: int


@dataclass(frozen=True, eq=False)
class NativeRun:
    """What one client run measured: one message size, one or more concurrent streams.

    ``wall_ns`` spans from the earliest stream's measured start to the latest one's end;
    ``cpu`` covers the measured phase per role, as :class:`~pytest_tfgrpc.results.SizeResult`
    holds it: ``client`` (the client process, all streams) and ``server``.
    """

    size_bytes: int
    wire_bytes: int
    wall_ns: int
    cpu: Mapping[str, CpuTime]
    streams: tuple[StreamSamples, ...]


@dataclass(frozen=True)
class ClientSettings:
    """The run settings handed to the native client (see ``tfgrpc-native-client``'s flags).

    ``benchmark`` is ``latency`` (echo) or ``bandwidth`` (push or pull); ``max_seconds`` is
    the measured phase's time limit; ``deadline_s`` bounds each call (each stream, for the
    stream RPCs, which stay open for the whole run).
    """

    target: str
    benchmark: str
    mode: str
    rpc: str
    size: int
    dtype: str
    iterations: int
    warmup: int
    max_seconds: float
    warmup_seconds: float
    deadline_s: float
    direction: str = "push"
    chunk_bytes: int = 1 << 20
    streams: int = 1

    def argv(self) -> list[str]:
        pairs = {
            "--target": self.target,
            "--benchmark": self.benchmark,
            "--mode": self.mode,
            "--rpc": self.rpc,
            "--direction": self.direction,
            "--size": str(self.size),
            "--dtype": self.dtype,
            "--iterations": str(self.iterations),
            "--warmup": str(self.warmup),
            "--max-seconds": repr(self.max_seconds),
            "--warmup-seconds": repr(self.warmup_seconds),
            "--chunk-bytes": str(self.chunk_bytes),
            "--deadline-s": repr(self.deadline_s),
            "--streams": str(self.streams),
        }
        return [part for pair in pairs.items() for part in pair]

    @property
    def timeout_s(self) -> float:
        """The most one client run may take before it is killed: every stream connecting,
        warming up and measuring, plus a minute."""
        return 10.0 + self.warmup_seconds + self.max_seconds + self.deadline_s + 60.0


def encode_run(run: NativeRun) -> bytes:
    """``run`` in the client's binary form."""
    none = CpuTime(0, 0)
    client, server = run.cpu.get("client", none), run.cpu.get("server", none)
    out = [
        _HEAD.pack(
            MAGIC,
            VERSION,
            len(run.streams),
            run.size_bytes,
            run.wire_bytes,
            run.wall_ns,
            client.user_ns,
            client.system_ns,
            server.user_ns,
            server.system_ns,
        )
    ]
    for stream in run.streams:
        samples = np.ascontiguousarray(stream.samples_ns, dtype="<i8")
        out.append(_STREAM.pack(len(samples), stream.elapsed_ns, stream.start_ns))
        out.append(samples.tobytes())
    return b"".join(out)


def decode_run(data: bytes) -> NativeRun:
    """Read the client's binary output; :class:`NativeClientError` if it is malformed."""
    if len(data) < _HEAD.size:
        raise NativeClientError(f"native client output of {len(data)} B is too short")
    magic, version, count, size, wire, wall, *cpu = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise NativeClientError(f"native client output starts {magic!r} v{version}, not TFGN v1")
    pos = _HEAD.size
    streams = []
    for _ in range(count):
        if pos + _STREAM.size > len(data):
            raise NativeClientError("native client output ends inside a stream header")
        n, elapsed, start = _STREAM.unpack_from(data, pos)
        pos += _STREAM.size
        if n < 0 or pos + 8 * n > len(data):
            raise NativeClientError(f"native client output ends inside {n} samples")
        samples = np.frombuffer(data, dtype="<i8", count=n, offset=pos).astype(np.int64)
        pos += 8 * n
        streams.append(StreamSamples(samples, elapsed, start))
    if pos != len(data):
        raise NativeClientError(f"native client output has {len(data) - pos} B left over")
    cpu_by_role = {"client": CpuTime(cpu[0], cpu[1]), "server": CpuTime(cpu[2], cpu[3])}
    return NativeRun(size, wire, wall, cpu_by_role, tuple(streams))


def run_client(
    settings: ClientSettings,
    *,
    extra_argv: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    pause: Pause | None = None,
) -> NativeRun:
    """Run the native client once, in ``env`` (None: this process's; its TLS setting travels
    as ``$TFGRPC_TLS_*``), and return what it measured. ``pause`` is called when every stream
    is warm and again when every measured loop has ended, while the client waits with its
    connections open (``--pause-fd``): to read their TCP state outside the measured loops.

    Raises :class:`~pytest_tfgrpc.native.NativeNotBuilt` if the engine is not built, and
    :class:`NativeClientError` with the client's own message if it fails or runs past
    :attr:`ClientSettings.timeout_s` (it is killed then). An exception ``pause`` raised is
    raised once the client has ended (it is answered meanwhile, so that it ends).
    """
    argv = [str(binaries().client), *settings.argv(), "--exit-on-stdin-eof", *extra_argv]
    ours, theirs = socket.socketpair() if pause is not None else (None, None)
    if theirs is not None:
        argv += ["--pause-fd", str(theirs.fileno())]
    # Its stdin is a pipe this process holds open until the client ends: if this process dies,
    # the pipe closes and the client exits at once instead of finishing its run.
    lifeline, keep = os.pipe()
    failed: list[BaseException] = []
    try:
        process = subprocess.Popen(
            argv,
            stdin=lifeline,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            pass_fds=(theirs.fileno(),) if theirs is not None else (),
        )
        answering = None
        if ours is not None and theirs is not None and pause is not None:
            theirs.close()  # the client's now: its exit ends the answering thread's reads
            answering = threading.Thread(
                target=_answer, args=(ours, pause, process.pid, failed), daemon=True
            )
            answering.start()
        try:
            stdout, stderr = process.communicate(timeout=settings.timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise NativeClientError(
                f"the native client did not finish within {settings.timeout_s:g} s and was killed"
            ) from None
        if answering is not None:
            answering.join()
    finally:
        os.close(lifeline)
        os.close(keep)
        for end in (ours, theirs):
            if end is not None:
                end.close()
    if process.returncode != 0:
        message = stderr.decode("utf-8", "replace").strip() or "no message"
        raise NativeClientError(message)
    if failed:
        raise failed[0]
    return decode_run(stdout)


def parse_pause(line: str, pid: int) -> ClientPause:
    """The :class:`ClientPause` of one line the client wrote at a pause: the phase's letter,
    then `` w<ns>`` (its run-queue wait), `` r<ns>`` (what the line took it) and
    `` local>peer`` per measured connection; a token it does not know is left out."""
    letter, *tokens = line.split(" ")
    waited: int | None = None
    read_ns = 0
    ends = []
    for token in tokens:
        near, _, far = token.partition(">")
        if far:
            ends.append((near, far))
        elif token[:1] in ("w", "r") and token[1:].isdigit():
            if token[0] == "w":
                waited = int(token[1:])
            else:
                read_ns = int(token[1:])
    return ClientPause(_PHASES.get(letter, letter), pid, tuple(ends), waited, read_ns)


def _answer(sock: socket.socket, pause: Pause, pid: int, failed: list[BaseException]) -> None:
    """Call ``pause`` at each phase the client reports on ``sock`` (a line:
    :func:`parse_pause`) and let it go on, until it closes its end; what ``pause`` raises is
    kept in ``failed``."""
    pending = b""
    while chunk := sock.recv(1 << 16):
        pending += chunk
        while b"\n" in pending:
            line, _, pending = pending.partition(b"\n")
            told = parse_pause(line.decode("ascii", "replace"), pid)
            try:
                pause(told)
            except Exception as error:  # raised in the caller's thread once the client ends
                failed.append(error)
            try:
                sock.sendall(b"g")
            except OSError:
                return  # the client is gone
