"""pytest glue: options, markers, fixtures, hooks. It decides and registers; the work is
done by modules that do not import pytest."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import grpc
import pytest
from _pytest.junitxml import xml_key  # pytest's own JUnit writer: suite properties

from pytest_tfgrpc.bench.driver import Driver
from pytest_tfgrpc.bench.runlock import MeasurementLock, lock_path
from pytest_tfgrpc.bench.specs import (
    MessageSpec,
    RunOverrides,
    SpecError,
    budget_spec,
    message_spec,
    run_marker_spec,
)
from pytest_tfgrpc.model.placement import Topology, topology_spec
from pytest_tfgrpc.plugin.engine import MARKER as ENGINE_MARKER
from pytest_tfgrpc.plugin.engine import STREAMS_MARKER, parametrize_engines, start_server
from pytest_tfgrpc.plugin.engine import add_option as add_engine_option
from pytest_tfgrpc.plugin.engine import tfgrpc_engine_fixture as tfgrpc_engine_fixture
from pytest_tfgrpc.plugin.engine import tfgrpc_streams_fixture as tfgrpc_streams_fixture
from pytest_tfgrpc.report.budget import Budget
from pytest_tfgrpc.report.gate import BaselineGate, GateSetupError, settings_from_options
from pytest_tfgrpc.report.metadata import META_PREFIX, run_metadata
from pytest_tfgrpc.report.plot import PlotUnavailableError, plot_available, write_plots
from pytest_tfgrpc.report.results_file import ResultLog
from pytest_tfgrpc.report.summary import PREFIX, SummaryRow, format_summary, summary_rows
from pytest_tfgrpc.servers.allocator import ALLOCATOR_POLICIES, apply_policy
from pytest_tfgrpc.servers.cluster_spec import (
    ClusterSpec,
    ClusterSpecError,
    RemoteServer,
    load_cluster_spec,
    server_task_for,
)
from pytest_tfgrpc.servers.processes import ServerProcess
from pytest_tfgrpc.servers.ps_cluster import PSCluster
from pytest_tfgrpc.units import UnitError, parse_seconds
from pytest_tfgrpc.wire.fabric import Fabric, FabricError, parse_fabric_names, resolve_fabrics

FABRIC_HELP = (
    "network interfaces to bind tensor servers to, e.g. lo,eth0,ib0 (repeatable; "
    "default: lo). A fabric-bound test runs once per fabric."
)
RUN_OPTIONS = {
    "iterations": "timed operations per message size (overrides each benchmark's default)",
    "warmup": "untimed warm-up operations per message size",
    "max_time": "seconds after which a message size stops measuring, whatever the count",
    "warmup_time": "seconds after which warm-up stops, whatever the count",
    "duration": "time-based runs: measure each message size for this many seconds",
}
ALLOCATOR_HELP = (
    "glibc allocator policy of the measuring process and its servers: 'tuned' (default) "
    "keeps large-message memory on the heap (MALLOC_MMAP_THRESHOLD_=32MiB, "
    "MALLOC_TRIM_THRESHOLD_=1GiB unless set); 'default' leaves glibc as it is. Recorded "
    "with every result."
)
BASELINE_HELP = (
    "JUnit XML of an earlier run: every figure of every test and fabric is compared with it, "
    "and a significant regression beyond the tolerance fails that test"
)
TOLERANCE_HELP = (
    "largest change that is not a regression, per metric or for all: 10%, p99:10%, "
    "throughput:5% (repeatable; default 10%)"
)
CLUSTER_HELP = (
    "cluster spec in TF_CONFIG format naming tensor servers on other hosts ('ps' tasks, "
    "started there with tfgrpc-server): tensor_server then measures against the one reached "
    "through the test's fabric. TF_CONFIG in the environment works too"
)
RESULTS_HELP = (
    "append every finished test's figures to FILE as JSON lines, each written and synced as "
    "the test ends, so a run that is killed keeps every finished result"
)
PLOT_HELP = (
    "write PNG plots into DIR at the end of the run: latency and bandwidth against message "
    "size per fabric, step times of PS tests (needs the 'plot' extra: matplotlib)"
)
ALPHA_HELP = "significance level of the baseline comparison (default 0.05)"
GATE_POLICIES = {
    "inconclusive": (
        ("fail", "pass"),
        "what an inconclusive comparison costs a test (default pass)",
    ),
    "bad-baseline": (
        ("fail", "warn"),
        "a missing, corrupt or truncated baseline: fail the run (default) or warn and gate nothing",
    ),
    "baseline-mismatch": (
        ("fail", "warn"),
        "a baseline from another host, fabric, MTU or grpcio: fail the run or warn (default)",
    ),
}
MARKERS = (
    "message_profile(name_or_sizes=None, *, sizes=None, scheme='uniform'): the message "
    "sizes of the test's benchmarks: a list such as ['4B', '64KiB'] or a range "
    "'1KiB..64MiB' (powers of two).",
    "budget(**limits): limits checked on every result the test records, e.g. "
    "budget(p99='2ms', throughput='>=1 GB/s'). Metrics: min, mean, p50, p90, p99, p999, "
    "max, throughput, throughput_p50, step_p50, step_p99, step_mean, step_max, imbalance, "
    "rpc_rate.",
    "tfgrpc_run(iterations=None, warmup=None, duration=None, max_seconds=None, "
    "warmup_seconds=None): the test's run settings, over the --tfgrpc-* options; a duration "
    "makes the run time-based (TF-gRPC-Bench: warmup_seconds=2, duration=10).",
    "ps_topology(ps=1, workers=1, sharding='round_robin'): the parameter-server cluster of "
    "the ps_cluster fixture: PS processes, worker processes, and how tensors are placed on "
    "PS tasks (round_robin, greedy, partitioned).",
    ENGINE_MARKER,
    STREAMS_MARKER,
)


@dataclass(frozen=True)
class _Session:
    fabrics: tuple[Fabric, ...]
    options: RunOverrides
    server_env: dict[str, str] | None = None
    meta: dict[str, str] = field(default_factory=dict)
    gate: BaselineGate | None = None
    cluster: ClusterSpec | None = None
    servers: list[ServerProcess] = field(default_factory=list)

    def stop_servers(self) -> None:
        while self.servers:
            self.servers.pop().stop()


_REPORTER_NAME = "tfgrpc-summary"

_session_key = pytest.StashKey[_Session]()


class Watched(Protocol):
    """Processes a test uses: a death among them fails the test."""

    def died(self, grace: float = 0.5) -> BaseException | None: ...


@dataclass(frozen=True)
class ItemSpecs:
    """What a test's markers declare, validated once at setup."""

    messages: MessageSpec | None
    budget: Budget | None
    topology: Topology
    run: RunOverrides


