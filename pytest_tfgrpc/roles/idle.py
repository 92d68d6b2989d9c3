"""Idle calls timed out on the handler side: a stream whose next request message does not come.

gRPC's synchronous Python server gives each call a handler thread before its request message
arrives, and waits for that message there without a bound: a stranger who opens streams and
sends only their headers holds every handler thread (16 idle streams stopped a 16-thread tensor
server). The tensor and PS services therefore read their requests as streams (the wire is the
same for a unary client) through :class:`IdleWatch`, which cancels a call whose next message has
not arrived within the idle bound; the thread is free again, and the client, if it was one, sees
CANCELLED.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import grpc

__all__ = ["IDLE_STREAM_S", "IdleWatch"]

T = TypeVar("T")

#: A handler's own check of a call, run before its first request message is read (the PS's
#: token check: a stranger's call is refused unread).
Check = Callable[[grpc.ServicerContext], None]

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
        call if it does not come in time; a cancelled call ends the handler (CANCELLED)."""
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
        except grpc.RpcError as error:
            # The call was cancelled (by its client, its deadline or this watch). grpcio keeps
            # this error in the call's state, and its traceback's frames hold that state: a
            # reference cycle that keeps the call, and with it its HTTP/2 stream, until the
            # cyclic collector runs, which an idle server may never do. Counted against
            # the connection's stream bound, 16 such calls left it refusing every call.
            error.__traceback__ = None
        finally:
            with self._lock:
                del self._waiting[key]
        # Outside the except block, so the new error does not chain the old one.
        context.abort(grpc.StatusCode.CANCELLED, "the call was cancelled")
        raise AssertionError("not reached: abort raises")

    def iterate(self, requests: Iterator[T], context: grpc.ServicerContext) -> Iterator[T]:
        """Every message of ``requests``, each under the idle bound."""
        while (request := self.next(requests, context)) is not None:
            yield request

    def first(
        self, fn: Callable[[Any, grpc.ServicerContext], T], check: Check | None = None
    ) -> Callable[[Iterator[Any], grpc.ServicerContext], T]:
        """A stream handler calling ``fn(request, context)`` with the call's one request
        message, read under the idle bound after ``check(context)``; a call without a
        message is refused (INVALID_ARGUMENT)."""

        def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> T:
            if check is not None:
                check(context)
            request = self.next(requests, context)
            if request is None:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a call without a request")
            return fn(request, context)

        return handle

    def each(
        self, fn: Callable[[Iterator[Any], grpc.ServicerContext], T], check: Check | None = None
    ) -> Callable[[Iterator[Any], grpc.ServicerContext], T]:
        """A stream handler calling ``fn(messages, context)`` with the call's request
        messages, each read under the idle bound, after ``check(context)``."""

        def handle(requests: Iterator[Any], context: grpc.ServicerContext) -> T:
            if check is not None:
                check(context)
            return fn(self.iterate(requests, context), context)

        return handle

    def _watch(self) -> None:
        tick = min(1.0, self.idle_s / 4)
        while True:
            time.sleep(tick)
            now = time.monotonic()
            with self._lock:
                late = [context for due, context in self._waiting.values() if due <= now]
            for context in late:
                context.cancel()
