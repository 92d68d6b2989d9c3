"""One measurement at a time across pytest-xdist workers.

Workers measuring at once on the same machine share its cores and its network stack, so
each would measure the other. Tests that start servers or measure hold one lock, a
``flock`` on a file that all workers of a run share, from their setup to their teardown.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from pathlib import Path
from types import TracebackType


def lock_path(run_id: str) -> Path:
    """The lock file shared by every worker of the run ``run_id``."""
    return Path(tempfile.gettempdir()) / f"pytest-tfgrpc-{run_id}.lock"


class MeasurementLock:
    """An exclusive lock on ``path``, held while a benchmark test runs; re-entrant-free."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def __enter__(self) -> MeasurementLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
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