_watched_key = pytest.StashKey[list[Watched]]()
_specs_key = pytest.StashKey[ItemSpecs]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tfgrpc", "gRPC tensor-traffic performance (pytest-tfgrpc)")
    group.addoption(
        "--fabric",
        "--tfgrpc-fabric",
        action="append",
        dest="tfgrpc_fabric",
        metavar="NAME[,NAME...]",
        help=FABRIC_HELP,
    )
    parser.addini("tfgrpc_fabric", FABRIC_HELP, type="args", default=[])
    add_engine_option(group)
    group.addoption(
        "--tfgrpc-allocator",
        dest="tfgrpc_allocator",
        choices=ALLOCATOR_POLICIES,
        help=ALLOCATOR_HELP,
    )
    parser.addini("tfgrpc_allocator", ALLOCATOR_HELP, default="tuned")
    group.addoption("--tfgrpc-baseline", dest="tfgrpc_baseline", metavar="FILE", help=BASELINE_HELP)
    parser.addini("tfgrpc_baseline", BASELINE_HELP, default=None)
    group.addoption(
        "--tfgrpc-max-regression",
        action="append",
        dest="tfgrpc_max_regression",
        metavar="[METRIC:]PCT",
        help=TOLERANCE_HELP.replace("%", "%%"),  # argparse formats help with %
    )
    parser.addini("tfgrpc_max_regression", TOLERANCE_HELP, type="args", default=[])
    for name, (choices, help_text) in GATE_POLICIES.items():
        group.addoption(
            f"--tfgrpc-{name}",
            dest=f"tfgrpc_{name.replace('-', '_')}",
            choices=choices,
            help=help_text,
        )
        parser.addini(f"tfgrpc_{name.replace('-', '_')}", help_text, default=None)
    group.addoption("--tfgrpc-cluster", dest="tfgrpc_cluster", metavar="FILE", help=CLUSTER_HELP)
    parser.addini("tfgrpc_cluster", CLUSTER_HELP, default=None)
    group.addoption("--tfgrpc-results", dest="tfgrpc_results", metavar="FILE", help=RESULTS_HELP)
    parser.addini("tfgrpc_results", RESULTS_HELP, default=None)
    group.addoption("--tfgrpc-plot", dest="tfgrpc_plot", metavar="DIR", help=PLOT_HELP)
    parser.addini("tfgrpc_plot", PLOT_HELP, default=None)
    group.addoption("--tfgrpc-alpha", dest="tfgrpc_alpha", type=float, metavar="P", help=ALPHA_HELP)
    parser.addini("tfgrpc_alpha", ALPHA_HELP, default=None)
    for name, help_text in RUN_OPTIONS.items():
        flag = "--tfgrpc-" + name.replace("_", "-")
        group.addoption(flag, dest=f"tfgrpc_{name}", metavar="N", help=help_text)
        parser.addini(f"tfgrpc_{name}", help_text, default=None)


