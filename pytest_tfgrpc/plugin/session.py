"""The run's tfgrpc state and the hooks that act on every tfgrpc test: built by
:func:`start` when the run first uses the plugin (see ``activation``)."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import grpc
import pytest

# pytest's own JUnit writer: suite properties, and how it names a test case
from _pytest.junitxml import xml_key

from pytest_tfgrpc.bench.engines import EngineRegistry, EngineServer
from pytest_tfgrpc.bench.specs import RUN_SETTINGS, RunLayer, SpecError, run_layer
from pytest_tfgrpc.hosts.agent_client import AgentError
from pytest_tfgrpc.hosts.cluster_spec import ClusterSpec
from pytest_tfgrpc.plugin import agents
from pytest_tfgrpc.plugin.engines import build_registry
from pytest_tfgrpc.plugin.markers import check_markers, marker_problem, watched_key
from pytest_tfgrpc.plugin.options import GATE_POLICIES, TLS_OPTIONS, option
from pytest_tfgrpc.plugin.summary import REPORTER_NAME, SummaryReporter
from pytest_tfgrpc.report.gate import BaselineGate, GateSetupError, settings_from_options
from pytest_tfgrpc.report.metadata import META_PREFIX, extra_metadata, run_metadata
from pytest_tfgrpc.report.plot import plot_available
from pytest_tfgrpc.report.record import has_figures, junit_test_id, read_record
from pytest_tfgrpc.report.results_file import ResultLog
from pytest_tfgrpc.report.tolerance import ToleranceError, parse_tolerances
from pytest_tfgrpc.roles.processes import ServerError
from pytest_tfgrpc.runlock import MeasurementLock, lock_path, lock_wait_s
from pytest_tfgrpc.tuning.allocator import apply_policy
from pytest_tfgrpc.tuning.cpus import CpuError, placement_setting, resolve_placement, use_placement
from pytest_tfgrpc.units import UnitError, parse_duration_ns, parse_rate_Bps
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import Fabric, FabricError, parse_fabric_names, resolve_fabrics
from pytest_tfgrpc.wire.security import TlsError, TlsFiles, load_tls, tls_mode, use_tls

SESSION_NAME = "tfgrpc-session"
#: The run id's metadata key (``tfgrpc.meta.run_id``), and how xdist workers learn it.
RUN_ID = "run_id"
RUN_ID_KEY = "tfgrpc_run_id"
#: The property of a test that waited for another run's measurement on this host.
HOST_WAIT = f"{META_PREFIX}host_wait"


def new_run_id() -> str:
    """A run id: UTC start time, host and a random part (``20261130T235500Z-host-1a2b3c4d``)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return f"{stamp}-{socket.gethostname()}-{uuid.uuid4().hex[:8]}"


_MEASURING_FIXTURES = frozenset(("tensor_server", "ps_cluster", "tfgrpc"))


#: Why a measuring test could not take the host measurement lock.
_lock_refused_key = pytest.StashKey[str]()


@dataclass
class RunState:
    """What every tfgrpc test of the run shares."""

    fabrics: tuple[Fabric, ...]
    #: The run settings of the ini file and the options, farthest first.
    run: tuple[RunLayer, ...]
    server_env: dict[str, str] | None = None
    meta: dict[str, str] = field(default_factory=dict)
    gate: BaselineGate | None = None
    cluster: ClusterSpec | None = None
    servers: list[EngineServer] = field(default_factory=list)
    #: The engines the ``pytest_tfgrpc_add_engines`` hooks registered: asked once every
    #: conftest is loaded (after collection), see :meth:`registry`.
    engines: EngineRegistry | None = None
    #: Fault injection (--tfgrpc-server-delay): every reply of the fixture's tensor servers
    #: is held back this long, in seconds; its text as given, "" when none.
    server_delay_s: float = 0.0
    server_delay: str = ""
    #: Set once the header lines and the suite properties have been given out.
    header_shown: bool = False
    meta_written: bool = False

    def registry(self, config: pytest.Config) -> EngineRegistry:
        """The run's engines, from the ``pytest_tfgrpc_add_engines`` hooks on first use."""
        if self.engines is None:
            self.engines = build_registry(config)
        return self.engines

    def stop_servers(self) -> None:
        while self.servers:
            self.servers.pop().stop()


