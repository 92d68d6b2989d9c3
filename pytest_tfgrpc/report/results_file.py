"""The results file: every finished test's figures, on disk as soon as the test ends.

pytest writes its JUnit XML once, at the end of the session, and not at all when the run is
killed outright (SIGKILL; SIGTERM the plugin turns into Ctrl-C, which pytest survives); a
crashed pytest-xdist worker takes the figures of the test
it was running with it. :class:`ResultLog` appends one JSON object per finished test to a
JSON-lines file, written, flushed and fsync'ed before the next test starts, so a killed run
keeps every result it finished. Several processes (xdist workers) may append to one file:
every line reaches the file whole, and never interleaved with another.

:func:`read_results` reads such a file back, skipping (and counting) a line cut short by a
kill; :func:`atomic_write` writes a final file (JUnit XML, a plot) so that readers see either
the old file or the complete new one, never half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import numbers
import os
import select
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ResultLog",
    "ResultRecords",
    "atomic_write",
    "plain",
    "read_results",
]

#: Writes up to this size are atomic for pipes (POSIX); a regular file opened with O_APPEND
#: places each write at its end as one unit. Longer lines are written under an exclusive lock.
PIPE_BUF = select.PIPE_BUF

#: Every line starts with this, which lets :func:`read_results` find a whole record that
#: follows the remains of a line cut short by a kill.
_LINE_START = '{"test": '

Properties = Mapping[str, object] | Iterable[tuple[str, object]]


def plain(value: object) -> Any:
    """``value`` as a plain JSON type: str, int, float, bool, None, or lists and dicts of them.

    numpy scalars (and anything else that is a number) become ``int``, ``float`` or ``bool``
    and numpy arrays lists; a float that is not finite becomes its text (``"nan"``, ``"inf"``),
    which JSON cannot hold; anything else becomes ``str(value)``.
    """
    if value is None or type(value) in (str, int, bool):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        number = float(value)
        return number if math.isfinite(number) else str(number)
    to_list = getattr(value, "tolist", None)
    if type(value).__module__ == "numpy" and callable(to_list):
        # numpy.bool_ is not a numbers.Integral; tolist() gives builtins, arrays included.
        return plain(to_list())
    if isinstance(value, Mapping):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return str(value)


def _split_properties(properties: Properties) -> tuple[dict[str, Any], list[list[Any]]]:
    """Properties as ``{name: value}``, and any later value of a name already seen."""
    pairs = properties.items() if isinstance(properties, Mapping) else properties
    named: dict[str, Any] = {}
    repeated: list[list[Any]] = []
    for name, value in pairs:
        key = str(name)
        if key in named:
            # A test may record a name twice (two fabrics in one test): keep both values.
            repeated.append([key, plain(value)])
        else:
            named[key] = plain(value)
    return named, repeated


class ResultLog:
    """An append-only JSON-lines file of finished tests, safe to share between processes.

    Each :meth:`append` writes one line with a single ``os.write`` on a file descriptor opened
    with ``O_APPEND``, then fsyncs it; a line longer than ``PIPE_BUF`` is written under an
    exclusive ``flock`` that every writer of the file takes for long lines. If the file ends
    in a line cut short (an earlier run was killed while writing), the first append starts a
    new line so that its record is not glued to those remains.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, fsync: bool = True, run_id: str = ""
    ) -> None:
        self.run_id = run_id
        self.path = Path(path)
        self._fsync = fsync
        self._fd: int | None = os.open(
            self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
        )
        try:
            self.end_partial_line()
        except BaseException:
            self.close()
            raise

    def end_partial_line(self) -> None:
        """End the file's last line if a kill or a failed write left it cut short, so the
        next record starts a line of its own. Raises ``OSError`` as writing does."""
        fd = self._require_fd()
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return
            with open(self.path, "rb") as reader:
                reader.seek(size - 1)
                last = reader.read(1)
            if last not in (b"\n", b""):
                os.write(fd, b"\n")
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)

    def _require_fd(self) -> int:
        if self._fd is None:
            raise ValueError(f"the results file {self.path} is closed")
        return self._fd

    def append(
        self,
        test: str,
        *,
        outcome: str,
        duration: float,
        properties: Properties = (),
        when: str = "call",
        worker: str | None = None,
        junit: str | None = None,
        extra: Mapping[str, object] | None = None,
    ) -> dict[str, Any]:
        """Write one finished test; return the record as written.

        ``junit`` is the test's JUnit id (``--junit-prefix`` included), which a baseline read
        from this file names the test by (else it is derived from ``test``, without prefix).

        ``properties`` are the test's ``(name, value)`` pairs (``item.user_properties``) or a
        mapping; values are made plain JSON (:func:`plain`). A name given twice keeps its
        first value under ``properties`` and the later ones under ``repeated``. ``extra``
        keys (e.g. ``reruns``) are added to the record. Raises ``OSError`` when the write
        fails (a full disk); the file then may end in a cut line, which the next
        :meth:`end_partial_line` ends.
        """
        named, repeated = _split_properties(properties)
        record: dict[str, Any] = {
            "test": str(test),
            "outcome": str(outcome),
            "duration": plain(duration),
            "properties": named,
            "when": str(when),
            "worker": None if worker is None else str(worker),
        }
        if junit is not None:
            record["junit"] = str(junit)
        if self.run_id:
            record["run"] = self.run_id
        if repeated:
            record["repeated"] = repeated
        record.update({str(key): value for key, value in (extra or {}).items()})
        self.write_line(record)
        return record

    def write_line(self, record: Mapping[str, Any]) -> None:
        """Write one record (its ``test`` key first) as one line, made plain JSON."""
        fd = self._require_fd()
        body = {"test": str(record.get("test", ""))}
        body.update({str(key): plain(value) for key, value in record.items() if key != "test"})
        line = (json.dumps(body, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
        if len(line) <= PIPE_BUF:
            self._write_all(fd, line)
        else:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._write_all(fd, line)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        if self._fsync:
            os.fsync(fd)

    @staticmethod
    def _write_all(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def close(self) -> None:
        """Close the file; later appends raise ``ValueError``. Closing twice is harmless."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ResultRecords(list[dict[str, Any]]):
    """The records of a results file, in file order; ``skipped`` counts the lines that held
    no whole record, and ``problems`` says which lines they were and why."""

    def __init__(self, records: Iterable[dict[str, Any]], problems: Iterable[str] = ()) -> None:
        super().__init__(records)
        self.problems: tuple[str, ...] = tuple(problems)

    @property
    def skipped(self) -> int:
        return len(self.problems)


def _parse_record(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_results(path: str | os.PathLike[str]) -> ResultRecords:
    """Read a results file written by :class:`ResultLog`: one dict per finished test.

    A line that is not a whole JSON object (the last line of a run killed mid-write, or
    remains of one followed by a later run's record) is skipped and counted in
    ``.skipped``; a whole record found after such remains is kept. Blank lines are ignored.
    A missing file raises ``FileNotFoundError``.
    """
    data = Path(path).read_bytes()
    records: list[dict[str, Any]] = []
    problems: list[str] = []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        text = raw.decode("utf-8", "replace")
        record = _parse_record(text)
        if record is not None:
            records.append(record)
            continue
        start = text.rfind(_LINE_START)
        recovered = _parse_record(text[start:]) if start > 0 else None
        if recovered is not None:
            records.append(recovered)
        cut = number == len(lines)  # no end of line after it: cut short while being written
        why = "cut short (no end of line)" if cut else "not a whole JSON object"
        problems.append(f"line {number}: {why}: {text[:60]!r}")
    return ResultRecords(records, problems)


def atomic_write(path: str | os.PathLike[str], data: bytes | str) -> Path:
    """Replace ``path`` with ``data`` (text is written as UTF-8) in one step.

    The data goes to a temporary file in the same directory, is fsync'ed, and is renamed over
    ``path``; the directory is fsync'ed too so the rename survives a crash. Readers see the
    old file or the new one, never a part. The new file gets the usual permissions (0666 less
    the umask), not the temporary file's 0600. Returns ``path``.
    """
    target = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    directory = target.parent
    fd, temp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        try:
            view = memoryview(payload)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o666 & ~_umask())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    with contextlib.suppress(OSError):  # some file systems cannot open a directory
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    return target


def _umask() -> int:
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    # os.umask can only be read by setting it; set it straight back.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