def _run_overrides(config: pytest.Config) -> RunOverrides:
    values: dict[str, float | int | None] = {}
    for name in RUN_OPTIONS:
        raw = config.getoption(f"tfgrpc_{name}") or config.getini(f"tfgrpc_{name}")
        if raw in (None, ""):
            values[name] = None
            continue
        flag = "--tfgrpc-" + name.replace("_", "-")
        try:
            if name in ("iterations", "warmup"):
                number = int(str(raw))
                if number < (1 if name == "iterations" else 0):
                    raise ValueError
                values[name] = number
            else:
                values[name] = parse_seconds(str(raw))
        except (ValueError, UnitError) as exc:
            message = f"{flag} / tfgrpc_{name}: invalid value {raw!r} {exc}".rstrip()
            raise pytest.UsageError(message) from None
    return RunOverrides(
        iterations=values["iterations"],  # type: ignore[arg-type]
        warmup=values["warmup"],  # type: ignore[arg-type]
        max_seconds=values["max_time"],
        warmup_seconds=values["warmup_time"],
        duration=values["duration"],
    )


def _option(config: pytest.Config, name: str) -> Any:
    value = config.getoption(name)
    return value if value not in (None, []) else (config.getini(name) or None)


def _baseline_gate(
    config: pytest.Config, meta: dict[str, str], fabrics: tuple[Fabric, ...]
) -> BaselineGate | None:
    path = _option(config, "tfgrpc_baseline")
    if not path:
        return None
    try:
        alpha = _option(config, "tfgrpc_alpha")
        settings = settings_from_options(
            str(path),
            _option(config, "tfgrpc_max_regression") or [],
            alpha=float(alpha) if alpha is not None else None,
            inconclusive=_option(config, "tfgrpc_inconclusive"),
            bad_baseline=_option(config, "tfgrpc_bad_baseline"),
            mismatch=_option(config, "tfgrpc_baseline_mismatch"),
        )
        unprefixed = {k.removeprefix(META_PREFIX): v for k, v in meta.items()}
        return BaselineGate(settings, unprefixed, [f.name for f in fabrics])
    except (ValueError, GateSetupError) as exc:
        raise pytest.UsageError(f"tfgrpc baseline: {exc}") from None


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    given = config.getoption("tfgrpc_fabric") or config.getini("tfgrpc_fabric") or ["lo"]
    try:
        fabrics = resolve_fabrics(parse_fabric_names(given))
    except FabricError as exc:
        raise pytest.UsageError(str(exc)) from None
    policy = config.getoption("tfgrpc_allocator") or config.getini("tfgrpc_allocator")
    try:
        server_env = apply_policy(policy)
    except ValueError as exc:
        raise pytest.UsageError(f"tfgrpc_allocator: {exc}") from None
    meta = run_metadata(fabrics)
    try:
        cluster = load_cluster_spec(_option(config, "tfgrpc_cluster"), os.environ)
    except ClusterSpecError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_session_key] = _Session(
        fabrics=fabrics,
        options=_run_overrides(config),
        server_env=server_env,
        meta=meta,
        gate=_baseline_gate(config, meta, fabrics),
        cluster=cluster,
    )
    if not hasattr(config, "workerinput"):  # the xdist controller or a plain run prints
        gate = config.stash[_session_key].gate
        results_path = _option(config, "tfgrpc_results")
        results = ResultLog(results_path) if results_path else None
        plot_dir = _option(config, "tfgrpc_plot")
        if plot_dir:
            available, why = plot_available()
            if not available:
                raise pytest.UsageError(f"--tfgrpc-plot: {why}")
        reporter = SummaryReporter(
            [f.name for f in fabrics], gate, results, str(plot_dir) if plot_dir else None
        )
        config.pluginmanager.register(reporter, _REPORTER_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_session_key, None)
    if session is not None:
        session.stop_servers()
    reporter = config.pluginmanager.get_plugin(_REPORTER_NAME)
    if reporter is not None:
        if reporter.results is not None:
            reporter.results.close()
        config.pluginmanager.unregister(reporter, _REPORTER_NAME)


