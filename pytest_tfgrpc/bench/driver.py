"""The benchmark driver behind the ``tfgrpc`` fixture: run, record, check budgets.

It knows nothing of pytest: the plugin hands it the test's message spec, budget and run
options, and a function that records properties on the test.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar

from pytest_tfgrpc import bench

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11
from pytest_tfgrpc.bench.floor import transport_floor
from pytest_tfgrpc.bench.p2p import Message, Progress
from pytest_tfgrpc.bench.partial import partial_result
from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.bench.specs import MessageSpec, RunOverrides, SpecError, run_spec
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Placement, placed_on
from pytest_tfgrpc.model.profiles import Profile, load_profile
from pytest_tfgrpc.report.budget import Budget, BudgetExceeded, check, format_breaches
from pytest_tfgrpc.report.metrics import FLOOR_SUFFIX
from pytest_tfgrpc.report.properties import FABRIC, TARGET, result_properties
from pytest_tfgrpc.results import BenchmarkResult
from pytest_tfgrpc.servers.ps_cluster import PSCluster
from pytest_tfgrpc.units import UnitError, parse_sizes
from pytest_tfgrpc.wire import channels as transport
from pytest_tfgrpc.wire.client import Server
from pytest_tfgrpc.wire.schemes import Payload

Recorder = Callable[[str, str], None]


class RunArgs(TypedDict, total=False):
    """Run settings every benchmark call takes (over the options and the marker)."""

    iterations: int
    warmup: int
    max_seconds: float
    warmup_seconds: float
    duration: float


R = TypeVar("R", bound=BenchmarkResult)


class Driver:
    """Runs benchmarks for one test and records every result on it.

    Every call also takes the run settings of :class:`RunArgs` (``iterations``, ``warmup``,
    ``max_seconds``, ``warmup_seconds``, ``duration``), over the options and the test's
    ``tfgrpc_run`` marker. Each call returns a frozen
    :class:`~pytest_tfgrpc.results.BenchmarkResult`; its figures
    become JUnit properties at once (so a later failure in the test loses none), and the
    test's ``@budget`` marker, if any, is checked against it.
    """

    def __init__(
        self,
        *,
        test: str,
        messages: MessageSpec | None,
        budget: Budget | None,
        options: RunOverrides,
        record: Recorder,
        progress: Callable[[str], None] | None = None,
        server_env: Mapping[str, str] | None = None,
    ) -> None:
        self._test = test
        self._messages = messages
        self._budget = budget
        self._options = options
        self._record = record
        self._progress = progress
        self._server_env = server_env
        self._labels: set[str] = set()
        self._targets: set[str] = set()
        self._fabrics: set[str] = set()
        self.results: list[BenchmarkResult] = []

    def _sizes(self, sizes: Any, call: str) -> tuple[Message, ...]:
        if sizes is None:
            if self._messages is None:
                raise SpecError(
                    f"{self._test}: {call}() needs sizes: pass sizes= or mark the test with "
                    "@pytest.mark.message_profile(...)"
                )
            return self._messages.messages
        try:
            parsed = parse_sizes(sizes)
        except UnitError as exc:
            raise SpecError(f"{self._test}: {call}() argument sizes={sizes!r}: {exc}") from None
        for size in parsed:
            if size > transport.MAX_TENSOR_BYTES:
                raise SpecError(
                    f"{self._test}: {call}() argument sizes={sizes!r}: {transport.too_large(size)}"
                )
        return parsed

    def _progress_of(self, label: str, server: Server) -> Progress | None:
        report = self._progress
        if report is None:
            return None

        def progress(index: int, count: int, size: str) -> None:
            report(f"{label} on {server.fabric.name}: size {index} of {count} ({size})")

        return progress

    def _run(self, default: RunSpec, call: str, arguments: RunArgs) -> RunSpec:
        unknown = sorted(set(arguments) - set(RunArgs.__annotations__))
        if unknown:
            raise SpecError(f"{self._test}: {call}() got an unexpected argument {unknown[0]!r}")
        return run_spec(default, self._options, dict(arguments), f"{self._test}: {call}()")

    def p2p_latency(
        self,
        server: Server,
        sizes: Sequence[int | str] | str | int | None = None,
        *,
        mode: str = "raw",
        rpc: str = "unary",
        label: str | None = None,
        floor: bool = False,
        **run_args: Unpack[RunArgs],
    ) -> BenchmarkResult:
        """Echo latency per message size (TF-gRPC-P2P-Latency); see the README.

        ``floor=True`` also records the raw-TCP ping-pong of the same sizes on the same
        fabric, labelled ``<label>_floor``.
        """
        __tracebackhide__ = True
        return self._p2p(
            bench.p2p_latency,
            bench.LATENCY_RUN,
            server,
            sizes,
            label,
            floor,
            run_args,
            mode=mode,
            rpc=rpc,
        )

    def _p2p(
        self,
        benchmark: Callable[..., BenchmarkResult],
        default: RunSpec,
        server: Server,
        sizes: Any,
        label: str | None,
        floor: bool,
        run_args: RunArgs,
        **options: Any,
    ) -> BenchmarkResult:
        """Run a P2P benchmark under the test's settings, record it, and its floor if asked."""
        __tracebackhide__ = True
        call = benchmark.__name__
        run = self._run(default, call, run_args)
        self._check_label(label or call)
        if floor:
            self._check_label((label or call) + FLOOR_SUFFIX)
        messages = self._sizes(sizes, call)
        self._check_server_limit(server, messages, call)
        result = self._keeping_partial(
            benchmark,
            server,
            messages,
            run=run,
            label=label,
            progress=self._progress_of(label or call, server),
            **options,
        )
        return self._with_floor(self.record(result), server, run, floor)

    def _with_floor(
        self, result: BenchmarkResult, server: Server, run: RunSpec, floor: bool
    ) -> BenchmarkResult:
        if floor:
            self.record(transport_floor(server.fabric, result, run, env=self._server_env))
        return result

    def p2p_bandwidth(
        self,
        server: Server,
        sizes: Sequence[int | str] | str | int | None = None,
        *,
        mode: str = "raw",
        rpc: str = "stream",
        direction: str = "push",
        chunk_bytes: int | str | None = None,
        label: str | None = None,
        floor: bool = False,
        **run_args: Unpack[RunArgs],
    ) -> BenchmarkResult:
        """Bytes per second per message size (TF-gRPC-P2P-Bandwidth); see the README.

        ``floor=True`` also records a raw-TCP push with one acknowledgement per tensor of the
        same sizes on the same fabric, labelled ``<label>_floor``.
        """
        __tracebackhide__ = True
        extra: dict[str, Any] = {}
        if chunk_bytes is not None:
            try:
                extra["chunk_bytes"] = parse_sizes(chunk_bytes)[0]
            except UnitError as exc:
                raise SpecError(
                    f"{self._test}: p2p_bandwidth() argument chunk_bytes={chunk_bytes!r}: {exc}"
                ) from None
        return self._p2p(
            bench.p2p_bandwidth,
            bench.BANDWIDTH_RUN,
            server,
            sizes,
            label,
            floor,
            run_args,
            mode=mode,
            rpc=rpc,
            direction=direction,
            **extra,
        )

    def ps_throughput(
        self,
        cluster: PSCluster,
        sizes: Sequence[int | str] | str | int | None = None,
        *,
        mode: str = "raw",
        label: str | None = None,
        **run_args: Unpack[RunArgs],
    ) -> PSResult:
        """Every worker calls every PS in a closed loop (TF-gRPC-PS-Throughput); see README.

        With a model profile on the test, each PS receives the bytes its placement owns and
        the result carries the placement's load imbalance.
        """
        __tracebackhide__ = True
        run = self._run(bench.PS_THROUGHPUT_RUN, "ps_throughput", run_args)
        self._check_label(label or "ps_throughput")
        key = None
        payload: Sequence[int] | Placement | Payload
        messages = self._messages
        if sizes is None and messages is not None and messages.profile is not None:
            payload = placed_on(messages.profile, cluster.topology)
            key = messages.profile.name
        elif sizes is None and messages is not None and messages.payload is not None:
            payload = messages.payload
        else:
            payload = [m for m in self._sizes(sizes, "ps_throughput") if isinstance(m, int)]
            self._check_server_limit(cluster, payload, "ps_throughput")
        result = self._keeping_partial(
            bench.ps_throughput, cluster, payload, mode=mode, run=run, label=label, key=key
        )
        return self.record(result)

    def sync_sgd_step(
        self,
        cluster: PSCluster,
        profile: Profile | str | None = None,
        *,
        check: bool = False,
        label: str | None = None,
        model: bool = True,
        **run_args: Unpack[RunArgs],
    ) -> PSResult:
        """Synchronous SGD steps of a model profile on the cluster; see the README.

        ``model=True`` fits the link and host on PS 0 and worker 0 first (2-4 s) and records
        the analytic model's prediction beside the measurement, with its error against the
        step p50.
        """
        __tracebackhide__ = True
        run = self._run(bench.SYNC_SGD_RUN, "sync_sgd_step", run_args)
        self._check_label(label or "sync_sgd_step")
        if profile is None:
            if self._messages is None or self._messages.profile is None:
                raise SpecError(
                    f"{self._test}: sync_sgd_step() needs a model profile: pass one or mark "
                    "the test with @pytest.mark.message_profile('resnet50')"
                )
            profile = self._messages.profile
        elif not isinstance(profile, Profile):
            try:
                profile = load_profile(profile)
            except (ValueError, OSError) as exc:
                raise SpecError(f"{self._test}: sync_sgd_step() profile: {exc}") from None
        # Placed once here; the benchmark, the fit and the model all take this placement.
        placement = placed_on(profile, cluster.topology)
        result = bench.sync_sgd_step(
            cluster, profile, run=run, check=check, label=label, model=model, placement=placement
        )
        return self.record(result)

    def _check_server_limit(self, server: object, messages: Sequence[Message], call: str) -> None:
        limit = getattr(server, "max_tensor_bytes", None)
        if limit is None or not messages:
            return
        largest = max(m.total_bytes if isinstance(m, Payload) else m for m in messages)
        if largest > limit:
            raise SpecError(
                f"{self._test}: {call}() sends {largest} B tensors, but its servers take "
                f"at most {limit} B, the largest size of the test's "
                "@pytest.mark.message_profile: add the size to the marker"
            )

    def _keeping_partial(self, benchmark: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        """``benchmark(*args, **kwargs)``; if it fails after measuring some sizes, those are
        recorded on the test before the failure goes on (JUnit and the results file keep
        them, their settings marked ``interrupted``)."""
        __tracebackhide__ = True
        try:
            return benchmark(*args, **kwargs)
        except Exception as error:
            partial = partial_result(error)
            if partial is not None and partial.label not in self._labels:
                # The failure that interrupted the sweep is the one to report, not a budget.
                with contextlib.suppress(BudgetExceeded):
                    self.record(partial)
            raise

    def _check_label(self, label: str) -> None:
        if "." in label or not label:
            raise SpecError(f"{self._test}: label {label!r} must be non-empty and without dots")
        if label in self._labels:
            raise SpecError(
                f"{self._test}: a second result labelled {label!r} would overwrite the first "
                "in the JUnit XML; give each call its own label=..."
            )

    def record(self, result: R) -> R:
        """Record a result on the test, then check the test's budget against it."""
        __tracebackhide__ = True
        self._check_label(result.label)
        self._labels.add(result.label)
        self.results.append(result)
        if result.fabric not in self._fabrics:
            self._fabrics.add(result.fabric)
            self._record(FABRIC, result.fabric)
        if result.target not in self._targets:
            self._targets.add(result.target)
            self._record(TARGET, result.target)
        for name, value in result_properties(result):
            self._record(name, value)
        if self._budget is not None and self._budget.limits:
            breaches = check(self._budget, result)
            if breaches:
                checked = len(self._budget.limits) * len(result.sizes)
                raise BudgetExceeded(format_breaches(result, breaches, checked))
        return result
