"""``p2p_bandwidth(..., streams=N)``: the aggregate's arithmetic, the checks, both engines."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from pytest_tfgrpc import native
from pytest_tfgrpc.bench.driver import Driver
from pytest_tfgrpc.bench.p2p import BandwidthCall
from pytest_tfgrpc.bench.settings import run_settings
from pytest_tfgrpc.bench.specs import SpecError
from pytest_tfgrpc.bench.streams import (
    MAX_STREAMS,
    aggregate_samples,
    check_streams,
    p2p_bandwidth_streams,
)
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.native.client import StreamSamples
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.schemes import generate, payload_spec

NOT_BUILT = native.unavailable_reason()


def _stream(start: int, *samples: int) -> StreamSamples:
    values = np.array(samples, dtype=np.int64)
    return StreamSamples(values, int(values.sum()), start)


def test_the_aggregate_is_the_gaps_between_completions_on_any_stream() -> None:
    # Stream 0 completes at 10, 30; stream 1 (started at 5) at 20, 25, 40.
    merged = aggregate_samples([_stream(0, 10, 20), _stream(5, 15, 5, 15)])
    assert merged.tolist() == [10, 10, 5, 5, 10]
    assert merged.sum() == 40  # the common start to the last completion
    assert merged.dtype == np.int64


@pytest.mark.parametrize(
    "streams", [[_stream(0, 7)], [_stream(3, 1, 1), _stream(0)], [_stream(0), _stream(9)]]
)
def test_the_aggregate_counts_every_tensor_once(streams: list[StreamSamples]) -> None:
    merged = aggregate_samples(streams)
    assert len(merged) == sum(len(s.samples_ns) for s in streams)
    assert (merged >= 0).all()


@pytest.mark.parametrize("bad", [0, -1, MAX_STREAMS + 1, 2.0, True, "2"])
def test_a_bad_stream_count_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="streams="):
        check_streams(bad)
    with pytest.raises(ValueError, match="streams=None"):
        check_streams(None)  # the driver's None means "the test's default", checked there
    driver = Driver(test="t", messages=None, budget=None, record=print)
    with pytest.raises(SpecError, match=r"p2p_bandwidth\(\) argument streams="):
        driver.p2p_bandwidth(None, [1024], streams=bad)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_tensor_server(resolve_fabric("lo")) as handle:
        yield handle


@pytest.mark.parametrize("engine", ["grpcio", "native"])
@pytest.mark.parametrize(("rpc", "direction"), [("stream", "push"), ("unary", "pull")])
def test_streams_record_the_aggregate_and_each_stream(
    server: ServerProcess, engine: str, rpc: str, direction: str
) -> None:
    if engine == "native" and NOT_BUILT:
        pytest.skip(NOT_BUILT)
    recorded: list[tuple[str, str]] = []
    driver = Driver(
        test="t",
        messages=None,
        budget=None,
        record=lambda name, value: recorded.append((name, value)),
    )
    result = driver.p2p_bandwidth(
        server,
        ["256KiB"],
        rpc=rpc,
        direction=direction,
        engine=engine,
        streams=2,
        label="multi",
        iterations=6,
        warmup=1,
        max_seconds=2.0,
        warmup_seconds=1.0,
    )
    assert result.settings["streams"] == "2"
    assert result.settings["engine"] == engine
    size = result.sizes[0]
    labels = [r.label for r in driver.results]
    assert labels == ["multi_stream0", "multi_stream1", "multi"]
    per_stream = [r.sizes[0] for r in driver.results[:2]]
    assert size.count == sum(s.count for s in per_stream) == 12
    # Aggregate throughput: every byte over the common wall time, which is at least each
    # stream's own time, so never more than the streams' rates added. (No lower bound: on a
    # loaded machine one stream may be scheduled only after the other has finished.)
    rates = [s.throughput_Bps for s in per_stream]
    assert 0 < size.throughput_Bps <= sum(rates) * 1.001
    assert size.samples_ns.sum() >= max(s.samples_ns.sum() for s in per_stream)
    # One telemetry figure over both streams' connections (each engine's client tells their
    # ends), with a limit named on the aggregate and the clients' run-queue wait.
    tcp = size.transport
    assert tcp is not None and tcp.connections == 2, tcp
    assert tcp.bytes_sent + tcp.bytes_acked > 0
    assert size.limit is not None and size.cpu_wait.get("client") is not None
    assert all(s.transport is None for s in per_stream)
    names = {name for name, _ in recorded}
    assert "tfgrpc.multi_stream1.256KiB.throughput_MBps" in names
    assert "tfgrpc.multi.256KiB.throughput_MBps" in names


def test_payloads_are_not_split_over_streams(server: ServerProcess) -> None:
    payload = generate(payload_spec())
    with pytest.raises(ValueError, match="payload schemes use streams=1"):
        p2p_bandwidth_streams(server, [1024, payload], BandwidthCall(), streams=2)


@pytest.mark.parametrize(
    ("engine", "extra", "recorded"),
    [
        ("grpcio", {}, "grpcio"),
        ("native", {"grpc_cpp": "1.51.1"}, "native"),
        (None, {"floor_of": "p2p_latency"}, None),  # a raw-TCP floor measures no engine
    ],
)
def test_every_benchmark_records_its_engine_in_the_run_settings(
    engine: str | None, extra: dict[str, str], recorded: str | None
) -> None:
    settings = run_settings(RunSpec(3, 1, 1.0, 1.0), engine=engine, **extra)
    assert settings.get("engine") == recorded
    assert {k: settings[k] for k in extra} == extra
    assert "grpcio" in settings and "python" in settings
