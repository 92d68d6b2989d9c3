"""One measurement at a time on a host: across pytest-xdist workers, runs and tfgrpc-ab pairs.

Processes measuring at once on the same machine share its cores and its network stack, so
each would measure the other. Tests that start servers or measure hold one lock, a ``flock``
on a file every pytest-tfgrpc run of this user shares (root's runs among themselves), from
their setup to their teardown. The file lives in this user's private directory
(:mod:`pytest_tfgrpc.private_files`), so no other user can plant a link there or hold the
lock. The holder writes its run id and process id into the file, so that a test that had to
wait can say whose measurement it waited for, and a wait that lasts too long names the holder.
``tfgrpc-ab --interleave rounds`` holds it for each pair, whose two sides then measure under
locks of their own.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

from pytest_tfgrpc.private_files import PrivatePathError, open_private, private_dir

__all__ = [
    "DEFAULT_WAIT_S",
    "HOST_LOCK_ENV",
    "HOST_LOCK_WAIT_ENV",
    "LockTimeoutError",
    "MeasurementLock",
    "PrivatePathError",
    "lock_path",
    "lock_wait_s",
]

HOST_LOCK_ENV = "TFGRPC_HOST_LOCK"
HOST_LOCK_WAIT_ENV = "TFGRPC_HOST_LOCK_WAIT"
#: How long a test waits for another's measurement before it fails, unless told otherwise.
DEFAULT_WAIT_S = 900.0
_POLL_S = 0.05


class LockTimeoutError(TimeoutError):
    """The lock was held by another measurement for longer than the wait allowed."""


def lock_path() -> Path:
    """The lock file this user's runs share: ``$TFGRPC_HOST_LOCK`` if set, else
    ``host.lock`` in :func:`~pytest_tfgrpc.private_files.private_dir`. Raises
    :class:`~pytest_tfgrpc.private_files.PrivatePathError` when that directory is not
    this user's alone."""
    given = os.environ.get(HOST_LOCK_ENV)
    return Path(given) if given else private_dir() / "host.lock"


def lock_wait_s() -> float:
    """The longest wait for the lock (``$TFGRPC_HOST_LOCK_WAIT`` seconds, else 900);
    ValueError for a value that is not a positive, finite number."""
    text = os.environ.get(HOST_LOCK_WAIT_ENV, "")
    if not text:
        return DEFAULT_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"{HOST_LOCK_WAIT_ENV}={text!r}: a positive number of seconds")
    return value


class MeasurementLock:
    """An exclusive lock on ``path``, held while a benchmark test runs; not re-entrant.

    Waits at most ``wait_s`` seconds for it, then raises :class:`LockTimeoutError` naming
    the holder (its run id and process id, as it wrote them). A ``path`` that is a link or
    another user's file raises :class:`~pytest_tfgrpc.private_files.PrivatePathError`.
    After entering, ``waited_s`` is how long it waited, and ``waited_for`` the run id the
    holder had written ("" when it did not wait)."""

    def __init__(self, path: Path, run_id: str = "", *, wait_s: float = DEFAULT_WAIT_S) -> None:
        self.path = path
        self.run_id = run_id
        self.wait_s = wait_s
        self.waited_s = 0.0
        self.waited_for = ""
        self._fd: int | None = None

    def _holder(self, fd: int) -> tuple[str, str]:
        run, _, pid = os.pread(fd, 200, 0).decode("utf-8", "replace").strip().partition(" pid ")
        return run, pid

    def __enter__(self) -> MeasurementLock:
        fd = open_private(self.path)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.waited_for, _ = self._holder(fd)
                start = time.monotonic()
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() - start > self.wait_s:
                            run, pid = self._holder(fd)
                            holder = f"run {run or '?'} (pid {pid or '?'})"
                            raise LockTimeoutError(
                                f"the measurement lock {self.path} is held by {holder} for "
                                f"more than {self.wait_s:g} s (${HOST_LOCK_WAIT_ENV}); is "
                                "that run stuck?"
                            ) from None
                        time.sleep(_POLL_S)
                self.waited_s = time.monotonic() - start
            # The file is this user's (open_private checked it): rewriting it is safe.
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{self.run_id} pid {os.getpid()}".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
