"""The native engine: its output format, its errors, and interop with the Python engine.

Tests that run the C++ programs skip, with the command that builds them, when the engine is
not built (``tfgrpc-build-native``); the rest run everywhere.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType, SimpleNamespace

import numpy as np
import pytest
from conftest import pid_alive

from pytest_tfgrpc import native
from pytest_tfgrpc.bench import native_p2p, p2p
from pytest_tfgrpc.bench.driver import Driver
from pytest_tfgrpc.bench.p2p import BandwidthCall, LatencyCall
from pytest_tfgrpc.bench.specs import SpecError
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.native.build import BuildError, build
from pytest_tfgrpc.native.client import (
    ClientPause,
    ClientSettings,
    NativeClientError,
    NativeRun,
    StreamSamples,
    decode_run,
    encode_run,
    run_client,
)
from pytest_tfgrpc.results import CpuTime
from pytest_tfgrpc.roles.native_server import check_engine, start_tensor_server
from pytest_tfgrpc.roles.processes import ServerDied, ServerProcess
from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.client import BenchmarkError
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.wire.grpc_settings import method
from pytest_tfgrpc.wire.security import TlsFiles, load_tls, open_channel, use_tls

NOT_BUILT = native.unavailable_reason()
needs_native = pytest.mark.skipif(NOT_BUILT is not None, reason=NOT_BUILT or "")

CPU = {"client": CpuTime(1, 2), "server": CpuTime(3, 4)}
RUN = RunSpec(iterations=5, warmup=1, max_seconds=2.0, warmup_seconds=1.0)


# --- everywhere: the binary form, settings, errors ------------------------------------------
def _run(counts: tuple[int, ...]) -> NativeRun:
    streams = tuple(
        StreamSamples(np.arange(1, n + 1, dtype=np.int64) * 1000, n * 1000 + 7, i * 10)
        for i, n in enumerate(counts)
    )
    return NativeRun(4096, 4110, 99_000, CPU, streams)


@pytest.mark.parametrize("counts", [(0,), (1,), (5,), (3, 0, 7)])
def test_the_binary_form_round_trips(counts: tuple[int, ...]) -> None:
    run = _run(counts)
    back = decode_run(encode_run(run))
    assert (back.size_bytes, back.wire_bytes, back.wall_ns, back.cpu) == (
        4096,
        4110,
        99_000,
        CPU,
    )
    assert len(back.streams) == len(counts)
    for mine, theirs in zip(run.streams, back.streams, strict=True):
        assert theirs.samples_ns.dtype == np.int64
        assert np.array_equal(mine.samples_ns, theirs.samples_ns)
        assert (mine.elapsed_ns, mine.start_ns) == (theirs.elapsed_ns, theirs.start_ns)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[:10], "too short"),
        (lambda b: b"XXXX" + b[4:], "not TFGN"),
        (lambda b: b[:-8], "ends inside"),
        (lambda b: b + b"\0", "left over"),
    ],
)
def test_malformed_output_is_an_error(damage: object, message: str) -> None:
    data = encode_run(_run((3,)))
    with pytest.raises(NativeClientError, match=message):
        decode_run(damage(data))  # type: ignore[operator]


def test_client_settings_become_flags() -> None:
    settings = ClientSettings(
        "127.0.0.1:1", "latency", "raw", "stream", 1024, "float32", 10, 2, 1.5, 0.5, 12.0
    )
    argv = settings.argv()
    assert argv[argv.index("--size") + 1] == "1024"
    assert argv[argv.index("--max-seconds") + 1] == "1.5"
    assert argv[argv.index("--streams") + 1] == "1"
    assert settings.timeout_s > 1.5 + 0.5 + 12.0


@pytest.mark.parametrize("engine", ["c++", "", "Native", "GRPCIO"])
def test_an_unknown_engine_is_refused_by_name(engine: object) -> None:
    with pytest.raises(ValueError, match="expected one of grpcio, native"):
        check_engine(engine)
    driver = _driver()
    with pytest.raises(SpecError, match="engine="):
        driver.p2p_latency(_no_server(), [1024], engine=engine)  # type: ignore[arg-type]


def _driver() -> Driver:
    return Driver(test="t", messages=None, budget=None, record=_ignore)


def _ignore(name: str, value: str) -> None:
    pass


def _no_server() -> ServerProcess:
    return None  # type: ignore[return-value]  # never reached: the engine check comes first


def test_an_unbuilt_engine_says_the_command_that_builds_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    with pytest.raises(native.NativeNotBuilt, match="tfgrpc-build-native") as caught:
        native.binaries()
    assert "libgrpc++-dev" in str(caught.value)
    assert native.unavailable_reason() == str(caught.value)
    with pytest.raises(SpecError, match=r"engine='native'.*tfgrpc-build-native"):
        _driver().p2p_bandwidth(_no_server(), [1024], engine="native")
    with pytest.raises(native.NativeNotBuilt):
        start_tensor_server(resolve_fabric("lo"), engine="native")


def test_the_build_dir_is_keyed_by_version_and_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    where = native.build_dir()
    assert where.parent == tmp_path
    assert where.name == f"{native.plugin_version()}-{native.source_hash()}"
    assert len(native.source_hash()) == 16


@pytest.mark.parametrize("missing", ["cmake", "pkg-config", "c++"])
def test_a_missing_build_tool_is_named_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, missing: str
) -> None:
    import shutil

    real = shutil.which
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(shutil, "which", lambda name: None if name == missing else real(name))
    with pytest.raises(BuildError, match=re.escape(missing) + " is not installed.*apt-get install"):
        build()
    assert not any(tmp_path.iterdir())


# --- with the engine built: interop both ways -----------------------------------------------
@pytest.fixture(scope="module")
def lo() -> Fabric:
    return resolve_fabric("lo")


@pytest.fixture(scope="module", params=["grpcio", "native"])
def server(request: pytest.FixtureRequest, lo: Fabric) -> Iterator[ServerProcess]:
    """A server of each engine; the client is always the other engine's (see ``_client``)."""
    if request.param == "native" and NOT_BUILT:
        pytest.skip(NOT_BUILT)
    with start_tensor_server(lo, engine=request.param) as handle:
        yield handle


