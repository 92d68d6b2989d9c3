"""Idle calls timed out on the handler side: a stream whose next request message does not come.

gRPC's synchronous Python server gives each call a handler thread before its request message
arrives, and waits for that message there without a bound: a stranger who opens streams and
sends only their headers holds every handler thread (16 idle streams stopped a 16-thread tensor
server). The tensor service therefore reads its requests as streams through :class:`IdleWatch`,
which cancels a call whose next message has not arrived within the idle bound; the thread is
free again, and the client, if it was one, sees CANCELLED.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from typing import TypeVar

import grpc

__all__ = ["IDLE_STREAM_S", "IdleWatch"]

T = TypeVar("T")

#: How long a call may wait for its next request message. Longer than one message of the
#: largest tensor takes on the slowest link the tests use (1.5 MiB at 1 Mbit/s: 13 s).
IDLE_STREAM_S = 30.0


class IdleWatch:
    """Cancels calls whose next request message has not come within ``idle_s`` seconds; one
    watcher thread per server, started with the first call."""

    def __init__(self, idle_s: float = IDLE_STREAM_S) -> None:
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._waiting: dict[int, tuple[float, grpc.ServicerContext]] = {}
        self._keys = itertools.count()
        self._thread: threading.Thread | None = None

    def next(self, requests: Iterator[T], context: grpc.ServicerContext) -> T | None:
        """The next message of ``requests`` (None: the client sent no more), cancelling the
        call if it does not come in time (then gRPC's RpcError ends the handler)."""
        key = next(self._keys)
        with self._lock:
            self._waiting[key] = (time.monotonic() + self.idle_s, context)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._watch, name="tfgrpc-idle-watch", daemon=True
                )
                self._thread.start()
        try:
            return next(requests, None)
        finally:
            with self._lock:
                del self._waiting[key]

    def iterate(self, requests: Iterator[T], context: grpc.ServicerContext) -> Iterator[T]:
        """Every message of ``requests``, each under the idle bound."""
        while (request := self.next(requests, context)) is not None:
            yield request

    def _watch(self) -> None:
        tick = min(1.0, self.idle_s / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self._lock:
                late = [context for due, context in self._waiting.values() if due <= now]
            for context in late:
                context.cancel()
