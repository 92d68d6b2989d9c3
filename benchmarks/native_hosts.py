"""The native engine between hosts: its targets as ratios inside one run, every role started
through node agents on emulated hosts.

    python benchmarks/native_hosts.py [--quick] [--rounds N] [--parts ps,mtls] [--json out.json]
                                      [--allocator tuned|default]

Needs root (network namespaces), the native engine built (``tfgrpc-build-native``) and the
``dev`` extra (trustme: each host gets its own certificate). It builds one emulated fabric
(``h0``-``h5`` on uncapped veth links through the bridge, ``cap`` behind a 1 Gbit/s ``tbf``
cap), starts ``tfgrpc-node`` in every host with its own certificate, and from this process,
the driver on the bridge, measures:

1. P2P bandwidth: the native engine (raw stream push, one ack per tensor) at 16 and 64 MiB
   against the native raw-TCP floor (``tfgrpc-native-floor``) between the same two hosts (its
   server started by the same agent).
   Target: >= 0.8x the floor.
2. 1 KiB stream echo p50, native against grpcio (each engine's server on ``h0``, its own
   client). Target: native <= 0.5x grpcio.
3. PS throughput, 2 PS (``h0``, ``h1``) x 4 workers (``h2``-``h5``) at 4 MiB, native PS tasks
   and workers against grpcio's, with the CPU each role spent per GB it moved and its kernel
   (system) part. Target: native >= 3x grpcio. ``ratio_bound_by_kernel``: the most any native
   engine could reach here, grpcio's CPU per GB over the native roles' kernel CPU per GB.
4. ``cap``: native 64 MiB pushes through the 1 Gbit/s cap. Target: within +-5% of the cap
   (payload runs a few percent under it: ``tbf`` shapes whole frames).
5. Native with mutual TLS (the host's own certificate) against native plaintext at 16 MiB,
   the same agent serving both, with the CPU each end spent per GB (and its kernel part), the
   suite negotiated, its cipher's CPU per GB (``openssl speed``) and ``ratio_bound_by_cipher``:
   the most mTLS could reach if TLS cost its cipher alone. Target: >= 0.5x.

Every role runs under the plugin's allocator policy (``--allocator``, default ``tuned``, as
``--tfgrpc-allocator``): its variables reach every role on every host. Glibc's defaults map and
unmap each 4 MiB message, which adds ~0.1-0.2 kernel CPU s per GB to the PS part's roles.

Every round measures every contender of a part in alternating order; a figure is the median
over rounds, and each ratio is taken inside the run. A part that cannot run here is reported as
skipped, with why. Nothing is asserted: the figures are readings,
and the load average is printed before and after, since on a shared machine they swing.
``--quick`` is a smoke run (one round, a few operations, seconds per part).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pytest_tfgrpc import native
from pytest_tfgrpc.bench import BandwidthCall, LatencyCall, RunSpec, native_p2p, p2p
from pytest_tfgrpc.bench.floor import transport_floor
from pytest_tfgrpc.bench.ps import ps_throughput
from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentTLS
from pytest_tfgrpc.hosts.emulated import HostAgent, can_build, emulated_fabric, parse_hosts
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.results import CpuTime
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.tuning import allocator as tuning
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabric
from pytest_tfgrpc.wire.security import TlsFiles, load_tls, use_tls

MiB = 1 << 20
HOSTS = "h0,h1,h2,h3,h4,h5,cap@1gbit"
CAP_BITS = 1e9


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def issue_certificates(hosts: list[tuple[str, str]], where: Path) -> dict[str, TlsFiles]:
    """A CA, and a certificate for each ``(name, address)`` it signed (trustme)."""
    import trustme

    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(where / "ca.pem"))
    out = {}
    for name, address in hosts:
        leaf = ca.issue_cert(address)
        cert, key = where / f"{name}.pem", where / f"{name}-key.pem"
        leaf.private_key_pem.write_to_path(str(key))
        for i, pem in enumerate(leaf.cert_chain_pems):
            pem.write_to_path(str(cert), append=i > 0)
        out[name] = TlsFiles(str(cert), str(key), str(where / "ca.pem"))
    return out


@contextlib.contextmanager
def tls_run(files: TlsFiles | None) -> Iterator[None]:
    """This process's TLS setting (its clients') for the block."""
    use_tls(load_tls(files) if files is not None else None)
    try:
        yield
    finally:
        use_tls(None)


def median(values: list[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def ratio(tops: list[float], bottoms: list[float]) -> float:
    """The median over rounds of each round's ratio (both measured in that round)."""
    return median([top / bottom for top, bottom in zip(tops, bottoms, strict=True)])