def _client(server: ServerProcess) -> ModuleType:
    """The other engine's benchmarks: Python against a native server, native against Python."""
    if server.name.startswith("native"):
        return p2p
    if NOT_BUILT:
        pytest.skip(NOT_BUILT)
    return native_p2p


MULTI_CHUNK = 200_003  # four 64 KiB slices, the last one short; not whole float32 elements
SIZES = [0, 1, 4096, MULTI_CHUNK]


@pytest.mark.parametrize("mode", ["raw", "protobuf"])
@pytest.mark.parametrize("rpc", ["unary", "stream"])
def test_echo_across_engines(server: ServerProcess, mode: str, rpc: str) -> None:
    call = LatencyCall(mode=mode, rpc=rpc, run=RUN)
    result = _client(server).p2p_latency(server, SIZES, call)
    assert [s.size_bytes for s in result.sizes] == SIZES
    assert all(s.count == RUN.iterations and s.summary.min_ns > 0 for s in result.sizes)
    assert result.settings["engine"] in ("grpcio", "native")


@pytest.mark.parametrize("mode", ["raw", "protobuf"])
@pytest.mark.parametrize("rpc", ["unary", "stream"])
@pytest.mark.parametrize("direction", ["push", "pull"])
def test_bandwidth_across_engines(
    server: ServerProcess, mode: str, rpc: str, direction: str
) -> None:
    # A raw streamed push cannot announce a 0-byte message: both servers refuse it (below).
    sizes = SIZES[1:] if (mode, rpc, direction) == ("raw", "stream", "push") else SIZES
    call = BandwidthCall(mode=mode, rpc=rpc, direction=direction, chunk_bytes=64 << 10, run=RUN)
    result = _client(server).p2p_bandwidth(server, sizes, call)
    assert [s.size_bytes for s in result.sizes] == sizes
    for size in result.sizes:
        assert size.count == RUN.iterations
        assert size.cpu["server"].total_ns > 0
    wire = {s.size_bytes: s.wire_bytes for s in result.sizes}
    header = len(codec.encode_header("uint8", (1,), 1))
    assert wire[1] == (1 if mode == "raw" else header + 1)


