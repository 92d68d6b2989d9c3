"""Unit tests of the hardening pieces (the end-to-end cases are rows of test_faults.py):
plain property values, deadlines and their messages, the ready line among stray output, TLS
settings, partial results, and what the registry's engines make of the tensor limit and TLS."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import Any

import grpc
import numpy as np
import pytest

from pytest_tfgrpc.bench.engines import Engine, EngineError, Provision
from pytest_tfgrpc.bench.engines.grpcio import GrpcioEngine
from pytest_tfgrpc.bench.engines.tensorflow import TensorFlowEngine
from pytest_tfgrpc.bench.partial import keeping_partial, partial_result
from pytest_tfgrpc.plugin.activation import plain_properties, plain_value
from pytest_tfgrpc.results import BenchmarkResult, SizeResult
from pytest_tfgrpc.roles.processes import ChildProcess, ServerError
from pytest_tfgrpc.wire import client, codec, grpc_settings
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import (
    TlsError,
    TlsFiles,
    load_tls,
    looks_like_tls_failure,
    use_tls,
)


class _Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no")

    def __repr__(self) -> str:
        raise RuntimeError("no")


class _Text(str):
    pass


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float64(1.5), 1.5),
        (np.float32(0.25), 0.25),
        (np.int32(7), 7),
        (np.bool_(True), True),
        (np.arange(3), "[0 1 2]"),
        (_Text("x"), "x"),
        (None, None),
        (3, 3),
        ("s", "s"),
        (_Unprintable(), "<unprintable _Unprintable>"),
        (Path("/a"), "/a"),
    ],
)
def test_plain_value_is_a_builtin(value: object, expected: object) -> None:
    plain = plain_value(value)
    assert plain == expected
    assert plain is None or type(plain) in (str, int, float, bool)


def test_plain_properties_keep_every_entry() -> None:
    props = plain_properties([("a", np.float64(2)), (3, "x"), "not a pair"])
    assert props == [("a", 2.0), ("3", "x"), ("user_property", "not a pair")]


@pytest.mark.parametrize(
    ("nbytes", "bound", "speed", "at_least"),
    [
        (16 << 20, 60.0, 10, 60.0 + (16 << 20) / 625e3),  # the 10 Mbit/s link of the issue
        (16 << 20, 0.0, None, 10.0 + (16 << 20) / 1e6),
        (0, 5.0, None, 15.0),
        (2**31 - 65, 7.0, 100_000, 17.0),
    ],
)
def test_a_deadline_covers_the_run_and_the_bytes(
    nbytes: int, bound: float, speed: int | None, at_least: float
) -> None:
    deadline = client.call_deadline(nbytes, bound_s=bound, speed_mbps=speed)
    assert deadline.seconds >= at_least
    assert f"run bound {bound:g} s" in deadline.basis
    assert ("fabric speed unknown" in deadline.basis) == (speed is None)


class _FakeError(grpc.RpcError):  # type: ignore[misc]
    """What grpc.aio raises: code() and details(), but no grpc.Call."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class _Alive:
    target = "127.0.0.1:1"
    name = "tensor server on lo"
    fabric = resolve_fabric("lo")

    def died(self, grace: float = 0.5) -> BaseException | None:
        return None


