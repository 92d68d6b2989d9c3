"""When the plugin wakes up. Until a run uses it (a tfgrpc option, or a collected test that
uses a tfgrpc fixture or marker), nothing but the options and markers exists: no grpc or
numpy import, no fabric resolution, no allocator change, no header line. Then
:func:`activate` builds the run's state once and registers the plugin objects that do the
work (as pytest-xdist registers its ``DSession`` only for distributed runs)."""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Generator, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

import pytest

from pytest_tfgrpc import turns
from pytest_tfgrpc.plugin.engines import check_engines, engines_of
from pytest_tfgrpc.plugin.options import MARKERS, configured, usage_error_key

if TYPE_CHECKING:
    from pytest_tfgrpc.plugin.session import RunState

#: Fixtures whose use makes a test a tfgrpc test.
#: ``fabric`` is not among them: it is ``tfgrpc_fabric`` under its short name, unless a
#: project defines a ``fabric`` fixture of its own, which is none of the plugin's business.
FIXTURES = frozenset(
    ("tfgrpc_fabric", "tensor_server", "ps_cluster", "tfgrpc", "tfgrpc_engine", "tfgrpc_streams")
)
#: The fixture parametrized by engine when a test runs several.
ENGINE_FIXTURE = "tfgrpc_engine"
#: Set on the reports of a tfgrpc test made by a pytest-xdist worker, so that the
#: controller, which collects nothing, wakes up when the first one reaches it.
REPORT_FLAG = "tfgrpc_test"

state_key = pytest.StashKey["RunState"]()
_error_key = pytest.StashKey[pytest.UsageError]()


def uses_tfgrpc(fixturenames: Iterable[str], node: pytest.Item | pytest.Function) -> bool:
    """Whether a test uses a tfgrpc fixture (directly or through another fixture) or a
    tfgrpc marker."""
    if not FIXTURES.isdisjoint(fixturenames):
        return True
    return any(mark.name in MARKERS for mark in node.iter_markers())


def activate(config: pytest.Config) -> RunState:
    """The run's tfgrpc state, built (and the working plugin objects registered) on the first
    call. Bad settings are a :class:`pytest.UsageError` naming the option."""
    state = config.stash.get(state_key, None)
    if state is None:
        from pytest_tfgrpc.wire.grpc_settings import quiet_core_log

        quiet_core_log(os.environ)  # before gRPC starts here; the run's processes inherit it
        from pytest_tfgrpc.plugin.session import start

        state = start(config)
        config.stash[state_key] = state
        # Only a run that uses tfgrpc gets these: any other run keeps pytest's own SIGTERM
        # and its previous JUnit file until pytest writes the new one.
        _take_sigterm(config)
        _remove_stale_junit(config)
    return state


def _activate_in_collection(config: pytest.Config) -> RunState | None:
    # A usage error raised inside collection would become a collection error of one module;
    # it is raised once collection ends instead, as the usage error it is.
    if _error_key in config.stash:
        return None
    try:
        return activate(config)
    except pytest.UsageError as exc:
        config.stash[_error_key] = exc
        return None


def plain_value(value: object) -> str | int | float | bool | None:
    """``value`` as a builtin that every JUnit writer and pytest-xdist's execnet carry:
    numpy scalars become their Python number, anything else its text. A value whose text
    cannot be made costs only itself: it reads ``<unprintable TYPE>``."""
    if value is None or type(value) in (str, int, float, bool):
        return value  # type: ignore[return-value]
    item = getattr(value, "item", None)  # numpy scalars, 0-d arrays, torch scalars
    if callable(item):
        with contextlib.suppress(Exception):
            plain = item()
            if type(plain) in (str, int, float, bool):
                return plain  # type: ignore[no-any-return]
    for convert in (str, repr):
        with contextlib.suppress(Exception):
            return convert(value)
    return f"<unprintable {type(value).__name__}>"


def plain_properties(properties: Iterable[Any]) -> list[tuple[str, Any]]:
    """``record_property`` pairs with plain names and values (see :func:`plain_value`);
    a malformed entry (not a pair) is kept as its text under the name ``user_property``."""
    out: list[tuple[str, Any]] = []
    for entry in properties:
        if isinstance(entry, tuple) and len(entry) == 2:
            out.append((str(plain_value(entry[0])), plain_value(entry[1])))
        else:
            out.append(("user_property", plain_value(entry)))
    return out


