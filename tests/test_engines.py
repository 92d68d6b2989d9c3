"""The engine interface without pytest or a network: the registry, what an engine's samples
become (points, rates, settings), the variables of a PS exchange, the default cluster, hook
metadata and its setup check, and the TensorFlow engine's reason to skip."""

from __future__ import annotations

import importlib.util
import re
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from pytest_tfgrpc.bench.driver import Driver
from pytest_tfgrpc.bench.engines import (
    Engine,
    EngineError,
    EngineRegistry,
    Measured,
    Provision,
    PSVariable,
    ServerGroup,
    TensorMove,
    ps_variables,
)
from pytest_tfgrpc.bench.engines.tensorflow import TensorFlowEngine
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall
from pytest_tfgrpc.bench.specs import SpecError
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.placement import Topology, place_profile
from pytest_tfgrpc.model.profiles import load_profile
from pytest_tfgrpc.ps.tf_cluster import TF_PYTHON_ENV
from pytest_tfgrpc.report.junit import Baseline
from pytest_tfgrpc.report.metadata import extra_metadata
from pytest_tfgrpc.report.record import Key, Measurement
from pytest_tfgrpc.report.setup_check import check_metadata
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabrics
from pytest_tfgrpc.wire.tensors import Tensor

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing.Unpack from Python 3.11

RUN = RunSpec(iterations=5, warmup=1, max_seconds=1.0, warmup_seconds=1.0)
LO = resolve_fabrics(["lo"])[0]


class FakeServer:
    def __init__(self, fabric: Fabric, fail: bool = False) -> None:
        if fail:
            raise RuntimeError("no port")
        self.fabric = fabric
        self.target = f"{fabric.address}:9"
        self.stopped = False

    def died(self, grace: float = 0.5) -> BaseException | None:
        return None

    def stop(self) -> None:
        self.stopped = True


class Fake(Engine):
    """Measures nothing: it reports samples proportional to the bytes it is given."""

    name = "fake"

    def __init__(self, fail_after: int | None = None) -> None:
        self.started: list[FakeServer] = []
        self.fail_after = fail_after
        self.seen: list[Any] = []

    def start_server(self, provision: Provision) -> FakeServer:
        server = FakeServer(provision.fabric, fail=len(self.started) == self.fail_after)
        self.started.append(server)
        return server

    def echo(self, server: Any, tensor: Tensor, *, mode: str, rpc: str, run: RunSpec) -> Measured:
        self.seen.append(tensor)
        return Measured([tensor.nbytes + 1000] * run.iterations, settings={"method": "fake"})

    def push(self, server: Any, tensor: Tensor, **kw: Any) -> Measured:
        return Measured(np.full(3, 1_000_000, dtype=np.int64), elapsed_ns=4_000_000)

    def ps_exchange(self, cluster: Any, variables: Any, *, mode: str, run: RunSpec) -> Measured:
        self.seen.append(tuple(variables))
        return Measured([2_000_000] * 4)


def test_registry_builds_factories_once_and_only_when_asked() -> None:
    built: list[str] = []

    def factory() -> Engine:
        built.append("fake")
        return Fake()

    registry = EngineRegistry()
    registry.add(factory, "fake")
    assert built == [] and registry.names() == ("fake",) and "fake" in registry
    first = registry.get("fake")
    assert registry.get("fake") is first and built == ["fake"]


@pytest.mark.parametrize(
    ("engine", "name", "message"),
    [
        (Fake(), None, None),
        (lambda: Fake(), "", "engine name ''"),
        (lambda: Fake(), "two words", "engine name 'two words'"),
        ("grpcio", None, "neither an Engine nor a factory"),
    ],
)
def test_registry_refuses_bad_registrations(engine: Any, name: Any, message: str | None) -> None:
    registry = EngineRegistry()
    if message is None:
        registry.add(engine, name)
        with pytest.raises(EngineError, match="engine 'fake' is registered twice"):
            registry.add(Fake())
        return
    with pytest.raises(EngineError, match=message):
        registry.add(engine, name)