def test_both_servers_take_an_empty_raw_stream_push(server: ServerProcess) -> None:
    # A 0-byte tensor is a message like any other, in every mode and on either server.
    client = _client(server)
    result = client.p2p_bandwidth(server, [0], BandwidthCall(mode="raw", rpc="stream", run=RUN))
    assert [s.size_bytes for s in result.sizes] == [0]
    assert result.sizes[0].count == RUN.iterations


@pytest.mark.parametrize(
    ("call", "both_ways"),
    [
        (LatencyCall(run=RUN), True),
        (LatencyCall(rpc="stream", run=RUN), True),
        (BandwidthCall(run=RUN), False),
        (BandwidthCall(rpc="stream", direction="pull", run=RUN), False),
    ],
)
@pytest.mark.parametrize("speed_mbps", [None, 100])
def test_the_native_client_takes_the_python_engines_deadline(
    monkeypatch: pytest.MonkeyPatch,
    call: LatencyCall | BandwidthCall,
    both_ways: bool,
    speed_mbps: int | None,
) -> None:
    """One rule for a call's (or a stream's) deadline, whichever engine runs it: the run's
    bound, slack, and the bytes at the fabric's speed (an echo's both ways)."""
    fabric = replace(resolve_fabric("lo"), speed_mbps=speed_mbps)
    server = SimpleNamespace(target="127.0.0.1:1", fabric=fabric, died=lambda: None)
    taken: list[ClientSettings] = []

    def client(settings: ClientSettings, **_: object) -> None:
        taken.append(settings)
        raise NativeClientError("stopped here")

    monkeypatch.setattr(native_p2p, "run_client", client)
    with pytest.raises(BenchmarkError, match="stopped here"):
        native_p2p.run_native(server, 4096, call)
    (settings,) = taken
    wire = 4096 * (2 if both_ways else 1)  # a raw tensor is its bytes on the wire
    expected = p2p.deadline(server, call.run, wire).seconds
    assert settings.deadline_s == expected


def test_a_native_deadline_says_what_it_was_and_how_to_raise_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """gRPC's C++ library says only "Deadline Exceeded"; the error says what the Python
    engine's does: the deadline, what it was made of, and the settings that raise it."""
    server = SimpleNamespace(target="127.0.0.1:1", fabric=resolve_fabric("lo"), died=lambda: None)

    def client(settings: ClientSettings, **_: object) -> None:
        raise NativeClientError("stream echo failed: DEADLINE_EXCEEDED: Deadline Exceeded")

    monkeypatch.setattr(native_p2p, "run_client", client)
    call = LatencyCall(rpc="stream", run=RUN)
    with pytest.raises(BenchmarkError) as failed:
        native_p2p.run_native(server, 4096, call)
    described = p2p.deadline(server, call.run, 2 * 4096).describe()
    assert f"DEADLINE_EXCEEDED: the deadline was {described}; raise it with" in str(failed.value)


@needs_native
def test_the_native_engine_records_itself(lo: Fabric) -> None:
    with start_tensor_server(lo, engine="native") as handle:
        result = native_p2p.p2p_bandwidth(handle, [1 << 20], BandwidthCall(run=RUN))
    assert result.settings["engine"] == "native"
    assert result.settings["grpc_cpp"]
    assert result.settings["method"] == "/tfgrpc.RawTensorService/PushStream"
    assert result.sizes[0].throughput_Bps > 0


@needs_native
def test_the_native_server_binds_the_fabric_address_and_stops_on_stdin_eof(lo: Fabric) -> None:
    handle = start_tensor_server(lo, engine="native")
    try:
        assert handle.target.startswith("127.0.0.1:")
        listening = subprocess.run(
            ["ss", "-Hltnp"], capture_output=True, text=True, check=False
        ).stdout
        port = handle.target.rsplit(":", 1)[1]
        mine = [line for line in listening.splitlines() if f":{port} " in line]
        # gRPC may listen on an IPv6 socket at the v4-mapped [::ffff:127.0.0.1]: still only lo.
        assert mine and all("127.0.0.1" in line.split()[3] for line in mine)
    finally:
        status = handle.stop(timeout=5.0)
    assert status == 0  # stdin EOF, not a signal
    assert not pid_alive(handle.pid)


