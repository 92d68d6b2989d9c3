"""The engine interface: what starts servers for a fabric and measures exchanges against them.

An :class:`Engine` is the code on both ends of a measured exchange: the plugin's own grpcio
service, TensorFlow's gRPC runtime, a team's own parameter server. The plugin does everything
else the same way for every engine: message sizes and profiles, run settings, statistics,
budgets, the baseline gate, JUnit properties and plots.

An engine implements what it can measure, each call returning a :class:`Measured` (every
sample in nanoseconds) for one message size or one PS exchange:

- :meth:`Engine.start_server` (required): a server bound to a fabric, for P2P tests, as a
  :class:`Provision` asks (the same request for every engine: fabric, environment, tensor
  limit, the hosts to start on);
- :meth:`Engine.echo`, :meth:`Engine.push`, :meth:`Engine.pull`: one sample is one tensor
  echoed (round trip), pushed until acknowledged, or pulled;
- :meth:`Engine.start_cluster` and :meth:`Engine.ps_exchange`: PS tasks bound to the fabric;
  one sample is one exchange of a worker with every PS (the placed variables moved);
- :meth:`Engine.allreduce`: the cluster's workers all-reduce a buffer among themselves.

The benchmark-level methods (:meth:`Engine.p2p_latency`, :meth:`Engine.p2p_bandwidth`,
:meth:`Engine.ps_throughput`) are built from those and return the plugin's
:class:`~pytest_tfgrpc.results.BenchmarkResult`; an engine with its own loops (the grpcio
engine) overrides them instead. The P2P ones take the call's checked options as one value
(:class:`~pytest_tfgrpc.bench.p2p.LatencyCall`,
:class:`~pytest_tfgrpc.bench.p2p.BandwidthCall`). Nothing here imports pytest: engines are
registered through the plugin's hooks (``pytest_tfgrpc_add_engines``) into an
:class:`~pytest_tfgrpc.bench.engines.registry.EngineRegistry`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypedDict, runtime_checkable

import numpy as np
import numpy.typing as npt

from pytest_tfgrpc.bench.allreduce import AllReduceResult
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall, Message, Transfer, p2p_result
from pytest_tfgrpc.bench.ps import PS_THROUGHPUT_RUN, PSResult, throughput_result
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.streams import StreamsResult
from pytest_tfgrpc.bench.timing import RunSpec, measure
from pytest_tfgrpc.model.placement import Placement, Topology
from pytest_tfgrpc.model.profiles import Profile
from pytest_tfgrpc.results import BenchmarkResult, CpuTime, SizeResult
from pytest_tfgrpc.roles.processes import LOCAL, Launcher
from pytest_tfgrpc.turns import take_turn
from pytest_tfgrpc.units import size_label
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.client import Server
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.schemes import Payload
from pytest_tfgrpc.wire.tensors import Tensor

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

__all__ = [
    "Engine",
    "EngineCluster",
    "EngineError",
    "EngineServer",
    "Measured",
    "PSVariable",
    "Provision",
    "ServerGroup",
    "TensorMove",
    "ps_variables",
]


class EngineError(ValueError):
    """An engine asked for something it cannot do (an unknown name, an exchange it does not
    implement, a topology it does not support); the message names the engine and the call."""


class _Running(Protocol):
    @property
    def fabric(self) -> Fabric: ...

    def died(self, grace: float = 0.5) -> BaseException | None: ...

    def stop(self) -> object: ...


@runtime_checkable
class EngineServer(_Running, Protocol):
    """A running server of an engine: where it listens (``target``, ``host:port``), on which
    fabric, whether it died (the exception that says how, or None), and how to stop it."""

    @property
    def target(self) -> str: ...


@runtime_checkable
class EngineCluster(_Running, Protocol):
    """Running PS tasks (and whatever workers the engine needs) of an engine: the topology
    they were started for and every PS task's target."""

    @property
    def topology(self) -> Topology: ...

    @property
    def targets(self) -> tuple[str, ...]: ...


def _one_by_one() -> Topology:
    return Topology(1, 1)