_sigterm_key = pytest.StashKey[dict[int, Any]]()
#: The signals that end a run as Ctrl-C does: a CI timeout's SIGTERM, and SIGHUP (a closed
#: terminal, a lost ssh session), which would otherwise end it with no JUnit XML.
_ENDING = (signal.SIGTERM, signal.SIGHUP)


#: Set once pytest has taken the interrupt (its ``pytest_keyboard_interrupt``): from then on
#: the run is unwinding, and a re-delivered interrupt would cut its fixture teardown short.
_interrupt_taken = threading.Event()
#: Set while a test's body runs (the call phase).
_in_call = threading.Event()
#: An interrupt raised while the main thread runs a ``__del__`` or a gRPC callback is
#: reported and dropped by Python, and the test went on measuring (seen: a SIGTERM at a
#: sync-SGD step's start, the run ended 69 s later). A test body still running this long
#: after the signal had its interrupt swallowed: it is raised again.
_REDELIVER_AFTER_S = 0.8
_REDELIVER_FOR_S = 5.0


def _redeliver_while_in_call() -> None:
    deadline = time.monotonic() + _REDELIVER_FOR_S
    while not _interrupt_taken.wait(_REDELIVER_AFTER_S) and time.monotonic() < deadline:
        if _in_call.is_set():
            _thread.interrupt_main()  # KeyboardInterrupt in the main thread, as Ctrl-C raises


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    _in_call.set()
    try:
        return (yield)
    finally:
        _in_call.clear()


def _hurry() -> None:
    processes = sys.modules.get("pytest_tfgrpc.roles.processes")
    if processes is not None:
        processes.hurry()


def _sigterm_as_interrupt(signum: int, frame: FrameType | None) -> None:
    # End the run through pytest's KeyboardInterrupt path, so finished tests reach the
    # JUnit XML and every fixture stops its processes.
    for ending in _ENDING:
        signal.signal(ending, signal.SIG_DFL)  # a second signal ends at once
    _hurry()
    threading.Thread(target=_redeliver_while_in_call, name="tfgrpc-interrupt", daemon=True).start()
    if _forward_to_workers:
        # A Ctrl-C reaches pytest-xdist's workers through the terminal; a SIGTERM reaches
        # the controller only: pass it on, or a worker finishes its test first.
        for pid in _children():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGTERM)
    name = signal.Signals(signum).name
    raise KeyboardInterrupt(f"tfgrpc: {name} received; ending the run as Ctrl-C does")


_forward_to_workers = False


def _children() -> list[int]:
    """The process ids of this process's children (Linux ``/proc``; none elsewhere)."""
    me, out = os.getpid(), []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me:
                out.append(int(entry.name))
    return out


def _take_sigterm(config: pytest.Config) -> None:
    global _forward_to_workers
    if threading.current_thread() is not threading.main_thread():
        return
    taken: dict[int, Any] = {}
    for signum in _ENDING:
        if signal.getsignal(signum) is signal.SIG_DFL:  # someone else's handler: theirs wins
            taken[signum] = signal.signal(signum, _sigterm_as_interrupt)
    config.stash[_sigterm_key] = taken
    dist = getattr(config.option, "dist", "no") or "no"
    numprocesses = getattr(config.option, "numprocesses", None)
    _forward_to_workers = not hasattr(config, "workerinput") and (
        dist != "no" or bool(numprocesses)
    )


def _remove_stale_junit(config: pytest.Config) -> None:
    # pytest writes --junitxml only when the session ends: a run killed before that would
    # leave the previous run's file in place, looking current. No file is better than that.
    path = getattr(config.option, "xmlpath", None)
    if path and not hasattr(config, "workerinput"):
        with contextlib.suppress(OSError):
            os.unlink(os.path.abspath(os.path.expanduser(os.path.expandvars(path))))


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):
        turns.join()  # tfgrpc-ab --interleave rounds: this run's rounds take turns
    if configured(config):  # the run asks for tfgrpc: set up now, errors before collection
        activate(config)


