"""Lockstep turns between two processes: the measured rounds of two sides alternate in time.

``tfgrpc-ab --interleave rounds`` starts both sides of a pair at once and runs a
:class:`Turnstile` on a unix socket in a private directory; each side's benchmark loops call
:func:`take_turn` before every measured round (:mod:`pytest_tfgrpc.bench.p2p`; a P2P size,
PS point, sync-SGD run or all-reduce size where the benchmark has no rounds), and the
plugin calls :func:`join` once with the path in :data:`ENV_PATH`. A side holds its turn from
the grant until it asks for the next one, so whatever it does between two rounds (a test's
setup included) happens while the other side waits blocked: after both reached their first
round, the sides never run at once, and a mode of the machine that lasts seconds hits both.

The wire: a side sends ``?`` to ask (which also gives back the turn it held), the turnstile
answers ``!`` to grant. Turns go strictly A, B, A, B; a side that closed its socket (finished
or died) gets no turn and the other runs free. Every wait is bounded: a side whose move it is
and that neither asks nor closes within ``hold_s`` is dropped (its socket closed: it runs
free), and a side waits for a grant at most :data:`ENV_TIMEOUT`'s seconds, then runs free.
"""

from __future__ import annotations

import os
import selectors
import shutil
import socket
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "ENV_PATH",
    "ENV_SIDE",
    "ENV_TIMEOUT",
    "Turn",
    "TurnClient",
    "Turnstile",
    "join",
    "take_turn",
]

#: The turnstile's socket path, set by ``tfgrpc-ab`` for each side.
ENV_PATH = "TFGRPC_AB_TURNS"
#: The side's name (``A`` or ``B``), sent when it connects.
ENV_SIDE = "TFGRPC_AB_SIDE"
#: How long a side waits for a grant, in seconds, before it runs free.
ENV_TIMEOUT = "TFGRPC_AB_TURN_TIMEOUT"
_ASK, _GRANT = b"?", b"!"


@dataclass(frozen=True)
class Turn:
    """One turn: the side and the monotonic seconds (``time.monotonic``, one clock for every
    process of the machine) when it was granted and given back (the next ask, a close, or
    the drop of a side that held it too long)."""

    side: str
    granted: float
    released: float


class TurnClient:
    """A side's end: :meth:`take` blocks until this side may run its next round.

    Any failure (the turnstile gone, closed on us, a grant not come within ``timeout_s``)
    leaves lockstep for good, with one line on stderr: the side runs free rather than hang.
    """

    def __init__(self, path: str, side: str, timeout_s: float) -> None:
        self._timeout = timeout_s
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(timeout_s)
            self._sock.connect(path)
            self._sock.sendall(side.encode("ascii")[:1])
        except OSError as error:
            self._leave(f"cannot join the turnstile {path}: {error}")

    def _leave(self, why: str) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
            sys.stderr.write(f"tfgrpc: lockstep turns end, this side runs free: {why}\n")

    @property
    def joined(self) -> bool:
        return self._sock is not None

    def take(self) -> None:
        """Give back the turn held (if any) and wait for the next one."""
        if self._sock is None:
            return
        try:
            self._sock.sendall(_ASK)
            got = self._sock.recv(1)
        except OSError as error:  # socket.timeout is an OSError
            self._leave(f"no turn within {self._timeout:g} s ({error or 'timed out'})")
            return
        if got != _GRANT:
            self._leave("the turnstile closed (the other side held its turn too long)")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


_client: TurnClient | None = None


def join(environ: dict[str, str] | None = None) -> None:
    """Join the turnstile named in :data:`ENV_PATH`, if any (once per process)."""
    global _client
    env = os.environ if environ is None else environ
    path = env.get(ENV_PATH)
    if not path or _client is not None:
        return
    _client = TurnClient(path, env.get(ENV_SIDE, "?"), float(env.get(ENV_TIMEOUT, "600")))


def take_turn() -> None:
    """Before a measured round: wait for this side's turn (no-op outside lockstep)."""
    if _client is not None:
        _client.take()


def leave() -> None:
    """Give up the turn for good (end of the run): the other side runs free."""
    global _client
    if _client is not None:
        _client.close()
        _client = None


_SOCKET = "turns.sock"
#: The longest path a unix socket binds to on Linux (``sun_path``: 108 bytes with its NUL).
_SUN_PATH_MAX = 107


