"""One measurement at a time on a host: across pytest-xdist workers and across runs.

Processes measuring at once on the same machine share its cores and its network stack, so
each would measure the other. Tests that start servers or measure hold one lock, a ``flock``
on a file every pytest-tfgrpc run of the host shares, from their setup to their teardown. The
holder writes its run id into the file, so that a test that had to wait can say whose
measurement it waited for (another run's, or only a worker of its own run).
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path
from types import TracebackType

HOST_LOCK_ENV = "TFGRPC_HOST_LOCK"


def lock_path(run_id: str = "") -> Path:
    """The lock file every run of this host shares (``$TFGRPC_HOST_LOCK`` to choose another);
    ``run_id`` is accepted for the old per-run lock's callers and ignored."""
    del run_id
    given = os.environ.get(HOST_LOCK_ENV)
    return Path(given) if given else Path(tempfile.gettempdir()) / "pytest-tfgrpc-host.lock"


class MeasurementLock:
    """An exclusive lock on ``path``, held while a benchmark test runs; not re-entrant.

    After entering, ``waited_s`` is how long it waited, and ``waited_for`` the run id the
    holder had written ("" when it did not wait)."""

    def __init__(self, path: Path, run_id: str = "") -> None:
        self.path = path
        self.run_id = run_id
        self.waited_s = 0.0
        self.waited_for = ""
        self._fd: int | None = None

    def __enter__(self) -> MeasurementLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self.waited_for = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
                start = time.monotonic()
                fcntl.flock(fd, fcntl.LOCK_EX)
                self.waited_s = time.monotonic() - start
            os.ftruncate(fd, 0)
            os.pwrite(fd, self.run_id.encode(), 0)
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
