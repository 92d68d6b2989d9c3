"""The plugin's command-line options, their ini twins and its markers: registered in every
pytest run, so this module imports nothing heavy (no grpc, no numpy)."""

from __future__ import annotations

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
    "missing": (
        ("fail", "warn"),
        "a baseline figure this run did not compare (test renamed, removed or deselected, "
        "fabric not measured): fail the run (default) or only list it",
    ),
}
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
        ("--fabric", "--tfgrpc-fabric"),
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
    _add(group, parser, ("--tfgrpc-results",), "tfgrpc_results", RESULTS_HELP, metavar="FILE")
    _add(group, parser, ("--tfgrpc-plot",), "tfgrpc_plot", PLOT_HELP, metavar="DIR")
    _add(group, parser, ("--tfgrpc-alpha",), "tfgrpc_alpha", ALPHA_HELP, type=float, metavar="P")
    for name, help_text in RUN_OPTIONS.items():
        flag = "--tfgrpc-" + name.replace("_", "-")
        _add(group, parser, (flag,), f"tfgrpc_{name}", help_text, metavar="N")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)


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