def pytest_report_header(config: pytest.Config) -> list[str]:
    session = config.stash.get(_session_key, None)
    if session is None:
        return []
    fabrics = ", ".join(
        f"{f.name} ({f.address}{f' mtu {f.mtu}' if f.mtu else ''})" for f in session.fabrics
    )
    lines = [f"tfgrpc: fabrics {fabrics}; grpcio {grpc.__version__}"]
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") != "no":
        lines.append(
            "tfgrpc: pytest-xdist: tests that measure run one at a time across workers, "
            "so that no measurement shares the machine with another"
        )
    if session.cluster is not None:
        servers = ", ".join(f"ps[{t.index}] {t.target}" for t in session.cluster.job("ps"))
        lines.append(f"tfgrpc: remote tensor servers from {session.cluster.source}: {servers}")
    gate = session.gate
    if gate is not None:
        tolerances = ", ".join(f"{k}:{v:.0%}" for k, v in gate.settings.tolerances.items())
        lines.append(
            f"tfgrpc: baseline {gate.settings.baseline_path} (tolerance {tolerances}, "
            f"alpha {gate.settings.alpha}, inconclusive: {gate.settings.inconclusive})"
        )
        lines += [f"tfgrpc: WARNING {warning}" for warning in gate.warnings]
    return lines


@pytest.hookimpl(trylast=True)  # after the test's own parametrization: ids end in [...-NAME]
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    parametrize_engines(metafunc)
    if "fabric" not in metafunc.fixturenames:
        return
    fabrics = metafunc.config.stash[_session_key].fabrics
    metafunc.parametrize("fabric", fabrics, ids=[f.name for f in fabrics], indirect=True)


def _item_specs(item: pytest.Item) -> ItemSpecs:
    cached = item.stash.get(_specs_key, None)
    if cached is not None:
        return cached
    messages: MessageSpec | None = None
    budget: Budget | None = None
    mark = item.get_closest_marker("message_profile")
    if mark is not None:
        messages = message_spec(mark.args, mark.kwargs)
    for mark in reversed(list(item.iter_markers("budget"))):  # closest last: it wins
        spec = budget_spec(mark.args, mark.kwargs)
        budget = spec if budget is None else budget.merged(spec)
    mark = item.get_closest_marker("ps_topology")
    topology = topology_spec(mark.args, mark.kwargs) if mark is not None else Topology(1, 1)
    mark = item.get_closest_marker("tfgrpc_run")
    run = run_marker_spec(mark.args, mark.kwargs) if mark is not None else RunOverrides()
    specs = ItemSpecs(messages, budget, topology, run)
    item.stash[_specs_key] = specs
    return specs


def pytest_runtest_setup(item: pytest.Item) -> None:
    try:
        _item_specs(item)
    except SpecError as exc:
        problem = f"{item.nodeid}: {exc}"
    else:
        return
    pytest.fail(problem, pytrace=False)