def _socket_dir() -> str:
    """A new private (0700) directory for the turnstile's socket: in the temporary directory,
    or in /tmp where that one's path is too long for a socket (a CI runner's $TMPDIR)."""
    made = tempfile.mkdtemp(prefix="tfgrpc-turns-")
    if len(os.fsencode(os.path.join(made, _SOCKET))) <= _SUN_PATH_MAX or not os.path.isdir("/tmp"):
        return made
    os.rmdir(made)
    return tempfile.mkdtemp(prefix="tfgrpc-turns-", dir="/tmp")


class Turnstile:
    """The parent's end: grants turns to two sides, ``A`` and ``B``, strictly alternately.

    Use as a context manager; :attr:`path` is the socket (in a private 0700 directory) to pass
    in :data:`ENV_PATH`. :meth:`turns` lists the turns granted so far. ``hold_s``: how long the
    side whose move it is may take before it is dropped (seconds > 0).
    """

    def __init__(self, hold_s: float) -> None:
        self._hold = hold_s
        self._dir = _socket_dir()
        self.path = str(Path(self._dir) / _SOCKET)
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(self.path)
        except OSError:
            self._listener.close()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._listener.listen(4)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._stop_r, self._stop_w = socket.socketpair()
        self._selector.register(self._stop_r, selectors.EVENT_READ)
        self._sides: dict[str, socket.socket] = {}
        self._pending: list[socket.socket] = []  # connected, name not read yet
        self._waiting: set[str] = set()
        self._holder: str | None = None
        self._granted_at = 0.0
        self._last: str | None = None  # the side granted last
        self._since = time.monotonic()  # when the side whose move it is got that move
        self._turns: list[Turn] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="tfgrpc-turnstile", daemon=True)

    def __enter__(self) -> Turnstile:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop_w.send(b"x")
        self._thread.join(timeout=10)
        for sock in [*self._sides.values(), *self._pending]:
            sock.close()
        self._selector.close()
        for sock in (self._listener, self._stop_r, self._stop_w):
            sock.close()
        # the directory also holds what the sides put there (tfgrpc-ab: their host locks)
        shutil.rmtree(self._dir, ignore_errors=True)

    def turns(self) -> list[Turn]:
        with self._lock:
            return list(self._turns)

    def _release(self, side: str, now: float) -> None:
        if self._holder == side:
            with self._lock:
                self._turns.append(Turn(side, self._granted_at, now))
            self._holder = None
            self._since = now

    def _drop(self, side: str, now: float) -> None:
        self._release(side, now)
        sock = self._sides.pop(side)
        self._selector.unregister(sock)
        sock.close()
        self._waiting.discard(side)

    def _next(self) -> str | None:
        """The side whose move it is: the holder, else the side not granted last."""
        if self._holder is not None:
            return self._holder
        others = [s for s in self._sides if s != self._last]
        return others[0] if others else None

    def _grant(self, now: float) -> None:
        if self._holder is not None or not self._waiting:
            return
        due = self._next()
        side = due if due in self._waiting else None
        if side is None and (due is None or due not in self._sides):
            side = next(iter(self._waiting))
        if side is None:
            return
        try:
            self._sides[side].sendall(_GRANT)
        except OSError:
            self._drop(side, now)
            return
        self._waiting.discard(side)
        self._holder, self._granted_at, self._last, self._since = side, now, side, now

    def _serve(self) -> None:
        while True:
            for key, _ in self._selector.select(timeout=min(self._hold, 1.0)):
                now = time.monotonic()
                sock = key.fileobj
                if sock is self._stop_r:
                    return
                if sock is self._listener:
                    conn, _ = self._listener.accept()
                    self._pending.append(conn)
                    self._selector.register(conn, selectors.EVENT_READ)
                    continue
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(64)
                except OSError:
                    data = b""
                if sock in self._pending:
                    self._pending.remove(sock)
                    name = data[:1].decode("ascii", "replace")
                    if not data or name in self._sides or name not in ("A", "B"):
                        self._selector.unregister(sock)
                        sock.close()
                        continue
                    self._sides[name] = sock
                    data = data[1:]
                    if not data:
                        continue
                side = next(s for s, c in self._sides.items() if c is sock)
                if not data:
                    self._drop(side, now)
                    continue
                for _ in range(data.count(_ASK)):
                    self._release(side, now)
                    self._waiting.add(side)
            now = time.monotonic()
            due = self._next()
            if (
                due is not None
                and due not in self._waiting
                and self._waiting - {due}
                and now - self._since > self._hold
            ):
                self._drop(due, now)
            self._grant(now)