def run_layers(config: pytest.Config) -> tuple[RunLayer, RunLayer]:
    """The run settings of the ini file, then of the ``--tfgrpc-*`` options (closer); a bad
    value is a usage error naming the setting, the value and where it comes from."""
    ini = {name: config.getini(f"tfgrpc_{name}") for name in RUN_SETTINGS}
    given = {name: config.getoption(f"tfgrpc_{name}") for name in RUN_SETTINGS}
    try:
        return run_layer("ini tfgrpc_{name}", ini), run_layer("--tfgrpc-{flag}", given)
    except SpecError as exc:
        raise pytest.UsageError(str(exc)) from None


#: The longest --tfgrpc-server-delay, as node agents allow for their servers.
MAX_SERVER_DELAY_S = 10.0


def server_delay(config: pytest.Config) -> tuple[float, str]:
    """``--tfgrpc-server-delay`` (or its ini twin) in seconds, and as given ("" when none);
    a bad value is a usage error naming the option and the value."""
    raw = str(option(config, "tfgrpc_server_delay") or "").strip()
    if not raw:
        return 0.0, ""
    try:
        seconds = parse_duration_ns(raw) / 1e9
    except UnitError as exc:
        raise pytest.UsageError(
            f"--tfgrpc-server-delay / tfgrpc_server_delay: invalid value {raw!r}: {exc}"
        ) from None
    if not 0.0 <= seconds <= MAX_SERVER_DELAY_S:
        raise pytest.UsageError(
            f"--tfgrpc-server-delay / tfgrpc_server_delay: {raw!r} is not from 0 to "
            f"{MAX_SERVER_DELAY_S:g} s"
        )
    return seconds, raw


def link_rates(config: pytest.Config) -> dict[str, float]:
    """Per fabric name, the nominal rate the user named (bytes/s), from ``--tfgrpc-link-rate``
    or the ini's ``tfgrpc_link_rates`` (``FABRIC=RATE`` pairs); a bad pair is a usage error
    naming the option and the pair."""
    where = "--tfgrpc-link-rate / tfgrpc_link_rates"
    rates: dict[str, float] = {}
    for pair in config.getoption("tfgrpc_link_rates") or config.getini("tfgrpc_link_rates"):
        name, sep, text = str(pair).partition("=")
        if not sep or not name.strip():
            raise pytest.UsageError(f"{where}: {pair!r} is not FABRIC=RATE (eth0=10Gbit/s)")
        try:
            rate = parse_rate_Bps(text.strip())
        except UnitError as exc:
            raise pytest.UsageError(f"{where}: {name.strip()}: {exc}") from None
        if rate <= 0:
            raise pytest.UsageError(f"{where}: {pair!r}: a link's rate is above 0")
        rates[name.strip()] = rate
    return rates


def junit_name(config: pytest.Config, nodeid: str) -> str:
    """A test's ``classname.name`` exactly as pytest's JUnit writer names it: its address
    mangled (path to dots, ``::`` to dots, parameters kept), ``--junit-prefix`` before the
    classname, the name escaped of characters XML cannot hold. (The node id itself depends on
    the rootdir, so runs from another rootdir name their tests differently: the gate then
    says which baseline tests it could not find and what they look like.)"""
    return junit_test_id(nodeid, getattr(config.option, "junitprefix", None) or "")


#: The gate's options besides the baseline (dest, flag): given on the command line without a
#: baseline, they would gate nothing.
_GATE_OPTIONS = (
    ("tfgrpc_max_regression", "--tfgrpc-max-regression"),
    ("tfgrpc_alpha", "--tfgrpc-alpha"),
    *((f"tfgrpc_{name.replace('-', '_')}", f"--tfgrpc-{name}") for name in GATE_POLICIES),
)


def _tolerances(config: pytest.Config) -> list[str]:
    """``--tfgrpc-max-regression`` (else its ini twin) as given, read once here so that a
    malformed tolerance is a usage error whether or not the run has a baseline."""
    given, where = config.getoption("tfgrpc_max_regression"), "--tfgrpc-max-regression"
    if not given:
        given, where = config.getini("tfgrpc_max_regression"), "ini tfgrpc_max_regression"
    tolerances = [str(t) for t in given or []]
    try:
        parse_tolerances(tolerances)
    except ToleranceError as exc:
        raise pytest.UsageError(f"{where}: {exc}") from None
    return tolerances


