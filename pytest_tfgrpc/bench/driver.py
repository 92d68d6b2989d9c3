"""The benchmark driver behind the ``tfgrpc`` fixture: run, record, check budgets.

It knows nothing of pytest: the plugin hands it the test's message spec, budget and run
options, and a function that records properties on the test.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, TypeVar

from pytest_tfgrpc import bench
from pytest_tfgrpc.bench.allreduce import AllReduceResult
from pytest_tfgrpc.bench.ends import cluster_ends, p2p_ends
from pytest_tfgrpc.bench.engines.base import Engine, EngineCluster, EngineError
from pytest_tfgrpc.bench.floor import transport_floor
from pytest_tfgrpc.bench.p2p import (
    BandwidthCall,
    LatencyCall,
    Message,
    Progress,
    Transfer,
    p2p_latency_pair,
)
from pytest_tfgrpc.bench.partial import partial_result
from pytest_tfgrpc.bench.ps import PSResult
from pytest_tfgrpc.bench.specs import MessageSpec, RunLayer, SpecError, resolve_run, run_layer
from pytest_tfgrpc.bench.streams import check_streams
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.metrics import FLOOR_SUFFIX, stream_label
from pytest_tfgrpc.model.placement import Placement, placed_on
from pytest_tfgrpc.model.profiles import Profile, load_profile
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.report.budget import Budget, BudgetExceeded, check, format_breaches
from pytest_tfgrpc.report.compare import Comparison, format_comparison
from pytest_tfgrpc.report.paired import PairedRegression, paired_verdict
from pytest_tfgrpc.report.record import FABRIC, TARGET, Key, result_properties, verdict_properties
from pytest_tfgrpc.report.tolerance import parse_tolerances, tolerance_for
from pytest_tfgrpc.results import BenchmarkResult, End
from pytest_tfgrpc.roles.processes import LOCAL, Launcher
from pytest_tfgrpc.stats.paired import MIN_PAIRS
from pytest_tfgrpc.stats.significance import DEFAULT_ALPHA
from pytest_tfgrpc.tuning.cpus import (
    measuring_cpus,
    pin_child_server,
    result_placement,
    server_pinned,
)
from pytest_tfgrpc.units import UnitError, format_duration, parse_size, parse_sizes
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.client import BenchmarkError, Server
from pytest_tfgrpc.wire.schemes import Payload

Recorder = Callable[[str, str], None]


@dataclass(frozen=True)
class ABResult:
    """What :meth:`Driver.p2p_latency_ab` measured: server A's result, server B's (each with
    its rounds) and the paired verdicts of B against A, per size (``comparison``)."""

    a: BenchmarkResult
    b: BenchmarkResult
    comparison: Comparison


R = TypeVar("R", bound=BenchmarkResult)
C = TypeVar("C", bound=Transfer)


class Driver:
    """Runs benchmarks for one test and records every result on it.

    ``test_placement`` gives the test's model profile placed on its topology (the plugin
    makes it once per test), which PS calls use for that profile instead of placing it again.
    Every call also takes the run settings (:data:`~pytest_tfgrpc.bench.specs.RUN_SETTINGS`:
    ``iterations``, ``warmup``, ``duration``, ``max_seconds``, ``warmup_seconds``) as
    keywords, over ``run``: the layers the plugin resolved from the ini file, the options and
    the test's ``tfgrpc_run`` marker (:func:`~pytest_tfgrpc.bench.specs.resolve_run`). Each
    call returns a frozen :class:`~pytest_tfgrpc.results.BenchmarkResult`; its figures become
    JUnit properties at once (so a later failure in the test loses none), and the
    test's ``@budget`` marker, if any, is checked against it.
    """

    def __init__(
        self,
        *,
        test: str,
        messages: MessageSpec | None,
        budget: Budget | None,
        record: Recorder,
        run: Sequence[RunLayer] = (),
        progress: Callable[[str], None] | None = None,
        server_env: Mapping[str, str] | None = None,
        engine: Engine | None = None,
        streams: int = 1,
        on_result: Callable[[BenchmarkResult], None] | None = None,
        engines: Callable[[str], Engine] | None = None,
        test_placement: Callable[[], Placement | None] | None = None,
    ) -> None:
        self._test = test
        self._messages = messages
        self._budget = budget
        self._run_layers = tuple(run)
        self._record = record
        self._progress = progress
        self._server_env = server_env
        if engine is None:
            from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine

            engine = GrpcioEngine()
        self.engine = engine
        self._default_streams = streams
        self._on_result = on_result
        if engines is None:  # outside the plugin: the plugin's own engines
            from pytest_tfgrpc.bench.engines import EngineRegistry, builtin_engines

            registry = EngineRegistry()
            builtin_engines(registry)
            engines = registry.get
        self._engines = engines
        self._test_placement = test_placement
        self._labels: set[str] = set()
        self._targets: set[str] = set()
        self._fabrics: set[str] = set()
        self.results: list[BenchmarkResult] = []

    def _sizes(self, sizes: Any, call: str) -> tuple[Message, ...]:
        __tracebackhide__ = True
        if sizes is None:
            if self._messages is None:
                raise SpecError(
                    f"{call}() needs sizes: pass sizes= or mark the test with "
                    "@pytest.mark.message_profile(...)"
                )
            return self._messages.messages
        try:
            parsed = parse_sizes(sizes)
        except UnitError as exc:
            raise SpecError(f"{call}() argument sizes={sizes!r}: {exc}") from None
        for size in parsed:
            if size > grpc_settings.MAX_TENSOR_BYTES:
                raise SpecError(
                    f"{call}() argument sizes={sizes!r}: {grpc_settings.too_large(size)}"
                )
        return parsed

    def _progress_of(self, label: str, server: Server) -> Progress | None:
        report = self._progress
        if report is None:
            return None

        started = time.monotonic()

        def progress(index: int, count: int, size: str) -> None:
            # ETA: the mean time of the sizes done so far, times the sizes left (this one too).
            done = index - 1
            eta = ""
            if done:
                left = (time.monotonic() - started) / done * (count - done)
                eta = f", ETA {format_duration(left * 1e9)}"
            report(f"{label} on {server.fabric.name}: size {index} of {count} ({size}){eta}")

        return progress

    def _run(self, default: RunSpec, call: str, arguments: Mapping[str, object]) -> RunSpec:
        layer = run_layer(f"{call}()", arguments)
        return resolve_run(default, (*self._run_layers, layer))

    def p2p_latency(
        self,
        server: Server,
        sizes: Sequence[int | str] | str | int | None = None,
        *,
        mode: str = "raw",
        rpc: str = "unary",
        label: str | None = None,
        floor: bool = False,
        engine: str | None = None,
        **run_args: float | str,
    ) -> BenchmarkResult:
        """Echo latency per message size (TF-gRPC-P2P-Latency); see the docs' "Fixtures".

        ``floor=True`` also records the raw-TCP ping-pong of the same sizes on the same
        fabric, labelled ``<label>_floor``. ``engine="name"`` measures with another registered
        engine's client than the test's (against the test's server), e.g. ``engine="native"``.
        """
        __tracebackhide__ = True
        measuring = self._measuring(engine, "p2p_latency")
        return self._p2p(
            measuring,
            measuring.p2p_latency,
            LatencyCall,
            bench.LATENCY_RUN,
            server,
            sizes,
            label,
            floor,
            run_args,
            mode=mode,
            rpc=rpc,
        )

    def p2p_latency_ab(
        self,
        server_a: Server,
        server_b: Server,
        sizes: Sequence[int | str] | str | int | None = None,
        *,
        mode: str = "raw",
        rpc: str = "unary",
        label: str | None = None,
        max_regression: str = "10%",
        alpha: float = DEFAULT_ALPHA,
        seed: int = 0,
        **run_args: float | str,
    ) -> ABResult:
        """Server B's echo latency against server A's, measured side by side in one test:
        every round measures each size on A and on B one right after the other
        (:func:`~pytest_tfgrpc.bench.p2p.p2p_latency_pair`, the order within a pair by a
        coin seeded with ``seed``), and each size's p50 is tested across the rounds as pairs
        (:func:`~pytest_tfgrpc.report.paired.paired_verdict`: a paired t on the rounds' log
        ratios, at ``alpha`` over the number of sizes). Both sides are recorded, as
        ``<label>_a`` and ``<label>_b`` (label default ``p2p_latency``), and the verdicts as
        ``tfgrpc.<label>_ab.<size>.p50.verdict`` (with ``.change``, ``.detectable``,
        ``.verdict_reason``). A p50 of B worse than A's by more than ``max_regression`` and
        significantly so fails the test (:class:`~pytest_tfgrpc.report.paired.PairedRegression`,
        with the gate's table); an inconclusive verdict passes and is recorded. Both servers
        are measured with the plugin's own client (the grpcio engine's loops).

        :raises SpecError: a bad size, label, tolerance or run setting, before anything runs.
        """
        __tracebackhide__ = True
        name = label or "p2p_latency"
        for side in ("a", "b", "ab"):
            self._check_label(f"{name}_{side}")
        run = self._run(bench.LATENCY_RUN, "p2p_latency_ab", run_args)
        messages = self._sizes(sizes, "p2p_latency_ab")
        for server in (server_a, server_b):
            self._check_server_limit(server, messages, "p2p_latency_ab")
        try:
            tolerance = tolerance_for(parse_tolerances(max_regression), "p50")
            if not 0.0 < alpha < 1.0:
                raise ValueError(f"alpha={alpha!r}: a significance level between 0 and 1")
            call = LatencyCall(
                mode=mode, rpc=rpc, run=run, progress=self._progress_of(name, server_a)
            )
        except ValueError as exc:
            raise SpecError(f"{self._test}: p2p_latency_ab() argument {exc}") from None
        if run.round_count < MIN_PAIRS:
            raise SpecError(
                f"{self._test}: p2p_latency_ab(): {run.round_count} rounds: a paired test "
                f"needs {MIN_PAIRS} (set fewer iterations per round or more rounds)"
            )
        with measuring_cpus():
            for server in (server_a, server_b):
                if getattr(server, "launcher", LOCAL) is LOCAL:
                    pin_child_server(getattr(server, "pid", None))
            a, b = p2p_latency_pair((server_a, server_b), messages, call, seed=seed)
        a = self.record(self._engine_result(replace(a, label=f"{name}_a"), None, server_a))
        b = self.record(self._engine_result(replace(b, label=f"{name}_b"), None, server_b))
        fabric = server_b.fabric.name
        verdicts = []
        for size_a, size_b in zip(a.sizes, b.sizes, strict=True):
            rounds_a = size_a.round_figures(rates=False).get("p50", ())
            rounds_b = size_b.round_figures(rates=False).get("p50", ())
            verdicts.append(
                paired_verdict(
                    Key(self._test, fabric, f"{name}_ab", size_a.label),
                    "p50",
                    list(zip(rounds_a, rounds_b, strict=True)),
                    tolerance,
                    alpha,
                    len(a.sizes),
                )
            )
        comparison = Comparison(tuple(verdicts))
        for prop, value in verdict_properties(comparison.verdicts):
            self._record(prop, value)
        self._labels.add(f"{name}_ab")
        result = ABResult(a, b, comparison)
        if comparison.regressions:
            figures = ", ".join(f"{v.key.size}.p50" for v in comparison.regressions)
            table = "\n".join(format_comparison(comparison))
            raise PairedRegression(
                f"regression: server B ({server_b.target}) against server A "
                f"({server_a.target}): {name} {figures} ({comparison.summary()})\n{table}"
            )
        return result

    def _measuring(self, name: str | None, call: str) -> Engine:
        """The engine a call measures with: the test's, or the registered one ``name``."""
        if name is None or name == self.engine.name:
            return self.engine
        try:
            engine = self._engines(name)
        except EngineError as exc:
            raise SpecError(f"{self._test}: {call}() argument engine={name!r}: {exc}") from None
        reason = engine.unavailable()
        if reason:
            raise SpecError(f"{self._test}: {call}(engine={name!r}): {reason}")
        return engine

    def _p2p(
        self,
        measuring: Engine,
        benchmark: Callable[[Any, tuple[Message, ...], C], BenchmarkResult],
        kind: type[C],
        default: RunSpec,
        server: Server,
        sizes: Any,
        label: str | None,
        floor: bool,
        run_args: Mapping[str, float | str],
        *,
        streams: int | None = 1,
        **options: Any,
    ) -> BenchmarkResult:
        """Run a P2P benchmark (``benchmark``, taking a call of ``kind`` with ``options``)
        under the test's settings, record it, and its floor if asked.

        ``streams`` > 1 measures that many concurrent connections of ``measuring`` (bandwidth
        only): each stream is recorded as ``<label>_stream<i>`` and the aggregate, returned, as
        ``<label>``. None is the test's default count, which a payload scheme (never split
        over streams) leaves at one.
        """
        __tracebackhide__ = True
        call = kind.benchmark
        count = self._default_streams if streams is None else streams
        try:
            check_streams(count)
        except ValueError as exc:
            raise SpecError(f"{self._test}: {call}() argument {exc}") from None
        run = self._run(default, call, run_args)
        name = label or call
        self._check_label(name)
        floor_launcher = self._floor_launcher(server) if floor else None
        if floor:
            self._check_label(name + FLOOR_SUFFIX)
        messages = self._sizes(sizes, call)
        self._check_server_limit(server, messages, call)
        if streams is None and any(isinstance(message, Payload) for message in messages):
            count = 1  # a run-wide stream count leaves payload schemes on one stream
        options |= {"run": run, "label": label, "progress": self._progress_of(name, server)}
        try:
            measure = kind(**options)  # checked here, before anything is measured
        except (ValueError, TypeError) as exc:
            raise SpecError(f"{self._test}: {call}() argument {exc}") from None
        if count > 1:
            for i in range(count):
                self._check_label(stream_label(name, i))
        try:
            with measuring_cpus():
                if getattr(server, "launcher", LOCAL) is LOCAL:
                    pin_child_server(getattr(server, "pid", None))
                if count > 1:
                    # An engine's streams take the call's keywords (the docs' "Writing an engine").
                    both = measuring.p2p_bandwidth_streams(
                        server, messages, streams=count, **options
                    )
                    for each in both.streams:
                        self.record(self._engine_result(each, measuring, server))
                    result = self.record(self._engine_result(both.aggregate, measuring, server))
                else:
                    result = self._keeping_partial(
                        measuring, benchmark, server, messages, measure, placed=server
                    )
                    result = self.record(self._engine_result(result, measuring, server))
                if floor_launcher is not None:
                    # The floor server on the measured server's CPUs if that one was pinned.
                    floor_result = transport_floor(
                        server.fabric,
                        result,
                        run,
                        env=self._server_env,
                        launcher=floor_launcher,
                        pin=server_pinned(getattr(server, "pid", None)),
                        # A native engine's figure over a native floor: C++ against C++.
                        engine=getattr(measuring, "implementation", "grpcio"),
                    )
                    placed = {**floor_result.settings, **_placement(server)}
                    self.record(
                        replace(
                            floor_result,
                            settings=MappingProxyType(placed),
                            ends=floor_result.ends or p2p_ends(server, floor_result.target),
                        )
                    )
        except EngineError as exc:
            raise SpecError(f"{self._test}: {call}(): {exc}") from None
        return result

    def _engine_result(
        self,
        result: R,
        engine: Engine | None = None,
        server: Server | None = None,
        ends: tuple[End, ...] = (),
    ) -> R:
        """``result`` with the engine that measured it (and the engine's settings) and
        ``ends`` (a PS cluster's, where its figures came from) recorded:
        the engine the result names, if it names one (a PS benchmark names its workers'
        engine), else the engine that was asked; with ``server`` (P2P), the CPU placement it
        was measured under and where its two ends ran (unless it records its own) too. The
        result is rebuilt once, whatever it adds."""
        engine = engine or self.engine
        settings = {**engine.settings(), "engine": engine.name, **result.settings}
        ends = result.ends or ends
        if server is not None:
            settings.update(_placement(server))
            ends = ends or p2p_ends(server, result.target)
        return replace(result, settings=MappingProxyType(settings), ends=ends)

    @staticmethod
    def _floor_launcher(server: Server) -> Launcher:
        """Where the floor server of ``server`` runs: the measured server's host (here, or
        through the node agent that started it). Refused, before anything is measured, for a
        server nothing here started (a cluster spec's), rather than measuring this host's
        loopback as its floor."""
        if getattr(server, "pid", 0) is None:
            raise BenchmarkError(
                f"floor=True: the floor server must run on {server.target}'s host, and"
                " nothing starts processes there; use node agents (--tfgrpc-agents)"
            )
        launcher: Launcher = getattr(server, "launcher", LOCAL)
        return launcher

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
        engine: str | None = None,
        streams: int | None = None,
        **run_args: float | str,
    ) -> BenchmarkResult:
        """Bytes per second per message size (TF-gRPC-P2P-Bandwidth); see the docs' "Fixtures".

        ``floor=True`` also records a raw-TCP push with one acknowledgement per tensor of the
        same sizes on the same fabric, labelled ``<label>_floor``. ``engine="name"`` measures
        with another registered engine's client than the test's (against the test's server),
        e.g. ``engine="native"``. ``streams=N`` runs N concurrent connections and returns their
        aggregate; each stream is also recorded, as ``<label>_stream<i>`` (engines that measure
        streams: grpcio and native).
        """
        __tracebackhide__ = True
        extra: dict[str, Any] = {}
        if chunk_bytes is not None:
            if rpc == "unary":
                raise SpecError(
                    f"{self._test}: p2p_bandwidth() argument chunk_bytes={chunk_bytes!r}: "
                    "slices are what rpc='stream' sends; rpc='unary' sends each tensor whole"
                )
            try:
                extra["chunk_bytes"] = parse_size(chunk_bytes)
            except UnitError as exc:
                raise SpecError(
                    f"{self._test}: p2p_bandwidth() argument chunk_bytes={chunk_bytes!r}: {exc}"
                ) from None
        measuring = self._measuring(engine, "p2p_bandwidth")
        return self._p2p(
            measuring,
            measuring.p2p_bandwidth,
            BandwidthCall,
            bench.BANDWIDTH_RUN,
            server,
            sizes,
            label,
            floor,
            run_args,
            streams=streams,
            mode=mode,
            rpc=rpc,
            direction=direction,
            **extra,
        )

    def ps_throughput(
        self,
        cluster: PSCluster | EngineCluster,
        sizes: Sequence[int | str] | str | int | None = None,
        *,
        mode: str = "raw",
        label: str | None = None,
        **run_args: float | str,
    ) -> PSResult:
        """Every worker calls every PS in a closed loop (TF-gRPC-PS-Throughput); see the docs.

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
            payload = self._placed(messages.profile, cluster)
            key = messages.profile.key
        elif sizes is None and messages is not None and messages.payload is not None:
            payload = messages.payload
        else:
            payload = [m for m in self._sizes(sizes, "ps_throughput") if isinstance(m, int)]
            self._check_server_limit(cluster, payload, "ps_throughput")
        profile = messages.profile if messages is not None else None
        try:
            result = self._keeping_partial(
                self.engine,
                self.engine.ps_throughput,
                cluster,
                payload,
                mode=mode,
                run=run,
                label=label,
                key=key,
                profile=profile,
            )
        except EngineError as exc:
            raise SpecError(f"{self._test}: ps_throughput(): {exc}") from None
        return self.record(self._engine_result(result, ends=cluster_ends(cluster)))

    def sync_sgd_step(
        self,
        cluster: PSCluster | EngineCluster,
        profile: Profile | str | None = None,
        *,
        check: bool = False,
        label: str | None = None,
        model: bool = True,
        **run_args: float | str,
    ) -> PSResult:
        """Synchronous SGD steps of a model profile on the cluster; see the docs' "Fixtures".

        ``model=True`` fits the link and host on PS 0 and worker 0 first (2-4 s) and records
        the analytic model's prediction beside the measurement, with its error against the
        step p50.
        """
        __tracebackhide__ = True
        if not isinstance(cluster, PSCluster):
            raise SpecError(
                f"{self._test}: sync_sgd_step() runs on the plugin's own PS processes (engine "
                f"'grpcio'), not on engine {self.engine.name!r}'s cluster"
            )
        run = self._run(bench.SYNC_SGD_RUN, "sync_sgd_step", run_args)
        self._check_label(label or "sync_sgd_step")
        if profile is None:
            if self._messages is None or self._messages.profile is None:
                raise SpecError(
                    "sync_sgd_step() needs a model profile: pass one or mark "
                    "the test with @pytest.mark.message_profile('resnet50')"
                )
            profile = self._messages.profile
        elif not isinstance(profile, Profile):
            try:
                profile = load_profile(profile)
            except (ValueError, OSError) as exc:
                raise SpecError(f"sync_sgd_step() profile: {exc}") from None
        # The benchmark, the fit and the model all take this one placement.
        placement = self._placed(profile, cluster)
        result = bench.sync_sgd_step(
            cluster, profile, run=run, check=check, label=label, model=model, placement=placement
        )
        return self.record(self._engine_result(result, ends=cluster_ends(cluster)))

    def allreduce(
        self,
        cluster: PSCluster | EngineCluster,
        profile: Profile | str | None = None,
        *,
        sizes: Sequence[int | str] | str | int | None = None,
        algorithm: str = "ring",
        check: bool = False,
        model: bool = True,
        label: str | None = None,
        **run_args: float | str,
    ) -> AllReduceResult:
        """The cluster's workers all-reduce a buffer among themselves, no PS (see the README):
        the profile's bytes (whole float32 elements; the point named by its key), or each of
        ``sizes``; with neither, the test's ``message_profile`` (its profile, else its sizes).
        ``algorithm``: ``ring`` or ``halving_doubling`` (a power-of-two number of workers).
        Records nccl-tests' ``algbw`` and ``busbw`` beside the step figures; ``check=True``
        verifies every sum at every rank; ``model=True`` measures the model's inputs in three
        rounds interleaved with the measured sizes (a few seconds) and records its
        prediction beside each size (:mod:`pytest_tfgrpc.bench.allreduce`).

        :raises SpecError: a bad profile, size, algorithm or run setting, or an engine whose
            workers do not all-reduce, before anything is measured.
        """
        __tracebackhide__ = True
        run = self._run(bench.ALLREDUCE_RUN, "allreduce", run_args)
        self._check_label(label or "allreduce")
        messages = self._messages
        if profile is None and sizes is None and messages is not None:
            profile = messages.profile
        key = None
        if profile is not None and sizes is not None:
            raise SpecError(f"{self._test}: allreduce(): give a profile or sizes=, not both")
        if profile is not None:
            try:
                loaded = load_profile(profile)
            except (ValueError, OSError) as exc:
                raise SpecError(f"{self._test}: allreduce() profile: {exc}") from None
            buffers, key = [loaded.total_bytes // 4 * 4], loaded.key
        else:
            buffers = []
            for message in self._sizes(sizes, "allreduce"):
                if not isinstance(message, int):
                    raise SpecError(
                        f"{self._test}: allreduce() all-reduces one float32 buffer per size, "
                        f"not the payload {message.description!r}: give sizes="
                    )
                buffers.append(message)
        try:
            result = self.engine.allreduce(
                cluster,
                buffers,
                run=run,
                algorithm=algorithm,
                check=check,
                model=model,
                label=label,
                key=key,
            )
        except (EngineError, ValueError) as exc:
            raise SpecError(f"{self._test}: allreduce(): {exc}") from None
        return self.record(self._engine_result(result, ends=cluster_ends(cluster)))

    def _placed(self, profile: Profile, cluster: PSCluster | EngineCluster) -> Placement:
        """``profile`` placed on ``cluster``: the test's placement (made once per test, and
        handed to its cluster too) when it is the test's profile on the test's topology, else
        placed here."""
        given = self._test_placement() if self._test_placement is not None else None
        messages = self._messages
        if (
            given is not None
            and messages is not None
            and messages.profile == profile
            and (given.ps, given.sharding) == (cluster.topology.ps, cluster.topology.sharding)
        ):
            return given
        return placed_on(profile, cluster.topology)

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

    def _keeping_partial(
        self,
        engine: Engine,
        benchmark: Callable[..., R],
        *args: Any,
        placed: Server | None = None,
        **kwargs: Any,
    ) -> R:
        """``benchmark(*args, **kwargs)``, measuring with ``engine``; if it fails after
        measuring some sizes, those are recorded on the test before the failure goes on (JUnit
        and the results file keep them, their settings marked ``interrupted``; ``placed``:
        the server of a P2P benchmark, to record the CPU placement with)."""
        __tracebackhide__ = True
        try:
            return benchmark(*args, **kwargs)
        except Exception as error:
            partial = partial_result(error)
            if partial is not None and partial.label not in self._labels:
                # The failure that interrupted the sweep is the one to report, not a budget.
                with contextlib.suppress(BudgetExceeded):
                    self.record(self._engine_result(partial, engine, placed))
            raise

    def _check_label(self, label: str) -> None:
        if "." in label or not label:
            raise SpecError(f"label {label!r} must be non-empty and without dots")
        if label in self._labels:
            raise SpecError(
                f"a second result labelled {label!r} would overwrite the first "
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
        if not self._targets:  # the test's server; each result's is tfgrpc.<label>.target
            self._record(TARGET, result.target)
        self._targets.add(result.target)
        for name, value in result_properties(result):
            self._record(name, value)
        if self._on_result is not None:
            self._on_result(result)
        if self._budget is not None and self._budget.limits:
            breaches = check(self._budget, result)
            if breaches:
                checked = len(self._budget.limits) * len(result.sizes)
                raise BudgetExceeded(format_breaches(result, breaches, checked))
        return result


def _placement(server: Server) -> dict[str, str]:
    """The CPU placement P2P figures were measured under: the client's, and whether this host
    pinned ``server``."""
    return dict(result_placement(getattr(server, "pid", None)))
