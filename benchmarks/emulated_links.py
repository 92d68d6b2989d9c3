"""Rate-capped emulated links, measured through the node agents.

    python benchmarks/emulated_links.py [--seconds 6] [--size 16MiB] [--json out.json]

Needs root (it builds network namespaces). Two parts, each on a fresh emulated fabric whose
driver is this process, on the bridge:

1. **P2P bandwidth on capped links.** Hosts ``cap200`` (200 Mbit/s) and ``cap1g`` (1 Gbit/s);
   a tensor server is started on each through its agent and ``p2p_bandwidth`` (stream, raw)
   pushes ``--size`` tensors for ``--seconds``. The figure is the plugin's own throughput
   (payload bytes / summed per-tensor times), beside the cap and the bytes the host's link
   counted (``tbf`` shapes whole Ethernet frames, so payload runs a few percent under the cap:
   1448 payload bytes ride in a 1514-byte frame).
2. **A PS behind a slower link.** ``ps0`` and the workers ``w0``, ``w1`` on 1 Gbit/s links,
   ``ps1`` on 200 Mbit/s; ``ps_throughput`` with every worker calling every PS in its own
   closed loop, time-bound, so each PS's RPC count shows how fast its link let it go.

Each line says what was measured; nothing is asserted. The machine's load (``uptime``) is
printed before and after.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pytest_tfgrpc.bench.p2p import BandwidthCall, p2p_bandwidth
from pytest_tfgrpc.bench.ps import ps_throughput
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.hosts.agent_client import AgentClient
from pytest_tfgrpc.hosts.emulated import (
    HostAgent,
    can_build,
    emulated_fabric,
    parse_hosts,
    rate_bits_per_s,
)
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.units import parse_size
from pytest_tfgrpc.wire.fabric import resolve_fabric


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def p2p_part(token_file: str, token: str, size: int, seconds: float) -> list[dict[str, Any]]:
    rows = []
    with emulated_fabric(parse_hosts("cap200@200mbit,cap1g@1gbit")) as fabric:
        driver = resolve_fabric(fabric.bridge)
        for host in fabric.hosts:
            agent = HostAgent(host, token_file)
            try:
                with AgentClient(agent.target, token) as client:
                    server = ServerProcess.start(driver, launcher=client.launcher())
                    try:
                        run = RunSpec(
                            iterations=100_000,
                            warmup=3,
                            max_seconds=seconds,
                            warmup_seconds=5.0,
                            duration=seconds,
                        )
                        before = fabric.counters(host.name)
                        start = time.monotonic()
                        result = p2p_bandwidth(server, [size], BandwidthCall(run=run))
                        wall = time.monotonic() - start
                        after = fabric.counters(host.name)
                    finally:
                        server.stop()
            finally:
                agent.stop()
            point = result.sizes[0]
            cap = rate_bits_per_s(host.rate or "0bit")
            measured = point.throughput_Bps * 8
            rows.append(
                {
                    "host": host.name,
                    "address": host.address,
                    "target": result.target,
                    "cap_bit_s": cap,
                    "size_bytes": size,
                    "tensors": point.count,
                    "throughput_bit_s": measured,
                    "of_cap": measured / cap,
                    "link_bytes_received": after[0] - before[0],
                    "link_bit_s_over_run": (after[0] - before[0]) * 8 / wall,
                }
            )
    return rows


def ps_part(token_file: str, token: str, size: int, seconds: float) -> dict[str, Any]:
    hosts = parse_hosts("ps0,ps1@200mbit,w0,w1", "1gbit")
    with emulated_fabric(hosts) as fabric:
        driver = resolve_fabric(fabric.bridge)
        agents = {h.name: HostAgent(h, token_file) for h in fabric.hosts}
        clients = {name: AgentClient(a.target, token) for name, a in agents.items()}
        try:
            before = {h.name: fabric.counters(h.name) for h in fabric.hosts}
            with PSCluster(
                driver,
                Topology(ps=2, workers=2),
                ps_launchers=[clients["ps0"].launcher(), clients["ps1"].launcher()],
                worker_launchers=[clients["w0"].launcher(), clients["w1"].launcher()],
            ) as cluster:
                run = RunSpec(iterations=100_000, warmup=2, max_seconds=seconds, warmup_seconds=5.0)
                result = ps_throughput(cluster, [size], run=run)
            after = {h.name: fabric.counters(h.name) for h in fabric.hosts}
        finally:
            for client in clients.values():
                client.close()
            for agent in agents.values():
                agent.stop()
    point = result.sizes[0]
    elapsed_s = point.elapsed_ns / 1e9
    per_ps = [
        {
            "task": load.task,
            "host": f"ps{load.task}",
            "target": load.target,
            "link": next(h.rate for h in hosts if h.name == f"ps{load.task}"),
            "rpcs": load.rpcs,
            "bytes_in": load.bytes_in,
            "bit_s_in": load.bytes_in * 8 / elapsed_s,
            "link_bytes_received": after[f"ps{load.task}"][0] - before[f"ps{load.task}"][0],
        }
        for load in point.per_ps
    ]
    return {
        "size_bytes": size,
        "elapsed_s": elapsed_s,
        "rpc_rate_per_s": point.rate_per_s,
        "imbalance": point.imbalance,
        "per_ps": per_ps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measured time per part")
    parser.add_argument("--size", default="16MiB", help="tensor size (default 16MiB)")
    parser.add_argument("--ps-size", default="1MiB", help="PS payload per RPC (default 1MiB)")
    parser.add_argument("--json", help="write the figures here too")
    args = parser.parse_args()
    ok, why = can_build()
    if not ok:
        parser.error(why)
    load_before = uptime()
    with tempfile.TemporaryDirectory() as tmp:
        token = secrets.token_hex(24)
        token_file = Path(tmp) / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)  # the agents refuse a token others can read
        p2p = p2p_part(str(token_file), token, parse_size(args.size), args.seconds)
        ps = ps_part(str(token_file), token, parse_size(args.ps_size), args.seconds)
    load_after = uptime()
    print(f"load before: {load_before}")
    print("P2P bandwidth through the agents (stream, raw), driver on the bridge:")
    for row in p2p:
        print(
            f"  {row['host']:7} cap {row['cap_bit_s'] / 1e6:6.0f} Mbit/s:"
            f" {row['throughput_bit_s'] / 1e6:7.1f} Mbit/s payload ({row['of_cap']:.1%} of cap),"
            f" {row['tensors']} x {args.size}; link counted"
            f" {row['link_bit_s_over_run'] / 1e6:.1f} Mbit/s over the run"
        )
    print(f"PS cluster, 2 PS x 2 workers, {args.ps_size} per RPC, {ps['elapsed_s']:.1f} s:")
    for load in ps["per_ps"]:
        print(
            f"  ps{load['task']} ({load['link']:>7} link, {load['target']}):"
            f" {load['rpcs']:5d} RPCs,"
            f" {load['bit_s_in'] / 1e6:7.1f} Mbit/s in; its link received"
            f" {load['link_bytes_received'] / 1e6:.1f} MB"
        )
    slowest = min(ps["per_ps"], key=lambda load: load["rpcs"])
    print(f"  bottleneck: ps{slowest['task']} (fewest RPCs); imbalance {ps['imbalance']:.2f}")
    print(f"load after: {load_after}")
    if args.json:
        out = {"uptime_before": load_before, "uptime_after": load_after, "p2p": p2p, "ps": ps}
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
