"""Runs as recorded in JUnit XML: the one reader of test cases and their tfgrpc figures.

A run's figures are the ``tfgrpc.*`` properties of its test cases, read into records by
:mod:`pytest_tfgrpc.report.record`; a point's sketch of its samples is what makes a
significance test possible after the fact.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pytest_tfgrpc.report.record import (
    Key,
    Measurement,
    TestRecord,
    junit_test_id,
    read_record,
    suite_meta,
)

__all__ = [
    "Baseline",
    "BaselineError",
    "JUnitCase",
    "NoFigures",
    "load_baseline",
    "load_history",
    "read_junit",
    "strict_record",
]


class BaselineError(ValueError):
    """A run's JUnit XML that cannot serve for a comparison; the message says which and why."""


class NoFigures(BaselineError):
    """A well-formed JUnit file of ``cases`` named test cases, none with a tfgrpc figure."""

    def __init__(self, message: str, cases: int) -> None:
        super().__init__(message)
        self.cases = cases


@dataclass(frozen=True)
class Baseline:
    """A recorded run: its measurements by :class:`Key`, and its run metadata.

    ``meta`` maps ``tfgrpc.meta.<key>`` properties by ``<key>`` (``host``, ``grpcio``,
    ``fabric.eth0.mtu``); ``hostname`` is the ``<testsuite hostname>`` pytest writes, which
    stands in for ``host`` where the run recorded no metadata. The current run, loaded the same
    way, is a Baseline too.
    """

    source: str
    measurements: Mapping[Key, Measurement]
    meta: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    hostname: str = ""
    #: The test ids that failed (or errored) in the run, where its file says (JUnit XML).
    failed: frozenset[str] = frozenset()

    def setup(self) -> dict[str, str]:
        """``meta``, with ``hostname`` as ``host`` where it records no host."""
        out = dict(self.meta)
        if self.hostname:
            out.setdefault("host", self.hostname)
        return out

    @property
    def fabrics(self) -> frozenset[str]:
        """The fabrics the run measured on."""
        return frozenset(key.fabric for key in self.measurements if key.fabric)

    def for_test(self, test: str) -> dict[Key, Measurement]:
        """The measurements of one test id."""
        return {k: m for k, m in self.measurements.items() if k.test == test}


def strict_record(
    test: str, properties: Iterable[tuple[str, object]], source: str = "current run"
) -> TestRecord:
    """The record of one test (``test`` its JUnit id), read strictly: raises
    :class:`BaselineError` for a figure that is not a number or a sketch or rounds that do not
    decode, naming ``source``, the test and the property."""
    try:
        return read_record(test, properties, strict=True)
    except ValueError as error:
        raise BaselineError(f"{source}: test {test}: {error}") from None


@dataclass(frozen=True)
class JUnitCase:
    """One named test case of a JUnit file: its id (``<classname>.<name>``), properties, and
    whether it failed (a ``<failure>`` or ``<error>``)."""

    test: str
    properties: tuple[tuple[str, str], ...]
    failed: bool = False


@dataclass(frozen=True)
class JUnitRun:
    """A JUnit file's named test cases, its suites' properties and ``hostname``."""

    source: str
    cases: tuple[JUnitCase, ...]
    suite_properties: tuple[tuple[str, str], ...]
    hostname: str


def read_junit(path: str | os.PathLike[str], what: str = "JUnit file") -> JUnitRun:
    """Read a JUnit file (any ``junit_family``; test cases without a name, as an interrupted
    run leaves, are skipped). Raises :class:`BaselineError`, its message starting with
    ``what`` and the path, when the file is missing or unreadable, is not well-formed XML (a
    truncated file is not), or is not JUnit XML."""
    from junitparser import Error, Failure, JUnitXmlError
    from junitparser.xunit2 import JUnitXml

    where = f"{what} {os.fspath(path)}"
    if not os.path.lexists(path):  # lxml says so as an OSError of its own wording
        raise BaselineError(f"{where} does not exist")
    try:
        xml = JUnitXml.fromfile(os.fspath(path), parse_func=_parse_xml)
    except FileNotFoundError:
        raise BaselineError(f"{where} does not exist") from None
    except OSError as error:
        raise BaselineError(f"{where} cannot be read: {error.strerror or error}") from None
    except SyntaxError as error:  # ElementTree's ParseError (and lxml's) derive from it
        if _resource_limit(error):
            raise BaselineError(
                f"{where} exceeds the XML parser's resource limits (the file is not known to "
                f"be corrupt): {error}"
            ) from None
        raise BaselineError(
            f"{where} is not well-formed XML, truncated or corrupt? ({error})"
        ) from None
    except JUnitXmlError:
        raise BaselineError(
            f"{where} is not JUnit XML: its root element is neither <testsuites> nor <testsuite>"
        ) from None
    cases = []
    suite_properties: list[tuple[str, str]] = []
    hostname = ""
    for suite in _suites(xml):
        suite_properties += _properties(suite)
        hostname = hostname or str(suite.hostname or "")
        case: Any
        for case in suite:
            if not getattr(case, "name", None):
                continue
            test = f"{case.classname}.{case.name}" if case.classname else str(case.name)
            failed = any(isinstance(result, (Failure, Error)) for result in case.result)
            cases.append(JUnitCase(test, tuple(_properties(case)), failed))
    return JUnitRun(os.fspath(path), tuple(cases), tuple(suite_properties), hostname)


#: Words of libxml2's messages for a document beyond its limits, not a broken one.
_LIMIT_WORDS = ("huge", "resource limit", "excessive", "too large", "limit exceeded")