@pytest.mark.parametrize(
    ("code", "details", "expected"),
    [
        (grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded", "the deadline was 12 s"),
        (grpc.StatusCode.UNAVAILABLE, "Tls handshake failed (TSI)", "TLS handshake with 127"),
        (grpc.StatusCode.UNAVAILABLE, "Socket closed\n  more", "UNAVAILABLE: Socket closed more"),
        (grpc.StatusCode.RESOURCE_EXHAUSTED, "1 B refused", "RESOURCE_EXHAUSTED: 1 B refused"),
    ],
)
def test_a_failed_call_is_one_readable_line(
    code: grpc.StatusCode, details: str, expected: str
) -> None:
    deadline = client.call_deadline(1000, bound_s=2.0)
    error = client.explain(_FakeError(code, details), _Alive(), "unary push of 1000 B", deadline)
    text = str(error)
    assert "\n" not in text and "AioRpcError" not in text
    assert text.startswith("unary push of 1000 B to tensor server on lo at 127.0.0.1:1 failed")
    assert expected in text
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        assert client.RAISE_HINT in text


@pytest.mark.parametrize(
    "noise",
    [
        ["banner"],
        ["[1, 2]", "null", '"a string"'],
        ["{not json", "", "   "],
    ],
)
def test_the_ready_line_is_found_among_stray_lines(noise: list[str]) -> None:
    lines = [*noise, '{"target": "x", "pid": 1, "fabric": "lo"}']
    code = "import sys, time\n" + "".join(f"print({line!r})\n" for line in lines)
    code += "sys.stdout.flush(); sys.stdin.read()"
    with ChildProcess([sys.executable, "-c", code], name="noisy") as child:
        assert child.read_ready_line(10)["target"] == "x"


def test_a_child_that_only_prints_noise_says_what_it_printed() -> None:
    code = "print('hello'); print('{oops')"
    with (
        ChildProcess([sys.executable, "-c", code], name="noisy") as child,
        pytest.raises(ServerError, match=r"exited with status 0 before it was ready.*'\{oops'"),
    ):
        child.read_ready_line(10)


@pytest.mark.parametrize(
    ("files", "message"),
    [
        (TlsFiles(cert="c.pem"), "--tfgrpc-tls-cert needs --tfgrpc-tls-key too"),
        (TlsFiles(key="k.pem"), "--tfgrpc-tls-key needs --tfgrpc-tls-cert too"),
        (TlsFiles(ca="missing.pem"), "--tfgrpc-tls-ca missing.pem: No such file"),
        (TlsFiles(ca="plain.txt"), "not a PEM file"),
    ],
)
def test_bad_tls_settings_name_the_flag(
    files: TlsFiles, message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.txt").write_text("hello")
    with pytest.raises(TlsError, match=message):
        load_tls(files)


def test_tls_off_is_none_and_recorded_as_off() -> None:
    assert load_tls(TlsFiles()) is None
    assert TlsFiles().describe() == "off"
    assert TlsFiles("c", "k").describe() == "tls"
    assert TlsFiles("c", "k", "ca").describe() == "mtls"


@pytest.mark.parametrize(
    ("details", "tls"),
    [
        ("Tls handshake failed (TSI_PROTOCOL_FAILURE)", True),
        ("SSL_ERROR_SSL: CERTIFICATE_VERIFY_FAILED", True),
        ("failed to connect to all addresses; Connection refused", False),
        ("Socket closed", False),
    ],
)
def test_tls_failures_are_told_from_others(details: str, tls: bool) -> None:
    assert looks_like_tls_failure(details) is tls


def _result(points: tuple[SizeResult, ...]) -> BenchmarkResult:
    return BenchmarkResult(
        "p2p_latency", "lat", "lo", "t", "raw", "unary", points, MappingProxyType({"a": "1"})
    )


@pytest.mark.parametrize("measured", [0, 1, 2])
def test_a_failure_carries_what_was_measured(measured: int) -> None:
    points: list[SizeResult] = []
    samples = np.array([1000, 2000], dtype=np.int64)
    error: Any = None
    try:
        with keeping_partial(points, _result):
            for size in range(measured):
                points.append(SizeResult.from_samples(size, size, samples, 3000))
            raise RuntimeError("server gone\nmore")
    except RuntimeError as exc:
        error = exc
    partial = partial_result(error)
    if measured == 0:
        assert partial is None
    else:
        assert partial is not None and len(partial.sizes) == measured
        assert partial.settings["interrupted"] == "server gone"


@pytest.fixture
def run_uses_tls(tmp_path: Path) -> Iterator[None]:
    """This process's TLS setting on (as ``--tfgrpc-tls-cert/-key`` make it), off after."""
    trustme = pytest.importorskip("trustme")
    leaf = trustme.CA().issue_cert("127.0.0.1")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    leaf.private_key_pem.write_to_path(str(key))
    for i, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(str(cert), append=i > 0)
    use_tls(load_tls(TlsFiles(str(cert), str(key))))
    try:
        yield
    finally:
        use_tls(None)


@pytest.mark.parametrize(
    "engine",
    [TensorFlowEngine(tf_python=sys.executable)],
    ids=["tensorflow"],
)
def test_engines_without_tls_refuse_a_tls_run(engine: Engine, run_uses_tls: None) -> None:
    # Refused before anything starts: no plaintext server in a run that promises TLS.
    with pytest.raises(EngineError, match=rf"engine '{engine.name}': .*this run uses TLS"):
        engine.start_server(Provision(resolve_fabric("lo")))


def test_the_grpcio_engine_serves_with_the_tests_tensor_limit() -> None:
    lo = resolve_fabric("lo")
    with GrpcioEngine().start_server(Provision(lo, max_tensor_bytes=1024)) as server:
        assert server.max_tensor_bytes == 1024
        with grpc.insecure_channel(server.target) as channel:
            pull = channel.unary_unary(grpc_settings.method("raw", "Pull"))
            pull(codec.encode_pull_request(1024, "float32", 0), timeout=10)  # at the limit
            with pytest.raises(grpc.RpcError) as info:
                pull(codec.encode_pull_request(1025, "float32", 0), timeout=10)
            assert info.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    cluster = GrpcioEngine().start_cluster(Provision(lo, max_tensor_bytes=2048))
    with cluster:
        assert cluster.max_tensor_bytes == 2048