@dataclass(frozen=True)
class Provision:
    """What a test asks of an engine's :meth:`Engine.start_server` and
    :meth:`Engine.start_cluster`: one request for every engine, built by the fixtures.

    ``fabric``: the interface its listeners bind (``fabric.address``). ``env``: the
    environment of its processes (the allocator policy; None: this process's).
    ``max_tensor_bytes``: the largest tensor the test sends (None: the largest gRPC carries);
    a server may refuse larger ones. ``topology``: the PS tasks and workers of a cluster, and
    ``placement`` the test's model profile placed on it (made once per test; None without a
    profile). ``ps_launchers`` / ``worker_launchers``: where PS task ``i`` (a tensor server is
    PS 0) and worker ``j`` run, through node agents on other hosts; empty: on this host. Only
    an engine whose :attr:`Engine.agent_roles` names agent programs is handed launchers.
    ``delay_s``: fault injection, every reply of a tensor server held back that long (seconds;
    ``--tfgrpc-server-delay``); only an engine whose :attr:`Engine.injects_delay` is true is
    asked for one.
    """

    fabric: Fabric
    env: Mapping[str, str] | None = None
    max_tensor_bytes: int | None = None
    topology: Topology = field(default_factory=_one_by_one)
    placement: Placement | None = None
    ps_launchers: tuple[Launcher, ...] = ()
    worker_launchers: tuple[Launcher, ...] = ()
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if not (isinstance(self.delay_s, (int, float)) and 0.0 <= self.delay_s < float("inf")):
            raise ValueError(f"delay_s={self.delay_s!r}: a delay in seconds, 0 or more")
        limit = self.max_tensor_bytes
        whole = isinstance(limit, int) and not isinstance(limit, bool) and limit >= 0
        if limit is not None and not whole:
            raise ValueError(f"max_tensor_bytes={limit!r}: a whole number of bytes or None")
        if self.placement is not None and (self.placement.ps, self.placement.sharding) != (
            self.topology.ps,
            self.topology.sharding,
        ):
            raise ValueError("placement: made for another topology than the one asked for")

    @property
    def server_launcher(self) -> Launcher:
        """Where a tensor server runs: the first PS launcher, else this host."""
        return self.ps_launchers[0] if self.ps_launchers else LOCAL


@dataclass(frozen=True, eq=False)
class ServerGroup:
    """PS tasks that are each one server of an engine (:meth:`Engine.start_cluster`'s
    default): ``ps[i]`` is PS task i; stopping the group stops them all."""

    fabric: Fabric
    topology: Topology
    ps: tuple[EngineServer, ...]

    @classmethod
    def start(cls, engine: Engine, provision: Provision) -> ServerGroup:
        """Start ``provision.topology.ps`` servers of ``engine``, each asked as
        ``provision`` asks; those started are stopped if one fails to start."""
        started: list[EngineServer] = []
        try:
            for _ in range(provision.topology.ps):
                started.append(engine.start_server(provision))
        except BaseException:
            for server in started:
                server.stop()
            raise
        return cls(provision.fabric, provision.topology, tuple(started))

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(server.target for server in self.ps)

    def died(self, grace: float = 0.5) -> BaseException | None:
        """The first PS task found dead, or None."""
        return next((d for d in (s.died(grace) for s in self.ps) if d is not None), None)

    def stop(self) -> None:
        for server in self.ps:
            server.stop()


def _no_settings() -> Mapping[str, str]:
    return MappingProxyType({})


def _no_cpu() -> Mapping[str, CpuTime]:
    return MappingProxyType({})


@dataclass(frozen=True)
class Measured:
    """What an engine measured for one message size or one PS exchange.

    ``samples_ns``: the duration of every timed operation in nanoseconds, warm-up excluded
    (a sequence of ints or an int64 array; at least one). ``elapsed_ns``: wall time of the
    measured phase (default: the sum of the samples). ``wire_bytes``: bytes of one message on
    the wire (default: the tensor's bytes). ``cpu``: CPU time per process role (``client``,
    ``server``, ``workers``) if the engine reads it. ``settings``: what else shapes the figures
    (a method name, a library version), recorded with the result.
    """

    samples_ns: Sequence[int] | npt.NDArray[np.int64]
    elapsed_ns: int | None = None
    wire_bytes: int | None = None
    cpu: Mapping[str, CpuTime] = field(default_factory=_no_cpu)
    settings: Mapping[str, str] = field(default_factory=_no_settings)

    @classmethod
    def timed(cls, op: Callable[[], object], run: RunSpec, **fields: Any) -> Measured:
        """Time ``op`` with the plugin's own loop: ``run.warmup`` untimed calls, then one
        sample per call until ``run.iterations`` or ``run.time_limit_s`` (the cyclic GC off
        meanwhile). ``fields`` are the other :class:`Measured` fields (``wire_bytes``, ...)."""
        samples, elapsed = measure(op, run)
        return cls(samples, elapsed, **fields)

    def array(self, engine: str, what: str) -> npt.NDArray[np.int64]:
        """The samples as int64 nanoseconds; :class:`EngineError` when there are none or one
        is negative."""
        samples = np.asarray(self.samples_ns, dtype=np.int64)
        if samples.ndim != 1 or samples.size == 0:
            raise EngineError(f"engine {engine!r}: {what} returned no samples")
        if (samples < 0).any():
            raise EngineError(f"engine {engine!r}: {what} returned a negative sample")
        return samples