def _gate_options_without_baseline(config: pytest.Config) -> None:
    for dest, flag in _GATE_OPTIONS:
        value = config.getoption(dest)
        if value not in (None, []):
            shown = ",".join(map(str, value)) if isinstance(value, list) else value
            raise pytest.UsageError(
                f"{flag}={shown}: no baseline to gate against; give --tfgrpc-baseline PATH "
                "(a JUnit XML, a directory of them or a --tfgrpc-results file) or drop "
                f"{flag}"
            )


def _baseline_gate(
    config: pytest.Config, meta: dict[str, str], fabrics: tuple[Fabric, ...]
) -> BaselineGate | None:
    tolerances = _tolerances(config)
    given = option(config, "tfgrpc_baseline")
    if not given:
        _gate_options_without_baseline(config)
        return None
    paths = [given] if isinstance(given, str) else [str(p) for p in given]
    try:
        alpha = option(config, "tfgrpc_alpha")
        settings = settings_from_options(
            paths,
            tolerances,
            alpha=float(alpha) if alpha is not None else None,
            inconclusive=option(config, "tfgrpc_inconclusive"),
            bad_baseline=option(config, "tfgrpc_bad_baseline"),
            mismatch=option(config, "tfgrpc_baseline_mismatch"),
            missing=option(config, "tfgrpc_missing"),
        )
        unprefixed = {k.removeprefix(META_PREFIX): v for k, v in meta.items()}
        return BaselineGate(settings, unprefixed, [f.name for f in fabrics])
    except (ValueError, GateSetupError) as exc:
        raise pytest.UsageError(f"tfgrpc baseline: {exc}") from None


def start(config: pytest.Config) -> RunState:
    """Resolve the fabrics, apply the allocator policy, gather the run metadata, set up the
    gate, and register the hooks of a tfgrpc run. Raises :class:`pytest.UsageError` naming
    the option whose value is bad."""
    given = config.getoption("tfgrpc_fabric") or config.getini("tfgrpc_fabric") or ["lo"]
    try:
        fabrics = resolve_fabrics(parse_fabric_names(given))
    except FabricError as exc:
        raise pytest.UsageError(str(exc)) from None
    rates = link_rates(config)
    fabrics = tuple(replace(f, link_rate_Bps=rates.get(f.name)) for f in fabrics)
    run = run_layers(config)
    delay_s, delay = server_delay(config)
    policy = config.getoption("tfgrpc_allocator") or config.getini("tfgrpc_allocator")
    # Never stops the run: a spec that cannot be used fails the tests that need it, and a
    # TF_CONFIG set for TensorFlow is a header note (see plugin/agents.py).
    cluster = agents.cluster_of(config).spec
    plot_dir = option(config, "tfgrpc_plot")
    if plot_dir and not hasattr(config, "workerinput"):
        available, why = plot_available()
        if not available:
            raise pytest.UsageError(f"--tfgrpc-plot: {why}")
    try:
        server_env = apply_policy(policy)
    except ValueError as exc:
        raise pytest.UsageError(f"tfgrpc_allocator: {exc}") from None
    tls = _tls_files(config)
    cpus, source = _cpus_option(config)
    try:
        use_placement(resolve_placement(cpus))
    except CpuError as exc:
        raise pytest.UsageError(f"{source}: {exc}") from None
    # Every process the run starts gets the run's allocator policy (tfgrpc-server applies
    # it as the plugin does) and its TLS setting.
    server_env = {
        **(os.environ if server_env is None else server_env),
        "TFGRPC_ALLOCATOR": str(policy),
        **tls.env(),
    }
    meta = run_metadata(fabrics, allocator=str(policy), server_delay=delay or "none")
    try:
        meta.update(extra_metadata(config.hook.pytest_tfgrpc_run_metadata(config=config)))
    except ValueError as exc:
        raise pytest.UsageError(f"pytest_tfgrpc_run_metadata: {exc}") from None
    workerinput = getattr(config, "workerinput", None)
    run_id = str(workerinput.get(RUN_ID_KEY, "")) if workerinput else ""
    meta[f"{META_PREFIX}{RUN_ID}"] = run_id or new_run_id()
    state = RunState(
        fabrics=fabrics,
        run=run,
        server_env=server_env,
        meta=meta,
        gate=_baseline_gate(config, meta, fabrics),
        cluster=cluster,
        server_delay_s=delay_s,
        server_delay=delay,
    )
    config.pluginmanager.register(TfgrpcSession(state), SESSION_NAME)
    if not hasattr(config, "workerinput"):  # the xdist controller or a plain run reports
        results_path = option(config, "tfgrpc_results")
        html_path = option(config, "tfgrpc_html")
        reporter = SummaryReporter(
            [f.name for f in fabrics],
            state.gate,
            ResultLog(results_path, run_id=meta[f"{META_PREFIX}{RUN_ID}"])
            if results_path
            else None,
            str(plot_dir) if plot_dir else None,
            junit_name=lambda nodeid: junit_name(config, nodeid),
            html_path=str(html_path) if html_path else None,
            meta=state.meta,
        )
        config.pluginmanager.register(reporter, REPORTER_NAME)
        _write_suite_properties(config, state)
    return state