@needs_native
def test_a_native_server_death_is_reported_as_such(lo: Fabric) -> None:
    with start_tensor_server(lo, engine="native") as handle:
        os.kill(handle.pid, signal.SIGKILL)
        with pytest.raises(ServerDied, match="SIGKILL"):
            native_p2p.p2p_latency(handle, [1024], LatencyCall(run=RUN))


@needs_native
@pytest.mark.parametrize("streams", [1, 2])
def test_a_server_that_stops_answering_in_the_warm_up_fails_the_run_at_its_deadline(
    lo: Fabric, streams: int
) -> None:
    """A stopped server (SIGSTOP) fails a warm-up call at the call's deadline (1 s here), and
    the client ends then: it neither pauses for telemetry nor reads the server's CPU, which
    would wait on the stopped server for its own 10 s first."""
    with start_tensor_server(lo, engine="native") as handle:
        settings = ClientSettings(
            target=handle.target, benchmark="latency", mode="raw", rpc="unary", size=1024,
            dtype="float32", iterations=5, warmup=10**6, max_seconds=2.0,
            warmup_seconds=20.0, deadline_s=1.0, streams=streams,
        )  # fmt: skip
        told: list[ClientPause] = []
        stopper = threading.Timer(0.5, os.kill, (handle.pid, signal.SIGSTOP))
        stopper.start()
        began = time.monotonic()
        try:
            with pytest.raises(NativeClientError, match="DEADLINE_EXCEEDED"):
                run_client(settings, pause=told.append)
            took = time.monotonic() - began
        finally:
            stopper.join()
            os.kill(handle.pid, signal.SIGCONT)
    assert took < 6.0, took  # 0.5 s, then the 1 s deadline; 11.5 s and more before
    assert told == []  # no pause: nothing was measured


@needs_native
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--size", "-1"], "--size"),
        (["--mode", "json"], "--mode"),
        (["--streams", "0"], "--streams"),
        (["--chunk-bytes", "8"], "--chunk-bytes"),
        (["--bogus", "1"], "unknown argument --bogus"),
    ],
)
def test_the_native_client_refuses_bad_flags(flags: list[str], message: str) -> None:
    settings = ClientSettings(
        "127.0.0.1:9", "latency", "raw", "unary", 1024, "float32", 5, 1, 1.0, 1.0, 5.0
    )
    argv = [str(native.binaries().client), *settings.argv(), *flags]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 2
    assert message in done.stderr


@needs_native
def test_building_again_finds_the_build_and_compiles_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from pytest_tfgrpc.native.build import main

    before = native.binaries().client.stat().st_mtime_ns
    assert main([]) == 0
    assert str(native.build_dir()) in capsys.readouterr().out
    assert native.binaries().client.stat().st_mtime_ns == before


def test_a_bad_jobs_count_is_a_usage_error() -> None:
    from pytest_tfgrpc.native.build import main

    with pytest.raises(SystemExit) as exited:
        main(["--jobs", "0"])
    assert exited.value.code == 2


@needs_native
def test_the_native_client_stops_when_its_parent_goes_away(lo: Fabric) -> None:
    with start_tensor_server(lo, engine="native") as handle:
        settings = ClientSettings(
            handle.target, "latency", "raw", "stream", 1024, "float32", 10**9, 1, 60.0, 1.0, 90.0
        )
        argv = [str(native.binaries().client), *settings.argv(), "--exit-on-stdin-eof"]
        client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        try:
            with pytest.raises(subprocess.TimeoutExpired):
                client.wait(timeout=1.0)  # measuring, for up to a minute
            assert client.stdin is not None
            client.stdin.close()  # what the parent's death does to the pipe
            assert client.wait(timeout=10) == 4
        finally:
            if client.poll() is None:
                client.kill()
                client.wait()


@needs_native
@pytest.mark.parametrize("threads", [2, 3])
def test_a_native_server_on_several_threads_serves_concurrent_streams(
    lo: Fabric, threads: int
) -> None:
    from pytest_tfgrpc.bench.streams import p2p_bandwidth_streams
    from pytest_tfgrpc.roles.native_server import start_native_server

    with start_native_server(lo, threads=threads) as handle:
        call = BandwidthCall(run=RUN)
        both = p2p_bandwidth_streams(handle, [1 << 20], call, streams=3, engine="native")
        latency = native_p2p.p2p_latency(handle, [1024], LatencyCall(rpc="stream", run=RUN))
    assert both.aggregate.sizes[0].count == 3 * RUN.iterations
    assert latency.sizes[0].count == RUN.iterations