def test_registry_names_what_is_unknown_or_misnamed() -> None:
    registry = EngineRegistry()
    registry.add(lambda: Fake(), "other")
    registry.add(lambda: "nope", "bad")  # type: ignore[arg-type,return-value]
    with pytest.raises(EngineError, match="unknown engine 'x'; registered engines: other, bad"):
        registry.get("x")
    with pytest.raises(EngineError, match="registered as 'other' calls itself 'fake'"):
        registry.get("other")
    with pytest.raises(EngineError, match="returned 'nope', not an Engine"):
        registry.get("bad")


@pytest.mark.parametrize(
    ("samples", "message"),
    [([], "no samples"), ([3, -1], "a negative sample"), ([[1, 2]], "no samples")],
)
def test_measured_refuses_samples_that_are_not_durations(samples: Any, message: str) -> None:
    with pytest.raises(EngineError, match=f"engine 'fake': echo returned {message}"):
        Measured(samples).array("fake", "echo")


def test_measured_timed_uses_the_bounded_loop() -> None:
    calls: list[int] = []
    measured = Measured.timed(lambda: calls.append(1), RUN, wire_bytes=7)
    assert len(measured.samples_ns) == 5 and len(calls) == 6  # 1 warm-up, 5 timed
    assert measured.wire_bytes == 7 and measured.elapsed_ns is not None


def test_default_p2p_builds_points_from_the_engines_samples() -> None:
    engine = Fake()
    server = engine.start_server(Provision(LO))
    result = engine.p2p_latency(server, [1024, 128], LatencyCall(run=RUN, label="echo"))
    assert result.label == "echo" and result.fabric == "lo" and result.target == server.target
    assert [p.size_bytes for p in result.sizes] == [1024, 128]
    assert [t.nbytes for t in engine.seen] == [1024, 128]
    assert result.sizes[0].summary.p50_ns == 2024 and result.sizes[0].count == 5
    assert result.settings["method"] == "fake" and result.settings["iterations"] == "5"
    bandwidth = engine.p2p_bandwidth(server, [1 << 20], BandwidthCall(run=RUN))
    point = bandwidth.sizes[0]
    assert point.elapsed_ns == 4_000_000
    assert point.throughput_Bps == pytest.approx((1 << 20) / 1e-3)  # bytes / mean sample
    assert bandwidth.settings["direction"] == "push"
    with pytest.raises(EngineError, match="engine 'fake' does not measure pull bandwidth"):
        engine.p2p_bandwidth(server, [1024], BandwidthCall(direction="pull", run=RUN))
    with pytest.raises(ValueError, match="no message sizes"):
        engine.p2p_latency(server, [], LatencyCall(run=RUN))


class Pulls(Fake):
    """Pulls, its keywords typed by the engine interface's ``TensorMove``."""

    def pull(self, server: Any, tensor: Tensor, **move: Unpack[TensorMove]) -> Measured:
        self.seen.append(move)
        return Measured([1_000] * move["run"].iterations)