def _tls_files(config: pytest.Config) -> TlsFiles:
    """The run's TLS files, read, checked and made the TLS setting of every channel of this
    process; a missing file or a certificate without its key is a usage error."""
    files = TlsFiles(**{name: option(config, f"tfgrpc_tls_{name}") for name in TLS_OPTIONS})
    try:
        material = load_tls(files)
    except TlsError as exc:
        raise pytest.UsageError(f"tfgrpc TLS: {exc}") from None
    if material is not None and material.cert is None:
        raise pytest.UsageError(
            "tfgrpc TLS: --tfgrpc-tls-ca needs --tfgrpc-tls-cert and --tfgrpc-tls-key: the "
            "servers the run starts need an identity to serve TLS with"
        )
    use_tls(material)
    return files


def _write_suite_properties(config: pytest.Config, state: RunState) -> None:
    # Run metadata as suite properties, written by the process that writes the XML (the
    # xdist controller too, where record_testsuite_property from workers is lost).
    logxml = config.stash.get(xml_key, None)
    if state.meta_written or logxml is None:
        return
    for name, value in state.meta.items():
        logxml.add_global_property(name, value)
    state.meta_written = True


def _cpus_option(config: pytest.Config) -> tuple[str, str]:
    """The CPU placement asked for and where it came from (for errors): ``--tfgrpc-cpus``,
    else the ini file's ``tfgrpc_cpus``, else ``auto``. An empty value is no value, as for
    the other tfgrpc options: an empty ``--tfgrpc-cpus=`` leaves it to the ini file, an empty
    ``tfgrpc_cpus =`` to ``auto``."""
    given = str(config.getoption("tfgrpc_cpus") or "").strip()
    if given:
        return given, "--tfgrpc-cpus"
    return str(config.getini("tfgrpc_cpus") or "").strip() or "auto", "tfgrpc_cpus (ini)"


def header_lines(config: pytest.Config, state: RunState) -> list[str]:
    """The tfgrpc lines of the run's header: fabrics, grpcio, xdist, cluster, agents,
    baseline."""
    fabrics = ", ".join(
        f"{f.name} ({f.address}{f' mtu {f.mtu}' if f.mtu else ''})" for f in state.fabrics
    )
    placement = placement_setting()["cpu_placement"]
    lines = [
        f"tfgrpc: fabrics {fabrics}; grpcio {grpc.__version__}; TLS {tls_mode()}; "
        f"P2P CPUs {placement}"
    ]
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist", "no") != "no":
        lines.append(
            "tfgrpc: pytest-xdist: tests that measure run one at a time across workers, "
            "so that no measurement shares the machine with another"
        )
    if state.cluster is not None:
        servers = ", ".join(f"ps[{t.index}] {t.target}" for t in state.cluster.job("ps"))
        lines.append(f"tfgrpc: remote tensor servers from {state.cluster.source}: {servers}")
    lines += agents.header_lines(config)
    if state.server_delay:
        lines.append(
            f"tfgrpc: FAULT INJECTED: the suite's tensor servers hold every reply back "
            f"{state.server_delay} (--tfgrpc-server-delay); figures are not the servers' own"
        )
    gate = state.gate
    if gate is not None:
        tolerances = ", ".join(f"{k}:{v:.0%}" for k, v in gate.settings.tolerances.items())
        lines.append(
            f"tfgrpc: baseline {gate.settings.baseline_path} (tolerance {tolerances}, "
            f"alpha {gate.settings.alpha}, inconclusive: {gate.settings.inconclusive})"
        )
        lines += [f"tfgrpc: WARNING {warning}" for warning in gate.warnings]
    return lines