def _resource_limit(error: BaseException) -> bool:
    return any(word in str(error).lower() for word in _LIMIT_WORDS)


def _parse_xml(path: str) -> Any:
    """Parse with the library junitparser itself picked (its ``etree``): lxml, when it is
    installed, with ``huge_tree`` so that a text node over 10 MB (the output of a test that
    printed a lot) is read and not rejected as malformed, entities not resolved and no network;
    else the standard library, which has no such limit."""
    from junitparser import junitparser as implementation

    etree: Any = getattr(implementation, "etree")  # noqa: B009 (not re-exported)
    if getattr(etree, "__name__", "").startswith("lxml"):
        parser = etree.XMLParser(huge_tree=True, resolve_entities=False, no_network=True)
        return etree.parse(path, parser)
    return etree.parse(path)


def _suites(xml: Any) -> Iterator[Any]:
    from junitparser.xunit2 import TestSuite

    if isinstance(xml, TestSuite):
        yield xml
    else:
        yield from xml


def load_baseline(path: str | os.PathLike[str], what: str = "baseline") -> Baseline:
    """Read a run's measurements and metadata from its JUnit XML (see :func:`read_junit`).

    Raises :class:`BaselineError`, its message starting with ``what`` and the path, when the
    file cannot be read (:func:`read_junit`), holds a figure that is not a number or a sketch
    that does not decode, or (:class:`NoFigures`) holds no tfgrpc figure at all: a comparison
    never passes for want of a baseline.
    """
    run = read_junit(path, what)
    where = f"{what} {os.fspath(path)}"
    meta = suite_meta([*run.suite_properties, *(p for c in run.cases for p in c.properties)])
    measurements: dict[Key, Measurement] = {}
    for case in run.cases:
        measurements.update(strict_record(case.test, case.properties, where).by_key())
    if not measurements:
        raise NoFigures(
            f"{where} holds no tfgrpc figures ({len(run.cases)} named test cases): was it "
            "written by pytest --junitxml with pytest-tfgrpc benchmarks?",
            len(run.cases),
        )
    return Baseline(
        os.fspath(path),
        MappingProxyType(measurements),
        MappingProxyType(meta),
        run.hostname,
        frozenset(case.test for case in run.cases if case.failed),
    )


def _properties(element: Any) -> list[tuple[str, str]]:
    """The named properties of a junitparser xunit2 test suite or test case."""
    return [(p.name, p.value or "") for p in element.properties() if p.name is not None]


#: How a results file names the run each record belongs to (see :class:`ResultLog`).
RUN_FIELD = "run"


def _results_history(path: Path) -> list[Baseline]:
    """The runs of a results file (``--tfgrpc-results``), one :class:`Baseline` per run id in
    file order (records of a run that recorded no id form one run)."""
    from pytest_tfgrpc.report.results_file import read_results

    try:
        records = read_results(path)
    except OSError as error:
        raise BaselineError(f"baseline {path} cannot be read: {error.strerror or error}") from None
    runs: dict[str, dict[Key, Measurement]] = {}
    for record in records:
        named = record.get("properties") or {}
        pairs = [*named.items(), *((n, v) for n, v in record.get("repeated") or [])]
        test = str(record.get("junit") or junit_test_id(str(record.get("test", ""))))
        where = f"baseline {path}"
        found = strict_record(test, [(n, str(v)) for n, v in pairs], where).by_key()
        runs.setdefault(str(record.get(RUN_FIELD) or ""), {}).update(found)
    out = [
        Baseline(f"{path}#{run or 'run'}", MappingProxyType(found))
        for run, found in runs.items()
        if found
    ]
    if not out:
        raise BaselineError(f"baseline {path} holds no tfgrpc figures ({len(records)} records)")
    return out


def _run_identity(run: Baseline) -> str:
    """What makes two loaded runs one: the run id the plugin records (in a JUnit file's
    metadata, or a results file's records), else the file."""
    file, hash_, part = run.source.partition("#")  # a results file's run: path#run id
    run_id = run.meta.get("run_id") or (part if part != "run" else "")
    if run_id:
        return f"run {run_id}"
    try:
        return f"file {Path(file).resolve(strict=True)}{hash_}{part}"
    except OSError:
        return f"file {run.source}"


def load_history(
    paths: Iterable[str | os.PathLike[str]], *, skipped: list[str] | None = None
) -> tuple[Baseline, ...]:
    """Earlier runs to gate against, oldest first: each path a JUnit file, a results file
    (``.jsonl``/``.json``, one run per run id) or a directory (its ``*.xml`` files, by name:
    name them so that they sort by time, ``run-0001.xml``). A run given twice (the same run
    id, or the same file: a path repeated, a ``latest.xml`` link in the directory) counts
    once, where it first stands; each one left out is described in ``skipped``, if given.
    Raises :class:`BaselineError` for a path that holds no usable run
    (:func:`load_baseline`)."""
    loaded: list[Baseline] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix == ".xml" and p.is_file())
            if not files:
                raise BaselineError(f"baseline directory {path} holds no *.xml file")
            loaded += [load_baseline(p) for p in files]
        elif path.suffix in (".jsonl", ".json"):
            loaded += _results_history(path)
        else:
            loaded.append(load_baseline(path))
    runs: list[Baseline] = []
    seen: dict[str, str] = {}
    for run in loaded:
        identity = _run_identity(run)
        if identity in seen:
            if skipped is not None:
                skipped.append(f"{run.source} is the run {seen[identity]} already holds")
            continue
        seen[identity] = run.source
        runs.append(run)
    if not runs:
        raise BaselineError("no baseline given")
    return tuple(runs)
