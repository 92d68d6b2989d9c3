"""The plugin's command-line options, their ini twins and its markers: registered in every
pytest run, so this module imports nothing heavy (no grpc, no numpy)."""

from __future__ import annotations

import argparse
from collections.abc import Generator
from typing import Any

import pytest

from pytest_tfgrpc.metrics import BUDGET_METRICS
from pytest_tfgrpc.tuning.allocator import ALLOCATOR_POLICIES

FABRIC_HELP = (
    "network interfaces to bind tensor servers to, e.g. lo,eth0,ib0 (repeatable; "
    "default: lo). A fabric-bound test runs once per fabric."
)
#: The help of each run setting's option (``--tfgrpc-<name>``): the names are
#: ``bench.specs.RUN_SETTINGS``, one spelling for options, ini, marker and calls.
RUN_HELP = {
    "iterations": "timed operations per message size (overrides each benchmark's default)",
    "warmup": "untimed warm-up operations per message size",
    "max_seconds": "stop measuring a message size after S seconds, whatever the count",
    "warmup_seconds": "stop warming up after S seconds, whatever the count",
    "duration": "time-based runs: measure each message size for S seconds",
}
ALLOCATOR_HELP = (
    "glibc allocator policy of the measuring process and its servers: 'tuned' (default) "
    "keeps large-message memory on the heap (MALLOC_MMAP_THRESHOLD_=32MiB, "
    "MALLOC_TRIM_THRESHOLD_=1GiB unless set); 'default' leaves glibc as it is. Recorded "
    "with every result."
)
CPUS_HELP = (
    "where P2P tests measure on this host: 'auto' (default; an empty value counts as none "
    "given) pins the measuring client and the servers it starts to two disjoint halves of the "
    "usable CPUs (split by physical core; nothing on one core), 'off' leaves them to the "
    "scheduler, CLIENT:SERVER names two CPU lists, which may overlap (e.g. 0:1, 0-3:4-7, 0:0). "
    "Recorded with every result, with whether its server was pinned"
)
BASELINE_HELP = (
    "an earlier run to gate against: its JUnit XML, a directory of runs' JUnit files (sorted "
    "by name, oldest first) or a --tfgrpc-results file; repeat for several runs. Every figure "
    "of every test and fabric is compared, and a significant regression beyond the tolerance "
    "fails that test; with >= 3 runs the gate knows the spread between runs"
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
AGENTS_HELP = (
    "where the node agents (tfgrpc-node) run: 'cluster' (the cluster spec's ps and worker tasks "
    "are agents), 'slurm' (every other node of the SLURM allocation, port $TFGRPC_AGENT_PORT "
    "or 7461) or HOST:PORT,... ; tensor_server and ps_cluster then run on those hosts"
)
TOKEN_HELP = "file whose first line is the agents' shared token (default: $TFGRPC_AGENT_TOKEN)"
#: ``--tfgrpc-agent-tls-<name>`` options: TLS to the agents (the token is still required).
#: Left out, they default to the --tfgrpc-tls-* files when those name a CA.
TLS_HELP = {
    "ca": "talk TLS to the agents, verifying them with this CA (PEM; default: --tfgrpc-tls-ca)",
    "cert": "client certificate (PEM) for agents that require mutual TLS (default: "
    "--tfgrpc-tls-cert, with --tfgrpc-tls-ca)",
    "key": "the client certificate's private key (PEM; default: --tfgrpc-tls-key)",
}
RESULTS_HELP = (
    "append every finished test's figures to FILE as JSON lines, each written and synced as "
    "the test ends, so a run that is killed keeps every finished result"
)
PLOT_HELP = (
    "write PNG plots into DIR at the end of the run: latency and bandwidth against message "
    "size per fabric, step times of PS tests (needs the 'plot' extra: matplotlib)"
)
HTML_HELP = (
    "write one self-contained HTML report of the run to FILE at its end (no network needed to "
    "open it): the summary per benchmark with the fabrics side by side, the baseline "
    "verdicts, the plots (with the 'plot' extra) and the run's metadata"
)
ENGINES_HELP = (
    "engines every tfgrpc test runs with, e.g. grpcio,native or grpcio,tensorflow (default "
    "grpcio; a test's tfgrpc_engines marker wins): the tensor_server fixture's server and the "
    "benchmarks' clients. With several, each test runs once per engine"
)
STREAMS_HELP = (
    "concurrent connections of every p2p_bandwidth call that does not say (streams=N; "
    "default 1): the aggregate is recorded under the call's label, each stream as "
    "<label>_stream<i>"
)
SERVER_DELAY_HELP = (
    "fault injection: the tensor servers the suite's tensor_server fixture starts (the "
    "plugin's Python or native server, here or through agents) hold every reply back this "
    "long, e.g. 200us, from 0 to 10s; for rehearsing the gate or tfgrpc-ab, never for "
    "measuring. Recorded in the run metadata (server_delay), so a baseline without it is a "
    "setup mismatch"
)
LINK_RATES_HELP = (
    "the nominal rate of a fabric's path, FABRIC=RATE (e.g. eth0=10Gbit/s; repeatable; in the "
    "ini file, space-separated pairs): link efficiency is throughput over it (or over a tbf "
    "cap's rate where lower); it replaces the interfaces' reported speeds"
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
    "missing": (
        ("fail", "warn"),
        "a baseline figure this run did not compare (test renamed, removed or deselected, "
        "fabric not measured): fail the run (default) or only list it",
    ),
}
TLS_OPTIONS = {
    "cert": "PEM certificate chain: servers the run starts serve TLS with it, and its clients "
    "present it (with --tfgrpc-tls-key). Recorded with every result (settings tls)",
    "key": "PEM private key of --tfgrpc-tls-cert",
    "ca": "PEM CA bundle: clients verify servers against it, and servers the run starts "
    "require client certificates signed by it (mutual TLS)",
}
#: The short form of --tfgrpc-fabric, added unless the project defines its own.
SHORT_FABRIC = "--fabric"
#: The run's usage error that a pytest-xdist worker holds per test instead of raising it
#: (activation.py stores it at collection; markers.py fails the test with it at setup). Kept
#: here, not in markers.py, so that activation imports nothing heavy in a run without tfgrpc.
usage_error_key = pytest.StashKey[str]()
_yielded_key = pytest.StashKey[bool]()
#: Marker names and their ``--markers`` lines: the full signatures (the docs' marker table).
MARKERS = {
    "message_profile": 'message_profile(name_or_sizes=None, *, sizes=None, scheme="uniform", '
    "buffers=10, classes=None, bias=None, seed=None, size_range=False, scale=None, "
    "max_tensors=None, name_filter=None): the messages of the test's benchmarks: sizes "
    "(['4B', '64KiB'] or '1KiB..64MiB', powers of two); a TF-gRPC-Bench payload "
    "(scheme='uniform'|'random'|'skew' with buffers, classes, bias, seed, size_range); or a "
    "model profile ('resnet50', a JSON file), made smaller with scale (0, 1], max_tensors "
    "and name_filter (a tensor kind: conv, dense, norm, bias, embedding; else a regular "
    "expression searched in tensor names).",
    "budget": "budget(**limits): limits checked on every result the test records, e.g. "
    "budget(p99='2ms', throughput='>=1 GB/s'). Metrics: "
    + ", ".join(BUDGET_METRICS)
    + ". A percentile needs enough samples (p99: 100).",
    "tfgrpc_run": "tfgrpc_run(iterations=None, warmup=None, duration=None, max_seconds=None, "
    "warmup_seconds=None): the test's run settings, over the --tfgrpc-* options; a duration "
    "makes the run time-based (TF-gRPC-Bench: warmup_seconds=2, duration=10).",
    "tfgrpc_engines": "tfgrpc_engines(*names, server=None): the engines the test measures "
    "with, e.g. tfgrpc_engines('grpcio', 'native'): the test runs once per engine "
    "(tensor_server and the clients on it), the engine a test id part (test_x[lo-native]) and "
    "the 'engine' setting of its results; server='native' pins the tensor_server fixture's "
    "server whatever the client. Native: built by tfgrpc-build-native; tensorflow: the "
    "'tensorflow' extra.",
    "ps_topology": 'ps_topology(ps=1, workers=1, sharding="round_robin"): the parameter-server '
    "cluster of the ps_cluster fixture: PS processes, worker processes, and how tensors are "
    "placed on PS tasks (round_robin, greedy, partitioned).",
    "tfgrpc_streams": "tfgrpc_streams(n): concurrent connections of the test's p2p_bandwidth "
    "calls that do not pass streams= (over --tfgrpc-streams).",
}

#: Every ``dest`` (and ini name) this module registers, with its ini default.
OPTION_DEFAULTS: dict[str, Any] = {}


_NAMES_METAVAR = "NAME[,NAME...]"


def _add(
    group: pytest.OptionGroup,
    parser: pytest.Parser,
    flags: tuple[str, ...],
    dest: str,
    help_text: str,
    *,
    ini_type: Any = None,
    ini_default: Any = None,
    **kwargs: Any,
) -> None:
    group.addoption(*flags, dest=dest, help=help_text.replace("%", "%%"), **kwargs)
    parser.addini(dest, help_text, type=ini_type, default=ini_default)
    OPTION_DEFAULTS[dest] = ini_default


def _add_names(
    group: pytest.OptionGroup, parser: pytest.Parser, flag: str, dest: str, help_text: str
) -> None:
    """A repeatable option of comma-separated names (fabrics, engines), and its ini list."""
    _add(
        group,
        parser,
        (flag,),
        dest,
        help_text,
        ini_type="args",
        ini_default=[],
        action="append",
        metavar=_NAMES_METAVAR,
    )


def _streams_option(text: str) -> int:
    # Only called when the option is given, so the plugin is awake anyway: the import is free.
    from pytest_tfgrpc.bench.streams import check_streams

    try:
        return check_streams(int(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).replace("streams=", "", 1)) from None


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tfgrpc", "gRPC tensor-traffic performance (pytest-tfgrpc)")
    _add_names(group, parser, "--tfgrpc-fabric", "tfgrpc_fabric", FABRIC_HELP)
    _add(
        group,
        parser,
        ("--tfgrpc-allocator",),
        "tfgrpc_allocator",
        ALLOCATOR_HELP,
        ini_default="tuned",
        choices=ALLOCATOR_POLICIES,
    )
    _add(
        group,
        parser,
        ("--tfgrpc-cpus",),
        "tfgrpc_cpus",
        CPUS_HELP,
        ini_default="auto",
        metavar="auto|off|CLIENT:SERVER",
    )
    _add(
        group,
        parser,
        ("--tfgrpc-baseline",),
        "tfgrpc_baseline",
        BASELINE_HELP,
        ini_type="args",
        ini_default=[],
        action="append",
        metavar="PATH",
    )
    _add(
        group,
        parser,
        ("--tfgrpc-max-regression",),
        "tfgrpc_max_regression",
        TOLERANCE_HELP,
        ini_type="args",
        ini_default=[],
        action="append",
        metavar="[METRIC:]PCT",
    )
    for name, (choices, help_text) in GATE_POLICIES.items():
        _add(
            group,
            parser,
            (f"--tfgrpc-{name}",),
            f"tfgrpc_{name.replace('-', '_')}",
            help_text,
            choices=choices,
        )
    _add(group, parser, ("--tfgrpc-cluster",), "tfgrpc_cluster", CLUSTER_HELP, metavar="FILE")
    _add(group, parser, ("--tfgrpc-agents",), "tfgrpc_agents", AGENTS_HELP, metavar="WHERE")
    _add(
        group,
        parser,
        ("--tfgrpc-agent-token-file",),
        "tfgrpc_agent_token_file",
        TOKEN_HELP,
        metavar="FILE",
    )
    for name, help_text in TLS_HELP.items():
        flag = f"--tfgrpc-agent-tls-{name}"
        _add(group, parser, (flag,), f"tfgrpc_agent_tls_{name}", help_text, metavar="FILE")
    # Defaults None (grpcio, 1 stream), so that an option left alone does not wake the plugin.
    _add(
        group,
        parser,
        ("--tfgrpc-streams",),
        "tfgrpc_streams",
        STREAMS_HELP,
        type=_streams_option,
        metavar="N",
    )
    _add(group, parser, ("--tfgrpc-results",), "tfgrpc_results", RESULTS_HELP, metavar="FILE")
    _add(group, parser, ("--tfgrpc-plot",), "tfgrpc_plot", PLOT_HELP, metavar="DIR")
    _add(group, parser, ("--tfgrpc-html",), "tfgrpc_html", HTML_HELP, metavar="FILE")
    _add_names(group, parser, "--tfgrpc-engines", "tfgrpc_engines", ENGINES_HELP)
    _add(
        group,
        parser,
        ("--tfgrpc-server-delay",),
        "tfgrpc_server_delay",
        SERVER_DELAY_HELP,
        metavar="DURATION",
    )
    _add(
        group,
        parser,
        ("--tfgrpc-link-rate",),
        "tfgrpc_link_rates",
        LINK_RATES_HELP,
        ini_type="args",
        ini_default=[],
        action="append",
        metavar="FABRIC=RATE",
    )
    _add(group, parser, ("--tfgrpc-alpha",), "tfgrpc_alpha", ALPHA_HELP, type=float, metavar="P")
    for name, help_text in RUN_HELP.items():
        flag = "--tfgrpc-" + name.replace("_", "-")
        metavar = "N" if name in ("iterations", "warmup") else "S"  # counts; seconds
        _add(group, parser, (flag,), f"tfgrpc_{name}", help_text, metavar=metavar)
    for name, help_text in TLS_OPTIONS.items():
        _add(
            group,
            parser,
            (f"--tfgrpc-tls-{name}",),
            f"tfgrpc_tls_{name}",
            help_text,
            metavar="FILE",
        )


def _option_names(parser: pytest.Parser) -> set[str]:
    groups = [parser._anonymous, *parser._groups]
    return {name for group in groups for option in group.options for name in option.names()}


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> Generator[None, object, object]:
    # The short --fabric is added only once the project's conftests have registered their
    # options: a project (or another plugin) with a --fabric of its own keeps it, and the
    # plugin's fabrics stay reachable through --tfgrpc-fabric.
    result = yield
    if SHORT_FABRIC in _option_names(parser):
        early_config.stash[_yielded_key] = True
    else:
        group = parser.getgroup("tfgrpc")
        group.addoption(
            SHORT_FABRIC,
            dest="tfgrpc_fabric",
            action="append",
            metavar=_NAMES_METAVAR,
            help="short for --tfgrpc-fabric",
        )
    return result


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    if config.stash.get(_yielded_key, False) and not hasattr(config, "workerinput"):
        config.issue_config_time_warning(
            pytest.PytestConfigWarning(
                f"pytest-tfgrpc: {SHORT_FABRIC} is defined by this project (a conftest or "
                f"another plugin), so it is not the plugin's; choose tfgrpc fabrics with "
                f"--tfgrpc-fabric=NAME (or the tfgrpc_fabric ini option)"
            ),
            stacklevel=2,
        )


def option(config: pytest.Config, name: str) -> Any:
    """The command-line value of option ``name``, else its ini twin, else None."""
    value = config.getoption(name)
    return value if value not in (None, []) else (config.getini(name) or None)


def configured(config: pytest.Config) -> bool:
    """Whether any tfgrpc option is given on the command line or set in the ini file: the
    run then asks for the plugin, whatever its tests are."""
    return any(
        config.getoption(name) not in (None, [])
        or config.getini(name) not in (None, "", [], default)
        for name, default in OPTION_DEFAULTS.items()
    )