_MEASURING_FIXTURES = frozenset(("tensor_server", "ps_cluster", "tfgrpc"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    workerinput = getattr(item.config, "workerinput", None)
    uses = _MEASURING_FIXTURES.intersection(getattr(item, "fixturenames", ()))
    if workerinput is None or not uses:
        return (yield)
    # Under pytest-xdist: set up, measure and tear down one test at a time, run-wide.
    with MeasurementLock(lock_path(str(workerinput["testrunuid"]))):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    result = yield
    # A process that died during the test fails it, even if the test never noticed.
    for watched in item.stash.get(_watched_key, []):
        death = watched.died(grace=0)
        if death is not None:
            raise death
    gate = item.config.stash[_session_key].gate
    if gate is not None and any(name.startswith(PREFIX) for name, _ in item.user_properties):
        verdict = gate.judge(item.nodeid, item.user_properties)
        item.user_properties.extend(verdict.properties)
        if verdict.failure is not None:
            # Fails the call itself, so the regression is a failure in the JUnit XML.
            pytest.fail(verdict.failure, pytrace=False)
    return result


def pytest_sessionstart(session: pytest.Session) -> None:
    # Run metadata as suite properties, written by the process that writes the XML (the
    # xdist controller too, where record_testsuite_property from workers is lost).
    state = session.config.stash.get(_session_key, None)
    logxml = session.config.stash.get(xml_key, None)
    if state is None or logxml is None:
        return
    for name, value in state.meta.items():
        logxml.add_global_property(name, value)


def pytest_sessionfinish(session: pytest.Session) -> None:
    # Normally every fixture has stopped its server by now; after a Ctrl-C or an internal
    # error some may not have run their teardown.
    state = session.config.stash.get(_session_key, None)
    if state is not None:
        state.stop_servers()


_OUTCOME_RANK = {"passed": 0, "skipped": 1, "error": 2, "failed": 3}


class SummaryReporter:
    """Collects the figures and baseline verdicts of every finished test (from its reports,
    so it works under pytest-xdist too): appends each test to the results file as it ends,
    and prints the tables and writes the plots at the end of the run."""

    def __init__(
        self,
        fabrics: Sequence[str],
        gate: BaselineGate | None,
        results: ResultLog | None,
        plot_dir: str | None,
    ) -> None:
        self.fabrics = tuple(fabrics)
        self.gate = gate
        self.results = results
        self.plot_dir = plot_dir
        self.rows: list[SummaryRow] = []
        self.verdicts: dict[str, int] = {}
        self.notes: list[str] = []
        self.figures: dict[str, list[tuple[str, object]]] = {}
        self._outcomes: dict[str, tuple[str, float]] = {}

    def _track(self, report: pytest.TestReport) -> tuple[str, float]:
        outcome: str = report.outcome
        if report.when != "call" and report.failed:
            outcome = "error"
        previous, duration = self._outcomes.get(report.nodeid, ("passed", 0.0))
        if _OUTCOME_RANK[outcome] < _OUTCOME_RANK[previous]:
            outcome = previous
        state = (outcome, duration + report.duration)
        self._outcomes[report.nodeid] = state
        return state

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome, duration = self._track(report)
        if report.when != "teardown":
            return
        del self._outcomes[report.nodeid]
        if self.results is not None:
            self.results.append(
                report.nodeid,
                outcome=outcome,
                duration=duration,
                properties=report.user_properties,
                worker=getattr(report, "worker_id", None),
            )
        if not report.user_properties:
            return
        self.figures[report.nodeid] = list(report.user_properties)
        self.rows.extend(summary_rows(report.nodeid, report.user_properties))
        properties = dict(report.user_properties)
        for name, value in report.user_properties:
            if not str(name).endswith(".verdict"):
                continue
            self.verdicts[str(value)] = self.verdicts.get(str(value), 0) + 1
            if value not in ("pass", "no baseline"):
                reason = properties.get(f"{name}_reason", "")
                figure = str(name).removeprefix(PREFIX).removesuffix(".verdict")
                self.notes.append(f"{value}: {report.nodeid} {figure} {reason}")

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.rows:
            terminalreporter.section("tfgrpc")
            for line in format_summary(self.rows, self.fabrics):
                terminalreporter.write_line(line)
        if self.results is not None:
            terminalreporter.write_line(f"tfgrpc: results appended to {self.results.path}")
        if self.plot_dir is not None and self.figures:
            try:
                written = write_plots(self.figures, self.plot_dir)
            except PlotUnavailableError as exc:
                terminalreporter.write_line(f"tfgrpc: no plots: {exc}", yellow=True)
            else:
                for path in written:
                    terminalreporter.write_line(f"tfgrpc: plot {path}")
        if self.gate is None:
            return
        terminalreporter.section("tfgrpc baseline")
        terminalreporter.write_line(f"baseline: {self.gate.settings.baseline_path}")
        for warning in self.gate.warnings:
            terminalreporter.write_line(f"WARNING {warning}", yellow=True, bold=True)
        counts = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.verdicts.items()))
        terminalreporter.write_line(f"figures compared: {counts or 'none'}")
        for note in self.notes:
            terminalreporter.write_line(note, red=note.startswith("regression"))