def test_an_engine_exchange_gets_the_calls_options_as_keywords() -> None:
    engine = Pulls()
    server = engine.start_server(Provision(LO))
    call = BandwidthCall(mode="protobuf", rpc="unary", direction="pull", chunk_bytes=4096, run=RUN)
    result = engine.p2p_bandwidth(server, [1024, 64], call)
    move = {"mode": "protobuf", "rpc": "unary", "chunk_bytes": 4096, "run": RUN}
    assert engine.seen == [move, move]
    assert result.settings["direction"] == "pull" and result.settings["chunk_bytes"] == "4096"
    assert (result.mode, result.rpc, result.label) == ("protobuf", "unary", "p2p_bandwidth")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "json"}, "mode='json': expected one of raw, protobuf"),
        ({"rpc": "bidi"}, "rpc='bidi': expected one of unary, stream"),
        ({"direction": "sideways"}, "direction='sideways': expected one of push, pull"),
        ({"chunk_bytes": 63}, "chunk_bytes=63: slices must be at least 64 bytes and at most "),
        ({"chunk_bytes": 10**12}, "chunk_bytes=1000000000000: slices must be at least 64 "),
    ],
)
def test_a_p2p_calls_options_are_refused_by_name_before_anything_is_measured(
    options: dict[str, Any], message: str
) -> None:
    engine = Fake()
    server = FakeServer(LO)
    driver = Driver(test="t", messages=None, budget=None, record=_ignore, engine=engine)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        BandwidthCall(**options)
    # Through the driver: the test and the call named first, then the argument.
    called = f"^t: p2p_bandwidth\\(\\) argument {re.escape(message)}"
    with pytest.raises(SpecError, match=called):
        driver.p2p_bandwidth(server, [1024], iterations=1, **options)
    if "mode" in options or "rpc" in options:  # the options latency has
        with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
            LatencyCall(**options)
        with pytest.raises(SpecError, match=called.replace("bandwidth", "latency")):
            driver.p2p_latency(server, [1024], iterations=1, **options)
    else:
        with pytest.raises(TypeError, match=next(iter(options))):
            LatencyCall(**options)
    assert engine.seen == [] and driver.results == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk_bytes": 1500.5}, "chunk_bytes=1500.5: "),
        ({"chunk_bytes": "lots"}, "chunk_bytes='lots': "),
        ({"chunk_bytes": 4096, "rpc": "unary"}, "chunk_bytes=4096: slices are what rpc='stream'"),
        ({"chunk_bytes": -5}, "chunk_bytes=-5: "),
    ],
)
def test_chunk_bytes_the_driver_cannot_use_is_refused_naming_test_and_call(
    options: dict[str, Any], message: str
) -> None:
    engine = Fake()
    driver = Driver(test="t", messages=None, budget=None, record=_ignore, engine=engine)
    with pytest.raises(SpecError, match=f"^t: p2p_bandwidth\\(\\) argument {re.escape(message)}"):
        driver.p2p_bandwidth(FakeServer(LO), [1024], iterations=1, **options)
    assert engine.seen == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"chunk_bytes": "1MiB"}, "chunk_bytes='1MiB': expected a whole number of bytes"),
        ({"chunk_bytes": True}, "chunk_bytes=True: expected a whole number of bytes"),
        ({"run": None}, "run=None: expected a RunSpec"),
    ],
)
def test_a_call_spec_refuses_values_of_the_wrong_type(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        BandwidthCall(**options)


def _ignore(name: str, value: str) -> None:
    pass


def test_ps_variables_take_the_profiles_shapes() -> None:
    profile = load_profile("resnet50")
    placement = place_profile(profile, 2, "round_robin")
    variables = ps_variables(placement, Topology(2, 1), profile)
    assert len(variables) == profile.num_tensors
    shapes = {spec.name: spec.shape for spec in profile.tensors}
    assert all(v.shape == shapes[v.name] for v in variables)
    assert sum(v.nbytes for v in variables) == profile.total_bytes
    assert {v.ps for v in variables} == {0, 1}
    # Partitioned slices are flat; without the profile every shard is flat.
    sliced = ps_variables(place_profile(profile, 3, "partitioned"), Topology(3, 1), profile)
    assert any(len(v.shape) == 1 and "@" in v.name for v in sliced)
    assert sum(v.nbytes for v in sliced) == profile.total_bytes
    flat = ps_variables(placement, Topology(2, 1))
    assert all(len(v.shape) == 1 for v in flat)
    assert ps_variables(6, Topology(3, 1)) == tuple(
        PSVariable(f"v6_ps{i}", i, (6,), "uint8") for i in range(3)
    )
    with pytest.raises(ValueError, match="not a whole number of bytes"):
        ps_variables(-1, Topology(1, 1))


def test_default_ps_throughput_rates_count_both_directions() -> None:
    engine = Fake()
    cluster = engine.start_cluster(Provision(LO, topology=Topology(2, 1)))
    assert isinstance(cluster, ServerGroup) and len(cluster.targets) == 2
    result = engine.ps_throughput(cluster, [4096], run=RUN)
    point = result.sizes[0]
    assert point.size_bytes == 2 * 4096 and point.key == "4KiB"
    assert point.rate_per_s == pytest.approx(4 / 8e-3)
    assert point.rate_Bps == pytest.approx(2 * 8192 * 4 / 8e-3)
    assert result.cluster is not None and result.topology == "2ps_1workers_round_robin"
    profile = load_profile("resnet50").scaled(scale=0.01)
    placement = place_profile(profile, 2, "greedy")
    placed = engine.ps_throughput(cluster, placement, run=RUN, profile=profile, key="r50")
    assert placed.placement is placement and placed.sizes[0].key == "r50"
    assert placed.sizes[0].imbalance == placement.imbalance
    cluster.stop()
    assert all(server.stopped for server in engine.started)


def test_default_cluster_stops_what_started_when_one_server_fails() -> None:
    engine = Fake(fail_after=2)
    with pytest.raises(RuntimeError, match="no port"):
        engine.start_cluster(Provision(LO, topology=Topology(3, 1)))
    assert len(engine.started) == 2 and all(s.stopped for s in engine.started)


def test_extra_metadata_is_named_and_checked() -> None:
    meta = extra_metadata([{"commit": "4f2a9c1"}, None, {"nic.firmware": "20.31"}])
    assert meta == {
        "tfgrpc.meta.extra.commit": "4f2a9c1",
        "tfgrpc.meta.extra.nic.firmware": "20.31",
    }
    for answers, message in (
        ([{"a": "1"}, {"a": "2"}], "given twice"),
        ([{"a-b": "1"}], "not an identifier"),
        ([{"a": 1}], "not a string"),
        ([["a"]], "must be a mapping"),
    ):
        with pytest.raises(ValueError, match=message):
            extra_metadata(answers)  # type: ignore[arg-type]
    key = Key("t", "lo", "p2p_latency", "1KiB")
    base = Baseline("a.xml", {key: Measurement(key, {})}, {"host": "n1", "extra.commit": "a"})
    found = check_metadata(base, {"host": "n1", "extra.commit": "b"}, ["lo"])
    assert [m.describe() for m in found] == ["extra.commit: baseline a, current b"]
    (added,) = check_metadata(base, {"host": "n1", "extra.commit": "a", "extra.fw": "1"}, ["lo"])
    assert added.describe() == "extra.fw: baseline (not recorded), current 1"


def test_tensorflow_engine_without_tensorflow_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "tensorflow" else real(name, *a),
    )
    monkeypatch.delenv(TF_PYTHON_ENV, raising=False)
    engine = TensorFlowEngine()
    assert "pip install -e '.[tensorflow]'" in (engine.unavailable() or "")
    with pytest.raises(EngineError, match="engine 'tensorflow': TensorFlow is not installed"):
        engine.start_server(Provision(LO))
    monkeypatch.setenv(TF_PYTHON_ENV, str(tmp_path / "python"))
    assert "is not an executable file" in (TensorFlowEngine().unavailable() or "")