@pytest.mark.parametrize(
    ("argument", "value"), [("threads", 0), ("threads", 65), ("delay_s", -1.0)]
)
def test_bad_native_server_settings_are_refused_by_name(
    lo: Fabric, argument: str, value: object
) -> None:
    from pytest_tfgrpc.roles.native_server import start_native_server

    with pytest.raises(ValueError, match=f"{argument}="):
        start_native_server(lo, **{argument: value})  # type: ignore[arg-type]


# --- TLS: every pair of engines, every call, server-only TLS and mutual TLS ------------------
@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A CA, a certificate for 127.0.0.1 it signed, and a second CA that signed nothing."""
    trustme = pytest.importorskip("trustme")
    where = tmp_path_factory.mktemp("pki")
    ca, other = trustme.CA(), trustme.CA()
    leaf = ca.issue_cert("127.0.0.1")
    paths = {k: str(where / f"{k}.pem") for k in ("ca", "cert", "key", "other_ca")}
    ca.cert_pem.write_to_path(paths["ca"])
    other.cert_pem.write_to_path(paths["other_ca"])
    leaf.private_key_pem.write_to_path(paths["key"])
    for i, pem in enumerate(leaf.cert_chain_pems):
        pem.write_to_path(paths["cert"], append=i > 0)
    return paths


def _tls(pki: dict[str, str], mode: str) -> TlsFiles:
    # Server-only TLS: clients verify the server against the CA and present nothing.
    if mode == "tls":
        return TlsFiles(cert=pki["cert"], key=pki["key"])
    return TlsFiles(cert=pki["cert"], key=pki["key"], ca=pki["ca"])


@contextlib.contextmanager
def _tls_run(client: TlsFiles) -> Iterator[None]:
    use_tls(load_tls(client))
    try:
        yield
    finally:
        use_tls(None)


TLS_CALLS = [
    LatencyCall(mode="raw", rpc="unary", run=RUN),
    LatencyCall(mode="protobuf", rpc="stream", run=RUN),
    *(
        BandwidthCall(mode=m, rpc=r, direction=d, chunk_bytes=64 << 10, run=RUN)
        for m, r, d in [
            ("raw", "unary", "push"),
            ("protobuf", "stream", "push"),
            ("raw", "stream", "pull"),
            ("protobuf", "unary", "pull"),
        ]
    ),
]


@pytest.mark.parametrize("mode", ["tls", "mtls"])
@pytest.mark.parametrize("server_engine", ["grpcio", "native"])
@pytest.mark.parametrize("client_engine", ["grpcio", "native"])
def test_tls_across_engines_on_every_call(
    lo: Fabric, pki: dict[str, str], mode: str, server_engine: str, client_engine: str
) -> None:
    if "native" in (server_engine, client_engine) and NOT_BUILT:
        pytest.skip(NOT_BUILT)
    files = _tls(pki, mode)
    # The client's CA: the one that signed the server's certificate (mtls: also its identity).
    client = TlsFiles(ca=pki["ca"]) if mode == "tls" else files
    env = {**os.environ, **files.env()}
    loops = native_p2p if client_engine == "native" else p2p
    with start_tensor_server(lo, engine=server_engine, env=env) as server, _tls_run(client):
        for call in TLS_CALLS:
            if isinstance(call, LatencyCall):
                result = loops.p2p_latency(server, [1, MULTI_CHUNK], call)
            else:
                result = loops.p2p_bandwidth(server, [1, MULTI_CHUNK], call)
            assert [s.count for s in result.sizes] == [RUN.iterations] * 2, call


@needs_native
def test_a_mutual_tls_native_server_refuses_a_client_without_a_certificate(
    lo: Fabric, pki: dict[str, str]
) -> None:
    env = {**os.environ, **_tls(pki, "mtls").env()}
    with start_tensor_server(lo, engine="native", env=env) as server:
        with (
            _tls_run(TlsFiles(ca=pki["ca"])),
            pytest.raises(BenchmarkError, match=r"no connection .* within 10 s \(TLS tls on this"),
        ):
            native_p2p.p2p_latency(server, [4], LatencyCall(run=RUN))
        with _tls_run(TlsFiles(ca=pki["other_ca"])), pytest.raises(BenchmarkError, match="TLS"):
            p2p.p2p_latency(server, [4], LatencyCall(run=RUN))


@needs_native
@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"TFGRPC_TLS_CERT": "cert"}, "$TFGRPC_TLS_CERT needs $TFGRPC_TLS_KEY too"),
        ({"TFGRPC_TLS_CA": "ca"}, "a TLS server needs a certificate and its key"),
        ({"TFGRPC_TLS_CA": "/nonexistent.pem"}, "$TFGRPC_TLS_CA /nonexistent.pem: cannot be read"),
        ({"TFGRPC_TLS_CA": "missing"}, "not a PEM file"),
    ],
)
def test_bad_tls_settings_stop_a_native_server_in_one_line(
    pki: dict[str, str], variables: dict[str, str], message: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFGRPC_TLS_")}
    # "missing": a file that exists but is no PEM (this module's own source)
    env.update({k: pki.get(v, __file__ if v == "missing" else v) for k, v in variables.items()})
    done = subprocess.run(
        [str(native.binaries().server), "--host", "127.0.0.1"],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("tfgrpc-native-server: error: TLS settings: ") and message in line


# --- tfgrpc-server --engine native: the native server started by hand ------------------------
def _by_hand(lo: Fabric, *flags: str, env: dict[str, str] | None = None) -> ServerProcess:
    argv = [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--engine", "native"]
    argv += ["--fabric", "lo", "--exit-on-stdin-eof", *flags]
    return ServerProcess.launch(argv, lo, name="tfgrpc-server --engine native", env=env)


@needs_native
def test_tfgrpc_server_engine_native_serves_with_the_same_flags(
    lo: Fabric, pki: dict[str, str]
) -> None:
    files = _tls(pki, "mtls")
    flags = ["--cpus", "0", "--delay", "20ms", "--workers", "2"]
    flags += [f"--tls-{k}={getattr(files, k)}" for k in ("cert", "key", "ca")]
    with _by_hand(lo, *flags) as server, _tls_run(files):
        assert os.sched_getaffinity(server.pid) == {0}  # pinned before it became the server
        result = p2p.p2p_latency(server, [1024], LatencyCall(run=RUN))
        with open_channel(server.target, ()) as channel:
            reply = channel.unary_unary(method("raw", "Status"))(b"", timeout=10)
    # It became the native server (the pid kept through exec), with mutual TLS, 20 ms late.
    status = service_pb2.ServerStatus.FromString(reply)
    assert status.pid == server.pid and status.grpc_version.endswith("(C++)")
    assert status.environment["MALLOC_MMAP_THRESHOLD_"] == "33554432"  # the tuned allocator
    assert result.sizes[0].summary.min_ns >= 20_000_000


@needs_native
def test_tfgrpc_server_engine_native_takes_the_tensor_limit(lo: Fabric) -> None:
    with _by_hand(lo, "--max-tensor-bytes", "4KiB") as server:
        assert p2p.p2p_latency(server, [4096], LatencyCall(run=RUN)).sizes[0].count
        with pytest.raises(BenchmarkError, match="RESOURCE_EXHAUSTED"):
            p2p.p2p_latency(server, [4097], LatencyCall(run=RUN))


@needs_native
def test_tfgrpc_server_engine_native_refuses_bad_flags_in_one_line(lo: Fabric) -> None:
    argv = [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--engine", "native"]
    done = subprocess.run(
        [*argv, "--workers", "65"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].endswith(
        "--workers 65: the native server takes 1 to 64 threads"
    )


def test_tfgrpc_server_engine_native_without_the_build_names_the_command(
    tmp_path: Path,
) -> None:
    argv = [sys.executable, "-m", "pytest_tfgrpc.roles.tensor_server", "--engine", "native"]
    env = {**os.environ, native.CACHE_ENV: str(tmp_path)}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env=env)
    assert done.returncode == 2
    [line] = [text for text in done.stderr.splitlines() if "error:" in text]
    assert "--engine native: the native engine is not built" in line
    assert "tfgrpc-build-native" in line
