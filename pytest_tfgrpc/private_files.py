"""Files the plugin keeps on a host others use: only in directories of this user alone.

A fixed name in ``/tmp`` is a name any local user can take first: as a symlink to a file the
next (root) run then overwrites, or as a file whose ``flock`` a stranger holds forever. So
every such file lives in a directory that is this user's alone (mode 0700: root's in
``/run``, another user's in ``$XDG_RUNTIME_DIR`` or ``/tmp/pytest-tfgrpc-<uid>``), made if
missing and checked if present (a directory, not a link, owned by this user, no access for
others), and files in it are opened without following links and checked on the open file
(regular, this user's) before anything is written.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["PrivatePathError", "check_private_dir", "open_private", "private_dir"]


class PrivatePathError(OSError):
    """A shared path is not this user's alone (a link, another owner, others may access it)."""


def _base() -> Path:
    if os.geteuid() == 0 and os.access("/run", os.W_OK):
        return Path("/run")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_absolute():
        return Path(runtime)
    return Path(tempfile.gettempdir())


def private_dir(name: str = "pytest-tfgrpc") -> Path:
    """This user's directory ``name`` (``/run/NAME`` for root, ``$XDG_RUNTIME_DIR/NAME`` or
    ``/tmp/NAME-<uid>`` for others), made with mode 0700 if missing. Raises
    :class:`PrivatePathError` when it exists but is not this user's alone."""
    base = _base()
    path = base / (name if base != Path(tempfile.gettempdir()) else f"{name}-{os.geteuid()}")
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    check_private_dir(path)
    return path


def check_private_dir(path: Path) -> None:
    """Raise :class:`PrivatePathError` unless ``path`` is a directory (not a link) owned by
    this user that nobody else may enter, list or change."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PrivatePathError(f"{path} is not a directory (a link or a file): refusing to use it")
    if info.st_uid != os.geteuid():
        raise PrivatePathError(
            f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()}): "
            "refusing to use it"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise PrivatePathError(
            f"{path} is open to others (mode {mode:04o}): run chmod 700 {path}, or remove it"
        )


def open_private(path: Path, flags: int = os.O_RDWR) -> int:
    """A descriptor of the file ``path`` (created with mode 0600 if missing), opened without
    following a link and checked on the open file: a regular file owned by this user. Never
    truncates. Raises :class:`PrivatePathError` (an ``OSError``)."""
    try:
        fd = os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PrivatePathError(f"{path} is a symbolic link: refusing to follow it") from None
        raise PrivatePathError(f"{path}: {exc.strerror or exc}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise PrivatePathError(
            f"{path} is not a regular file of this user (uid {info.st_uid}): refusing to use it"
        )
    os.set_blocking(fd, True)
    return fd