@dataclass(frozen=True)
class PSVariable:
    """A variable a PS task owns: its name, the PS task index, its shape and dtype (a model
    profile's real tensor shape, or a flat slice of one)."""

    name: str
    ps: int
    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def ps_variables(
    payload: Sequence[int] | Placement | Payload | int,
    topology: Topology,
    profile: Profile | None = None,
) -> tuple[PSVariable, ...]:
    """The variables of one PS exchange: for a size (or a payload's total), one float32
    variable of that many bytes on every PS (bytes not a multiple of 4 as uint8); for a
    placement, each shard with the profile's shape of its tensor (a flat slice when the tensor
    is partitioned or the profile is not given)."""
    if isinstance(payload, Placement):
        specs = {spec.name: spec for spec in profile.tensors} if profile is not None else {}
        out = []
        for shard in payload.shards:
            spec = specs.get(shard.tensor)
            if spec is not None and spec.nbytes == shard.nbytes:
                out.append(PSVariable(shard.key, shard.ps, spec.shape, spec.dtype))
            else:
                out.append(_flat(shard.key, shard.ps, shard.nbytes))
        return tuple(out)
    nbytes = payload.total_bytes if isinstance(payload, Payload) else payload
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"message size {nbytes!r} is not a whole number of bytes")
    return tuple(_flat(f"v{nbytes}_ps{i}", i, nbytes) for i in range(topology.ps))