@pytest.fixture
def fabric(request: pytest.FixtureRequest) -> Fabric:
    """The fabric of this test run: interface name, the address it binds to, its family."""
    param = getattr(request, "param", None)
    if isinstance(param, Fabric):
        return param
    return request.config.stash[_session_key].fabrics[0]


@pytest.fixture
def tensor_server(
    request: pytest.FixtureRequest, fabric: Fabric, tfgrpc_engine: str
) -> Iterator[ServerProcess | RemoteServer]:
    """A tensor server in its own process, bound to ``fabric``: ``.target``, ``.fabric``,
    ``.pid``. Stopped when the test ends; if it dies during the test, the test fails.
    With a cluster spec, the spec's server reached through ``fabric`` on another host."""
    session = request.config.stash[_session_key]
    if session.cluster is not None:
        try:
            remote = RemoteServer(server_task_for(session.cluster, fabric), fabric)
            remote.check_reachable()
        except ClusterSpecError as exc:
            problem = str(exc)
        else:
            yield remote
            return
        pytest.fail(problem, pytrace=False)
    started = session.servers
    server = start_server(request.node, fabric, session.server_env, tfgrpc_engine)
    started.append(server)
    request.node.stash.setdefault(_watched_key, []).append(server)
    try:
        yield server
    finally:
        server.stop()
        if server in started:
            started.remove(server)


@pytest.fixture
def ps_cluster(request: pytest.FixtureRequest, fabric: Fabric) -> Iterator[PSCluster]:
    """Parameter-server processes and worker processes bound to ``fabric``, as the test's
    ``ps_topology`` marker declares (default: 1 PS, 1 worker). Stopped when the test ends;
    if one of its processes dies during the test, the test fails."""
    session = request.config.stash[_session_key]
    topology = _item_specs(request.node).topology
    with PSCluster(fabric, topology, env=session.server_env) as cluster:
        request.node.stash.setdefault(_watched_key, []).append(cluster)
        yield cluster


@pytest.fixture
def tfgrpc(request: pytest.FixtureRequest, tfgrpc_engine: str, tfgrpc_streams: int) -> Driver:
    """The benchmark driver: ``p2p_latency(server, ...)``, ``p2p_bandwidth(server, ...)``,
    ``ps_throughput(cluster, ...)``, ``sync_sgd_step(cluster, ...)``."""
    item = request.node
    specs = _item_specs(item)
    session = request.config.stash[_session_key]

    def record(name: str, value: str) -> None:
        item.user_properties.append((name, value))

    return Driver(
        test=item.nodeid,
        messages=specs.messages,
        budget=specs.budget,
        options=session.options.merged(specs.run),
        record=record,
        progress=_progress_lines(request.config, item.nodeid),
        server_env=session.server_env,
        engine=tfgrpc_engine,
        streams=tfgrpc_streams,
    )


#: Long sweeps say where they are: a line once a test has run this long, then as often.
PROGRESS_EVERY_S = 10.0


def _progress_lines(config: pytest.Config, test: str) -> Callable[[str], None] | None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None or hasattr(config, "workerinput"):
        return None
    last = time.monotonic()

    def progress(message: str) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_EVERY_S:
            reporter.write_line(f"tfgrpc: {test}: {message}")
            last = now

    return progress