class Bench:
    def __init__(self, quick: bool, rounds: int) -> None:
        self.quick = quick
        self.rounds = 1 if quick else rounds
        self.rows: list[dict[str, Any]] = []

    def run_spec(self, iterations: int, seconds: float) -> RunSpec:
        if self.quick:
            return RunSpec(iterations=3, warmup=1, max_seconds=2.0, warmup_seconds=1.0)
        return RunSpec(iterations=iterations, warmup=2, max_seconds=seconds, warmup_seconds=3.0)

    def rounds_of(self, contenders: dict[str, Callable[[], float]]) -> dict[str, list[float]]:
        """Every contender once per round, the order reversed every other round."""
        out: dict[str, list[float]] = {name: [] for name in contenders}
        names = list(contenders)
        for r in range(self.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                out[name].append(contenders[name]())
        return out

    def report(self, part: str, target: str, status: str, **figures: Any) -> None:
        row = {"part": part, "target": target, "status": status, **figures}
        self.rows.append(row)
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in figures.items())  # fmt: skip
        print(f"[{part}] {status}: {target}" + (f" | {shown}" if shown else ""), flush=True)


def hosts_with_agents(
    stack: contextlib.ExitStack, hosts: str
) -> tuple[Fabric, dict[str, AgentClient], TlsFiles]:
    """An emulated fabric of ``hosts``, an agent in each serving mutual TLS with its host's own
    certificate, and a client of each; all removed when ``stack`` closes. Returns the
    driver's fabric, the agents' clients by host and the driver's certificate files."""
    tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="native-hosts-")))
    fabric = stack.enter_context(emulated_fabric(parse_hosts(hosts)))
    token_file = tmp / "token"
    token_file.write_text(secrets.token_hex(24) + "\n")
    token_file.chmod(0o600)
    names = [("driver", fabric.driver_address), *((h.name, h.address) for h in fabric.hosts)]
    pki = issue_certificates(names, tmp)
    driver_tls = pki["driver"]
    assert driver_tls.ca is not None
    agents: dict[str, AgentClient] = {}
    for host in fabric.hosts:
        own = pki[host.name]
        agent = HostAgent(
            host, str(token_file),
            extra_args=[f"--tls-{k}={getattr(own, k)}" for k in ("cert", "key", "ca")],
        )  # fmt: skip
        stack.callback(agent.stop)
        client = AgentClient(
            agent.target,
            token_file.read_text().strip(),
            tls=AgentTLS.from_files(driver_tls.ca, driver_tls.cert, driver_tls.key),
        )
        stack.callback(client.close)
        agents[host.name] = client
    return resolve_fabric(fabric.bridge), agents, driver_tls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: seconds per part")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per part (default 5)")
    parser.add_argument("--json", help="write every row here too")
    parser.add_argument(
        "--parts",
        default=",".join(name for name, _, _ in PARTS),
        help="comma-separated parts to run (default: all: %(default)s)",
    )
    parser.add_argument(
        "--allocator",
        choices=tuning.ALLOCATOR_POLICIES,
        default="tuned",
        help="glibc allocator policy of this process and of every role, as the plugin's "
        "--tfgrpc-allocator (default tuned)",
    )
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1")
    parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = sorted(set(parts) - {name for name, _, _ in PARTS})
    if unknown or not parts:
        known = ", ".join(name for name, _, _ in PARTS)
        parser.error(
            f"--parts {args.parts!r}: unknown {', '.join(unknown) or 'empty'}; known: {known}"
        )
    ok, why = can_build()
    if not ok:
        print(f"skipped: emulated hosts cannot be built here: {why}")
        return 0
    reason = native.unavailable_reason()
    if reason is not None:
        print(f"skipped: {reason}")
        return 0
    # Every role's environment starts from this process's (agents pass the variables on).
    os.environ.update(tuning.apply_policy(args.allocator) or {})
    bench = Bench(args.quick, args.rounds)
    print(f"load before: {uptime()}", flush=True)
    print(f"allocator: {args.allocator} {tuning.allocator_settings()}", flush=True)
    with contextlib.ExitStack() as stack:
        driver, agents, driver_tls = hosts_with_agents(stack, HOSTS)
        run_parts(bench, driver, agents, driver_tls, parts)
    print(f"load after: {uptime()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(bench.rows, indent=1) + "\n")
    return 0


def _server(
    driver: Fabric, agent: AgentClient, engine: str, tls: TlsFiles | None = None
) -> ServerProcess:
    env = {**os.environ, **(tls.env() if tls is not None else {})}
    return start_tensor_server(driver, engine=engine, env=env, launcher=agent.launcher())


Agents = dict[str, AgentClient]


def p2p_floor(bench: Bench, driver: Fabric, agents: Agents, tls: TlsFiles) -> None:
    run = bench.run_spec(30, 8.0)
    call = BandwidthCall(mode="raw", rpc="stream", direction="push", run=run)
    with _server(driver, agents["h0"], "native") as server:
        for size in (16 * MiB, 64 * MiB):
            # The floor takes its sizes from a result (this one also warms the path up), and
            # its server runs on the same host, through the same agent, as the measured one.
            shape = native_p2p.p2p_bandwidth(server, [size], call)

            def push(size: int = size) -> float:
                return float(native_p2p.p2p_bandwidth(server, [size], call).sizes[0].throughput_Bps)

            def floor(shape: Any = shape) -> float:
                measured = transport_floor(
                    driver, shape, run, launcher=server.launcher, engine="native"
                )
                return float(measured.sizes[0].throughput_Bps)

            got = bench.rounds_of({"native": push, "floor": floor})
            bench.report(
                "p2p-floor",
                f"{size // MiB} MiB",
                "measured",
                native_GBps=median(got["native"]) / 1e9,
                floor_GBps=median(got["floor"]) / 1e9,
                ratio=ratio(got["native"], got["floor"]),
                floor_impl="native raw-TCP floor (tfgrpc-native-floor) server and client",
            )


def echo(bench: Bench, driver: Fabric, agents: Agents, tls: TlsFiles) -> None:
    call = LatencyCall(mode="raw", rpc="stream", run=bench.run_spec(2000, 5.0))
    with (
        _server(driver, agents["h0"], "native") as nat,
        _server(driver, agents["h0"], "grpcio") as py,
    ):
        got = bench.rounds_of(
            {
                "native": lambda: native_p2p.p2p_latency(nat, [1024], call).sizes[0].summary.p50_ns,
                "grpcio": lambda: p2p.p2p_latency(py, [1024], call).sizes[0].summary.p50_ns,
            }
        )
    bench.report(
        "echo",
        "1 KiB p50",
        "measured",
        native_us=median(got["native"]) / 1e3,
        grpcio_us=median(got["grpcio"]) / 1e3,
        ratio=ratio(got["native"], got["grpcio"]),
    )


def ps(bench: Bench, driver: Fabric, agents: Agents, tls: TlsFiles) -> None:
    run = bench.run_spec(200, 8.0)
    ps_hosts = [agents[h].launcher() for h in ("h0", "h1")]
    worker_hosts = [agents[h].launcher() for h in ("h2", "h3", "h4", "h5")]
    # CPU ns per byte (= s per GB): each PS per byte it received, the workers and all roles
    # together per byte moved; "_system" the kernel's part (TCP, veth, bridge), which no
    # engine can cut.
    cpu: dict[str, dict[str, list[float]]] = {"native": {}, "grpcio": {}}
    with contextlib.ExitStack() as stack:
        clusters = {
            engine: stack.enter_context(
                PSCluster(
                    driver,
                    Topology(ps=2, workers=4),
                    workers_engine=engine,
                    ps_launchers=ps_hosts,
                    worker_launchers=worker_hosts,
                    ps_engine=engine,
                )
            )
            for engine in cpu
        }

        def measure(engine: str) -> float:
            point = ps_throughput(clusters[engine], [4 * MiB], run=run).sizes[0]
            moved = sum(load.bytes_in for load in point.per_ps)
            roles = {f"ps{i}": (load.cpu, load.bytes_in) for i, load in enumerate(point.per_ps)}
            roles["workers"] = (point.cpu["workers"], moved)
            system = sum(load.cpu.system_ns for load in point.per_ps)
            system += point.cpu["workers"].system_ns
            total = sum(load.cpu.total_ns for load in point.per_ps)
            total += point.cpu["workers"].total_ns
            roles["all"] = (CpuTime(total - system, system), moved)
            for role, (used, nbytes) in roles.items():
                cpu[engine].setdefault(role, []).append(used.total_ns / nbytes)
                cpu[engine].setdefault(f"{role}_system", []).append(used.system_ns / nbytes)
            return float(point.throughput_Bps)

        got = bench.rounds_of(
            {"native": lambda: measure("native"), "grpcio": lambda: measure("grpcio")}
        )
    figures: dict[str, Any] = {
        "native_GBps": median(got["native"]) / 1e9,
        "grpcio_GBps": median(got["grpcio"]) / 1e9,
        "ratio": ratio(got["native"], got["grpcio"]),
    }
    for engine, roles in cpu.items():
        for role, values in roles.items():
            figures[f"{engine}_{role}_cpu_s_per_GB"] = median(values)
    # Every role shares the 2 cores, so throughput follows CPU per byte moved: the native
    # engine can beat grpcio by at most grpcio's CPU per byte over the kernel's part of the
    # native roles' (what is left with no user-space cost at all).
    figures["ratio_bound_by_kernel"] = ratio(cpu["grpcio"]["all"], cpu["native"]["all_system"])
    bench.report("ps", "4 MiB, 2 PS x 4 workers", "measured", **figures)


def cap(bench: Bench, driver: Fabric, agents: Agents, tls: TlsFiles) -> None:
    call = BandwidthCall(mode="raw", rpc="stream", direction="push", run=bench.run_spec(12, 15.0))
    with _server(driver, agents["cap"], "native") as server:
        got = bench.rounds_of(
            {
                "native": lambda: (
                    native_p2p.p2p_bandwidth(server, [64 * MiB], call).sizes[0].throughput_Bps
                )
            }
        )
    bits = median(got["native"]) * 8
    bench.report("cap", "64 MiB", "measured", payload_Gbps=bits / 1e9, of_cap=bits / CAP_BITS)


def mtls(bench: Bench, driver: Fabric, agents: Agents, tls: TlsFiles) -> None:
    call = BandwidthCall(mode="raw", rpc="stream", direction="push", run=bench.run_spec(40, 8.0))
    h1 = agents["h1"]
    # CPU s per GB of each end (the client here, the server on h1), and its kernel part:
    # what mutual TLS adds per byte, on one connection's threads.
    cpu: dict[str, list[float]] = {}
    with _server(driver, h1, "native") as plain, _server(driver, h1, "native", tls) as secure:

        def push(label: str, server: ServerProcess) -> float:
            point = native_p2p.p2p_bandwidth(server, [16 * MiB], call).sizes[0]
            moved = point.count * 16 * MiB
            for end, used in point.cpu.items():
                cpu.setdefault(f"{label}_{end}_cpu_s_per_GB", []).append(used.total_ns / moved)
                key = f"{label}_{end}_system_s_per_GB"
                cpu.setdefault(key, []).append(used.system_ns / moved)
            return float(point.throughput_Bps)

        def mutual() -> float:
            with tls_run(tls):
                return push("mtls", secure)

        got = bench.rounds_of({"plaintext": lambda: push("plaintext", plain), "mtls": mutual})
        suite = negotiated_suite(secure.target, tls)
    figures: dict[str, Any] = {key: median(values) for key, values in sorted(cpu.items())}
    cipher = cipher_s_per_GB(suite)
    if cipher is not None:
        # The most mTLS could reach if TLS cost its cipher alone at each end (CPU-bound ends:
        # throughput follows CPU per GB).
        both = sum(figures[f"plaintext_{end}_cpu_s_per_GB"] for end in ("client", "server"))
        figures.update(cipher_s_per_GB=cipher, ratio_bound_by_cipher=both / (both + 2 * cipher))
    bench.report(
        "mtls",
        "16 MiB",
        "measured",
        mtls_GBps=median(got["mtls"]) / 1e9,
        plaintext_GBps=median(got["plaintext"]) / 1e9,
        ratio=ratio(got["mtls"], got["plaintext"]),
        suite=suite or "unknown",
        **figures,
    )


#: OpenSSL's name of each TLS 1.3 suite's cipher, for ``openssl speed -evp``.
_SUITE_CIPHERS = {
    "TLS_AES_128_GCM_SHA256": "aes-128-gcm",
    "TLS_AES_256_GCM_SHA384": "aes-256-gcm",
    "TLS_CHACHA20_POLY1305_SHA256": "chacha20-poly1305",
}


def negotiated_suite(target: str, tls: TlsFiles) -> str | None:
    """The TLS suite an OpenSSL client with default settings negotiates with ``target``
    (``openssl s_client``); None if unknown. A native server's own order decides (native/src/
    tls.h), so this is the suite native clients get too."""
    if tls.ca is None:
        return None
    argv = ["openssl", "s_client", "-connect", target, "-brief", "-alpn", "h2",
            "-cert", tls.cert, "-key", tls.key, "-CAfile", tls.ca]  # fmt: skip
    try:
        # stdout carries the server's first HTTP/2 bytes: not text.
        done = subprocess.run(
            argv, input="", capture_output=True, text=True, errors="replace", timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("Ciphersuite:"):
            return line.split(":", 1)[1].strip()
    return None


def cipher_s_per_GB(suite: str | None) -> float | None:
    """CPU seconds per GB of ``suite``'s cipher on 16 KiB records (TLS's largest), from
    ``openssl speed`` on this machine now (1 s); None if unknown."""
    evp = _SUITE_CIPHERS.get(suite or "")
    if evp is None:
        return None
    argv = ["openssl", "speed", "-seconds", "1", "-bytes", "16384", "-evp", evp]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        kilobytes_per_s = float(done.stdout.strip().splitlines()[-1].split()[-1].rstrip("k"))
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return None
    return 1e9 / (kilobytes_per_s * 1e3)


PARTS = (
    ("p2p-floor", "native push >= 0.8x the raw-TCP floor at 16-64 MiB", p2p_floor),
    ("echo", "native 1 KiB stream echo p50 <= 0.5x grpcio's", echo),
    ("ps", "native PS throughput >= 3x grpcio's, 2 PS x 4 workers at 4 MiB", ps),
    ("cap", "native 64 MiB push within +-5% of a 1 Gbit/s tbf cap", cap),
    ("mtls", "native mutual TLS >= 0.5x native plaintext at 16 MiB", mtls),
)


def run_parts(
    bench: Bench, driver: Fabric, agents: Agents, tls: TlsFiles, parts: list[str]
) -> None:
    """Every part of ``parts`` in turn; one that fails says why, and the next runs."""
    for name, target, body in PARTS:
        if name not in parts:
            continue
        print(f"[{name}] target: {target}", flush=True)
        try:
            body(bench, driver, agents, tls)
        except Exception as exc:
            traceback.print_exc()
            bench.report(name, target, f"failed ({type(exc).__name__}: {exc})")


if __name__ == "__main__":
    start = time.monotonic()
    status = main()
    print(f"took {time.monotonic() - start:.0f} s")
    sys.exit(status)
