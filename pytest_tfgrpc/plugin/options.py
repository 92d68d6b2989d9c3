"""The plugin's command-line options, their ini twins and its markers: registered in every
pytest run, so this module imports nothing heavy (no grpc, no numpy)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from pytest_tfgrpc.servers.allocator import ALLOCATOR_POLICIES

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
TLS_OPTIONS = {
    "cert": "PEM certificate chain: servers the run starts serve TLS with it, and its clients "
    "present it (with --tfgrpc-tls-key). Recorded with every result (settings tls)",
    "key": "PEM private key of --tfgrpc-tls-cert",
    "ca": "PEM CA bundle: clients verify servers against it, and servers the run starts "
    "require client certificates signed by it (mutual TLS)",
}
#: The short form of --tfgrpc-fabric, added unless the project defines its own.
SHORT_FABRIC = "--fabric"
_yielded_key = pytest.StashKey[bool]()
#: Marker names and their ``--markers`` lines.
MARKERS = {
    "message_profile": "message_profile(name_or_sizes=None, *, sizes=None, scheme='uniform'): "
    "the message sizes of the test's benchmarks: a list such as ['4B', '64KiB'] or a range "
    "'1KiB..64MiB' (powers of two).",
    "budget": "budget(**limits): limits checked on every result the test records, e.g. "
    "budget(p99='2ms', throughput='>=1 GB/s'). Metrics: min, mean, p50, p90, p99, p999, "
    "max, throughput, throughput_p50, step_p50, step_p99, step_mean, step_max, imbalance, "
    "rpc_rate.",
    "tfgrpc_run": "tfgrpc_run(iterations=None, warmup=None, duration=None, max_seconds=None, "
    "warmup_seconds=None): the test's run settings, over the --tfgrpc-* options; a duration "
    "makes the run time-based (TF-gRPC-Bench: warmup_seconds=2, duration=10).",
    "ps_topology": "ps_topology(ps=1, workers=1, sharding='round_robin'): the parameter-server "
    "cluster of the ps_cluster fixture: PS processes, worker processes, and how tensors are "
    "placed on PS tasks (round_robin, greedy, partitioned).",
}

#: Every ``dest`` (and ini name) this module registers, with its ini default.
OPTION_DEFAULTS: dict[str, Any] = {}


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


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("tfgrpc", "gRPC tensor-traffic performance (pytest-tfgrpc)")
    _add(
        group,
        parser,
        ("--tfgrpc-fabric",),
        "tfgrpc_fabric",
        FABRIC_HELP,
        ini_type="args",
        ini_default=[],
        action="append",
        metavar="NAME[,NAME...]",
    )
    _add(
        group,
        parser,
        ("--tfgrpc-allocator",),
        "tfgrpc_allocator",
        ALLOCATOR_HELP,
        ini_default="tuned",
        choices=ALLOCATOR_POLICIES,
    )
    _add(group, parser, ("--tfgrpc-baseline",), "tfgrpc_baseline", BASELINE_HELP, metavar="FILE")
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
    _add(group, parser, ("--tfgrpc-results",), "tfgrpc_results", RESULTS_HELP, metavar="FILE")
    _add(group, parser, ("--tfgrpc-plot",), "tfgrpc_plot", PLOT_HELP, metavar="DIR")
    _add(group, parser, ("--tfgrpc-alpha",), "tfgrpc_alpha", ALPHA_HELP, type=float, metavar="P")
    for name, help_text in RUN_OPTIONS.items():
        flag = "--tfgrpc-" + name.replace("_", "-")
        _add(group, parser, (flag,), f"tfgrpc_{name}", help_text, metavar="N")
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
            metavar="NAME[,NAME...]",
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