def _flat(name: str, ps: int, nbytes: int) -> PSVariable:
    if nbytes % 4:
        return PSVariable(name, ps, (nbytes,), "uint8")
    return PSVariable(name, ps, (nbytes // 4,), "float32")


class TensorMove(TypedDict):
    """The keywords of :meth:`Engine.push` and :meth:`Engine.pull` (the docs' "Writing an
    engine"): the encoding (``mode``: ``raw`` or ``protobuf``), the RPC shape (``rpc``:
    ``unary`` or ``stream``), a stream's slice size in bytes (``chunk_bytes``) and the loop's
    bounds (``run``). An engine may spell them out (``*, mode, rpc, chunk_bytes, run``)."""

    mode: str
    rpc: str
    chunk_bytes: int
    run: RunSpec


def _check(name: str, value: str, choices: Sequence[str]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(choices)}")


class Engine(ABC):
    """An engine: subclass it, set :attr:`name`, implement :meth:`start_server` and the
    exchanges the engine can measure, and register an instance (or a factory) in the
    ``pytest_tfgrpc_add_engines`` hook. Exchanges not implemented raise :class:`EngineError`
    naming the engine, so a test asking for one fails with that message."""

    #: The engine's name: what ``tfgrpc_engines(...)`` and ``--tfgrpc-engines`` select, the
    #: ``engine`` setting of its results and, when a test runs several, a test id part.
    name: ClassVar[str] = ""
    #: Which node-agent programs run its processes on other hosts (``--tfgrpc-agents``, handed
    #: as :class:`Provision` launchers): ``grpcio`` or ``native`` (the plugin's own roles,
    #: whose tensor servers a cluster spec's ``tfgrpc-server`` tasks can also stand for,
    #: ``--tfgrpc-cluster``), or ``tensorflow`` (TensorFlow's tasks, on agents started with
    #: ``--tf-python``). An agent runs nothing else, so for None (any other engine) a test
    #: that would start processes through agents fails at setup, before any agent is dialled.
    agent_roles: ClassVar[str | None] = None
    #: Whether its tensor servers hold replies back by :attr:`Provision.delay_s` (fault
    #: injection, ``--tfgrpc-server-delay``); the fixture refuses a delay to other engines.
    injects_delay: ClassVar[bool] = False

    def unavailable(self) -> str | None:
        """Why this engine cannot run here (a missing library), or None; tests that select
        an unavailable engine are skipped with this reason."""
        return None

    def check_usable(self) -> None:
        """Raise :class:`EngineError` if this run's settings (its TLS, say) rule the engine
        out; called before a server or cluster is placed or started. Nothing, by default."""
        return None

    def settings(self) -> Mapping[str, str]:
        """Settings recorded with every result of this engine (e.g. its library's version)."""
        return {}

    @abstractmethod
    def start_server(self, provision: Provision) -> EngineServer:
        """Start a server bound to ``provision.fabric``'s address (``fabric.address``), ready
        when returned, its processes in ``provision.env`` (the allocator policy); see
        :class:`Provision` for the rest of the request."""

    def start_cluster(self, provision: Provision) -> EngineCluster:
        """Start ``provision.topology.ps`` PS tasks (and the workers the engine needs) on
        ``provision.fabric``.

        By default each PS task is a server of :meth:`start_server`, and the workers are the
        measuring process itself: a :class:`ServerGroup`, ``cluster.ps[i]`` being PS task i.
        """
        return ServerGroup.start(self, provision)

    def echo(
        self, server: EngineServer, tensor: Tensor, *, mode: str, rpc: str, run: RunSpec
    ) -> Measured:
        """Echo ``tensor`` to ``server`` and back, ``run`` bounding the loop (warm-up,
        iterations, seconds); one sample per round trip."""
        raise self._unsupported("echo latency (echo)")

    def push(self, server: EngineServer, tensor: Tensor, **move: Unpack[TensorMove]) -> Measured:
        """Push ``tensor`` to ``server`` as ``move`` says (:class:`TensorMove`: ``mode``,
        ``rpc``, ``chunk_bytes``, ``run``); one sample from its first byte to its
        acknowledgement."""
        raise self._unsupported("push bandwidth (push)")

    def pull(self, server: EngineServer, tensor: Tensor, **move: Unpack[TensorMove]) -> Measured:
        """Fetch a tensor of ``tensor``'s size and dtype from ``server`` as ``move`` says (as
        :meth:`push`'s); one sample per tensor received."""
        raise self._unsupported("pull bandwidth (pull)")

    def ps_exchange(
        self, cluster: EngineCluster, variables: Sequence[PSVariable], *, mode: str, run: RunSpec
    ) -> Measured:
        """One sample per exchange: a worker pulls every variable from the PS task that owns
        it and pushes a gradient of the same shape back."""
        raise self._unsupported("PS exchanges (ps_exchange)")

    def allreduce(
        self, cluster: EngineCluster, sizes: Sequence[int], **options: Any
    ) -> AllReduceResult:
        """An all-reduce of a buffer of each of ``sizes`` among the cluster's workers, no PS;
        ``options`` are :func:`~pytest_tfgrpc.bench.allreduce.allreduce`'s keywords (``run``,
        ``algorithm``, ``check``, ``model``, ``label``, ``key``), which says what is measured
        and recorded. Not measured unless the engine overrides it (the grpcio engine does)."""
        raise self._unsupported("all-reduce (allreduce)")

    def _unsupported(self, what: str) -> EngineError:
        return EngineError(f"engine {self.name!r} does not measure {what}")

    # --- benchmark level: what the driver calls --------------------------------------------
    def p2p_latency(
        self, server: EngineServer, sizes: Sequence[Message], call: LatencyCall
    ) -> BenchmarkResult:
        """Echo round-trip time of each size, through :meth:`echo`."""

        def one(tensor: Tensor) -> Measured:
            return self.echo(server, tensor, mode=call.mode, rpc=call.rpc, run=call.run)

        return self._p2p(server, sizes, call, one, {})

    def p2p_bandwidth(
        self, server: EngineServer, sizes: Sequence[Message], call: BandwidthCall
    ) -> BenchmarkResult:
        """Tensors moved per second for each size, through :meth:`push` or :meth:`pull`."""
        move = self.push if call.direction == "push" else self.pull
        options = TensorMove(
            mode=call.mode, rpc=call.rpc, chunk_bytes=call.chunk_bytes, run=call.run
        )

        def one(tensor: Tensor) -> Measured:
            return move(server, tensor, **options)

        extra = {"direction": call.direction, "chunk_bytes": str(call.chunk_bytes)}
        return self._p2p(server, sizes, call, one, extra)

    def p2p_bandwidth_streams(
        self, server: Server, sizes: Sequence[Message], *, streams: int, **options: Any
    ) -> StreamsResult:
        """``streams`` concurrent connections per size (``p2p_bandwidth(..., streams=N)``;
        ``options`` are a :class:`~pytest_tfgrpc.bench.p2p.BandwidthCall`'s keywords): the
        aggregate and each stream. Not measured unless the engine overrides it (the plugin's
        grpcio and native engines do)."""
        raise self._unsupported("parallel streams (p2p_bandwidth_streams)")

    def _p2p(
        self,
        server: EngineServer,
        sizes: Sequence[Message],
        call: Transfer,
        one: _MeasureTensor,
        extra: Mapping[str, str],
    ) -> BenchmarkResult:
        if not sizes:
            raise ValueError("no message sizes to measure")
        points = []
        settings: dict[str, str] = dict(extra)
        for index, message in enumerate(sizes, 1):
            payload = message if isinstance(message, Payload) else None
            name = payload.description if payload else size_label(int(message))  # type: ignore[arg-type]
            if call.progress is not None:
                call.progress(index, len(sizes), name)
            tensor = Tensor.random(payload.total_bytes if payload else int(message))  # type: ignore[arg-type]
            take_turn()  # lockstep with another run (tfgrpc-ab --interleave rounds)
            measured = one(tensor)
            settings.update(measured.settings)
            what = f"{call.benchmark} of {name}"
            points.append(self._point(measured, tensor.nbytes, what, payload))
        return p2p_result(
            call, server, points, run_settings(call.run, engine=self.name, **settings)
        )

    def _point(
        self,
        measured: Measured,
        nbytes: int,
        what: str,
        payload: Payload | None = None,
        **ps: object,
    ) -> SizeResult:
        samples = measured.array(self.name, what)
        elapsed = measured.elapsed_ns if measured.elapsed_ns is not None else int(samples.sum())
        wire = measured.wire_bytes if measured.wire_bytes is not None else nbytes
        return SizeResult.from_samples(
            nbytes,
            wire,
            samples,
            elapsed,
            payload=payload.description if payload else "",
            buffers=payload.sizes if payload else (),
            cpu=measured.cpu,
            **ps,
        )

    def ps_throughput(
        self,
        cluster: EngineCluster,
        payload: Sequence[int] | Placement | Payload,
        *,
        mode: str = "raw",
        run: RunSpec = PS_THROUGHPUT_RUN,
        label: str | None = None,
        key: str | None = None,
        profile: Profile | None = None,
    ) -> PSResult:
        """Exchanges with every PS per second, through :meth:`ps_exchange`: one point per size
        (every PS owns one variable of that size) or one for a placement (each PS owns its
        shards, with ``profile``'s tensor shapes). ``rate_Bps`` counts the bytes pulled and
        pushed."""
        _check("mode", mode, grpc_settings.MODES)
        topology = cluster.topology
        if isinstance(payload, (Placement, Payload)):
            groups: list[tuple[str, Sequence[int] | Placement | Payload | int]] = [
                (
                    f"placed_{payload.sharding}"
                    if isinstance(payload, Placement)
                    else payload.description,
                    payload,
                )
            ]
        else:
            if not payload:
                raise ValueError("no message sizes to measure")
            groups = [(size_label(size), size) for size in payload]
        points = []
        settings: dict[str, str] = {}
        for default_key, group in groups:
            variables = ps_variables(group, topology, profile)
            total = sum(v.nbytes for v in variables)
            take_turn()
            measured = self.ps_exchange(cluster, variables, mode=mode, run=run)
            settings.update(measured.settings)
            samples = measured.array(self.name, f"ps_exchange of {default_key}")
            elapsed = measured.elapsed_ns if measured.elapsed_ns is not None else int(samples.sum())
            seconds = max(elapsed, 1) / 1e9
            point_key = (key or default_key).replace(".", "_")
            points.append(
                self._point(
                    measured,
                    total,
                    f"ps_exchange of {point_key}",
                    key=point_key,
                    rate_per_s=samples.size / seconds,
                    rate_Bps=2 * total * samples.size / seconds,
                    imbalance=group.imbalance if isinstance(group, Placement) else 1.0,
                )
            )
        return throughput_result(
            cluster, payload, mode, label, points, run_settings(run, engine=self.name, **settings)
        )


class _MeasureTensor(Protocol):
    def __call__(self, tensor: Tensor) -> Measured: ...
