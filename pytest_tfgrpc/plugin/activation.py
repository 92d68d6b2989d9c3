"""When the plugin wakes up. Until a run uses it (a tfgrpc option, or a collected test that
uses a tfgrpc fixture or marker), nothing but the options and markers exists: no grpc or
numpy import, no fabric resolution, no allocator change, no header line. Then
:func:`activate` builds the run's state once and registers the plugin objects that do the
work (as pytest-xdist registers its ``DSession`` only for distributed runs)."""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import TYPE_CHECKING

import pytest

from pytest_tfgrpc.plugin.engines import engines_of
from pytest_tfgrpc.plugin.options import MARKERS, configured

if TYPE_CHECKING:
    from pytest_tfgrpc.plugin.session import RunState

#: Fixtures whose use makes a test a tfgrpc test.
FIXTURES = frozenset(
    ("fabric", "tensor_server", "ps_cluster", "tfgrpc", "tfgrpc_engine", "tfgrpc_streams")
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
        from pytest_tfgrpc.plugin.session import start

        state = start(config)
        config.stash[state_key] = state
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


def pytest_configure(config: pytest.Config) -> None:
    if configured(config):  # the run asks for tfgrpc: set up now, errors before collection
        activate(config)


@pytest.hookimpl(trylast=True)  # after the test's own parametrization: ids end in [...-NAME]
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not uses_tfgrpc(metafunc.fixturenames, metafunc.definition):
        return
    state = _activate_in_collection(metafunc.config)
    if state is None:
        return
    if "fabric" in metafunc.fixturenames:
        fabrics = state.fabrics
        metafunc.parametrize("fabric", fabrics, ids=[f.name for f in fabrics], indirect=True)
    if ENGINE_FIXTURE in metafunc.fixturenames:
        try:
            names = engines_of(metafunc.config, metafunc.definition)
        except pytest.UsageError as exc:
            metafunc.config.stash.setdefault(_error_key, exc)
            return
        if len(names) > 1:  # one engine: no id part, so ids stay as they were
            metafunc.parametrize(ENGINE_FIXTURE, names, ids=names, indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if state_key not in config.stash and any(
        uses_tfgrpc(getattr(item, "fixturenames", ()), item) for item in items
    ):
        _activate_in_collection(config)
    error = config.stash.get(_error_key, None)
    if error is not None:
        raise error
    state = config.stash.get(state_key, None)
    if state is not None:  # every conftest is loaded now: their engines too
        state.registry(config)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    config = item.config
    if hasattr(config, "workerinput") and state_key in config.stash:  # a tfgrpc run
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