def test_the_plugins_own_engines_register_through_the_registry_like_any_other() -> None:
    from pytest_tfgrpc import native
    from pytest_tfgrpc.bench import native_p2p, p2p
    from pytest_tfgrpc.bench.engines import builtin_engines
    from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine
    from pytest_tfgrpc.bench.engines.native import NativeEngine

    registry = EngineRegistry()
    builtin_engines(registry)
    assert registry.names() == ("grpcio", "native", "tensorflow")
    grpcio, built = registry.get("grpcio"), registry.get("native")
    assert isinstance(grpcio, GrpcioEngine) and grpcio.loops is p2p
    assert isinstance(built, NativeEngine) and built.loops is native_p2p
    # Not built: the reason names the command that builds it; built: None.
    assert built.unavailable() == native.unavailable_reason()
    assert grpcio.unavailable() is None
    # A third party's engine under a plugin engine's name is refused, not silently mixed.
    with pytest.raises(EngineError, match="engine 'native' is registered twice"):
        registry.add(Fake(), "native")


def test_an_engine_without_parallel_streams_says_so() -> None:
    server = FakeServer(LO)
    with pytest.raises(EngineError, match=r"engine 'fake' does not measure parallel streams"):
        Fake().p2p_bandwidth_streams(server, [1024], streams=2, run=RUN)