class TfgrpcSession:
    """The hooks of a run that uses the plugin."""

    def __init__(self, state: RunState) -> None:
        self.state = state

    def _header(self, config: pytest.Config) -> list[str]:
        if self.state.header_shown:
            return []
        self.state.header_shown = True
        return header_lines(config, self.state)

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return self._header(config)

    def pytest_report_collectionfinish(self, config: pytest.Config) -> list[str]:
        # Woken during collection: the header has gone by, the lines follow "collected N".
        return self._header(config)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if not hasattr(session.config, "workerinput"):
            _write_suite_properties(session.config, self.state)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        refused = item.stash.get(_lock_refused_key, None)
        if refused is not None:
            pytest.fail(refused, pytrace=False)
        check_markers(item)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item) -> Generator[None, object, object]:
        uses = _MEASURING_FIXTURES.intersection(getattr(item, "fixturenames", ()))
        if not uses or marker_problem(item):  # one that fails at setup measures nothing
            return (yield)
        # Set up, measure and tear down one test at a time on this host: across pytest-xdist
        # workers and across concurrent runs.
        run_id = self.state.meta[f"{META_PREFIX}{RUN_ID}"]
        try:
            lock = MeasurementLock(lock_path(), run_id, wait_s=lock_wait_s())
            lock.__enter__()
        except (OSError, ValueError) as exc:
            # a lock in a place others control, or held too long: the test fails, saying so
            item.stash[_lock_refused_key] = f"tfgrpc: {exc}"
            return (yield)
        try:
            if lock.waited_for and lock.waited_for != run_id and lock.waited_s >= 0.05:
                # Said in the JUnit XML and at the end of the run (not as a warning, which
                # -W error would turn into a failure of a test that only waited its turn).
                item.user_properties.append(
                    (
                        HOST_WAIT,
                        f"waited {lock.waited_s:.1f} s for run {lock.waited_for} to finish "
                        f"measuring on this host (lock {lock.path})",
                    )
                )
            return (yield)
        finally:
            lock.__exit__(None, None, None)

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        # pytest-xdist: every worker records the controller's run id.
        node.workerinput[RUN_ID_KEY] = self.state.meta[f"{META_PREFIX}{RUN_ID}"]

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Iterator[None]:
        result = yield
        # A process that died during the test fails it, even if the test never noticed.
        for watched in item.stash.get(watched_key, []):
            death = watched.died(grace=0)
            if death is not None:
                raise death
        gate = self.state.gate
        if gate is not None and has_figures(item.user_properties):
            record = read_record(junit_name(item.config, item.nodeid), item.user_properties)
            verdict = gate.judge(item.nodeid, record)
            item.user_properties.extend(verdict.properties)
            if verdict.failure is not None:
                # Fails the call itself, so the regression is a failure in the JUnit XML.
                pytest.fail(verdict.failure, pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(
        self, item: pytest.Item, call: pytest.CallInfo[None]
    ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        # A server that died, a call that failed, a deadline: the process, host and cause
        # in the first line, not at the end of a traceback through gRPC's internals.
        error = call.excinfo.value if call.excinfo is not None else None
        if report.failed and isinstance(error, (ServerError, BenchmarkError, AgentError)):
            report.longrepr = f"{type(error).__name__}: {error}"
            source = agents.agents_source(item.config)
            if isinstance(error, AgentError) and source:
                report.longrepr += f" (agents from {source})"
        return report

    def pytest_sessionfinish(self) -> None:
        # Normally every fixture has stopped its server by now; after a Ctrl-C or an
        # internal error some may not have run their teardown.
        self.state.stop_servers()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        self.state.stop_servers()
        agents.close_agents(config)
        use_tls(None)
        reporter = config.pluginmanager.get_plugin(REPORTER_NAME)
        if reporter is not None:
            reporter.close()
            config.pluginmanager.unregister(reporter, REPORTER_NAME)
        config.pluginmanager.unregister(self, SESSION_NAME)