def pytest_keyboard_interrupt(excinfo: pytest.ExceptionInfo[BaseException]) -> None:
    _interrupt_taken.set()
    processes = sys.modules.get("pytest_tfgrpc.roles.processes")
    if processes is None:
        return  # no role was ever started here: nothing to stop
    processes.hurry()
    children = sorted(processes.live_children(), key=lambda child: child.name)
    if not children:
        return
    hosts = sorted({child.host for child in children})
    names = ", ".join(child.name for child in children[:6])
    more = f" and {len(children) - 6} more" if len(children) > 6 else ""
    # pytest's own line follows; this one says what ending the run still does
    sys.stderr.write(
        f"tfgrpc: stopping {len(children)} process(es) this run started on "
        f"{', '.join(hosts)} ({names}{more}); the JUnit XML and results file are written next\n"
    )


def pytest_unconfigure(config: pytest.Config) -> None:
    turns.leave()
    for signum, previous in config.stash.get(_sigterm_key, {}).items():
        if signal.getsignal(signum) is _sigterm_as_interrupt:
            signal.signal(signum, previous)


@pytest.hookimpl(trylast=True)  # after the test's own parametrization: ids end in [...-NAME]
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not uses_tfgrpc(metafunc.fixturenames, metafunc.definition):
        return
    state = _activate_in_collection(metafunc.config)
    if state is None:
        return
    if "tfgrpc_fabric" in metafunc.fixturenames:
        fabrics = state.fabrics
        metafunc.parametrize("tfgrpc_fabric", fabrics, ids=[f.name for f in fabrics], indirect=True)
    if ENGINE_FIXTURE in metafunc.fixturenames:
        try:
            names = engines_of(metafunc.config, metafunc.definition)
        except pytest.UsageError as exc:
            metafunc.config.stash.setdefault(_error_key, exc)
            return
        if len(names) > 1:  # one engine: no id part, so ids stay as they were
            metafunc.parametrize(ENGINE_FIXTURE, names, ids=names, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tfgrpc_items = [i for i in items if uses_tfgrpc(getattr(i, "fixturenames", ()), i)]
    if state_key not in config.stash and tfgrpc_items:
        _activate_in_collection(config)
    try:
        error = config.stash.get(_error_key, None)
        if error is not None:
            raise error
        state = config.stash.get(state_key, None)
        if state is not None:  # every conftest is loaded now: their engines too
            check_engines(config, state.registry(config), tfgrpc_items)
    except pytest.UsageError as exc:
        if not hasattr(config, "workerinput"):
            raise
        # pytest-xdist's controller takes a worker's usage error for a crash (INTERNALERROR,
        # nothing said): under it, each tfgrpc test fails at setup with the one line instead.
        for item in tfgrpc_items:
            item.stash[usage_error_key] = str(exc)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    problem = item.stash.get(usage_error_key, None)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    config = item.config
    if state_key not in config.stash:
        return report  # not a tfgrpc run: its reports are none of the plugin's business
    # One test's odd record_property value must not cost the run (execnet cannot carry a
    # numpy scalar: INTERNALERROR, every result lost) nor other tests their results.
    report.user_properties = plain_properties(report.user_properties)
    if hasattr(config, "workerinput"):
        tfgrpc_test = uses_tfgrpc(getattr(item, "fixturenames", ()), item)
        setattr(report, REPORT_FLAG, tfgrpc_test)
    return report


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    if state_key not in config.stash and config.pluginmanager.has_plugin("dsession"):
        config.pluginmanager.register(_ControllerWatch(config), _WATCH_NAME)


_WATCH_NAME = "tfgrpc-controller-watch"


class _ControllerWatch:
    """The pytest-xdist controller runs no collection: it wakes up when the first report of
    a tfgrpc test reaches it."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if not getattr(report, REPORT_FLAG, False) or state_key in self.config.stash:
            return
        from pytest_tfgrpc.plugin.summary import REPORTER_NAME

        activate(self.config)
        # Registered during this hook call: pluggy calls it from the next report on.
        reporter = self.config.pluginmanager.get_plugin(REPORTER_NAME)
        if reporter is not None:
            reporter.pytest_runtest_logreport(report)
