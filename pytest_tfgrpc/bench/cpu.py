"""CPU time of the measuring process and of the server, over a measured phase only."""

from __future__ import annotations

from pytest_tfgrpc.results import CpuTime, process_cpu_ns
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.security import open_channel


class CpuProbe:
    """Reads CPU times when a measured phase starts and ends (never inside it).

    The client's figure is this whole process (grpc's threads included); the server's comes
    from its Status RPC, on a channel of the probe's own.
    """

    def __init__(self, target: str) -> None:
        self._channel = open_channel(target, grpc_settings.CHANNEL_OPTIONS)
        self._status = self._channel.unary_unary(grpc_settings.method("raw", "Status"))
        self._start: tuple[int, int, int, int] | None = None
        self.usage: dict[str, CpuTime] | None = None

    def _read(self) -> tuple[int, int, int, int]:
        status = service_pb2.ServerStatus.FromString(self._status(b"", timeout=10))
        return (*process_cpu_ns(), status.cpu_user_ns, status.cpu_system_ns)

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> None:
        if self._start is None:
            raise RuntimeError("CpuProbe.stop() before start()")
        end = self._read()
        used = [b - a for a, b in zip(self._start, end, strict=True)]
        self.usage = {"client": CpuTime(used[0], used[1]), "server": CpuTime(used[2], used[3])}

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> CpuProbe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
