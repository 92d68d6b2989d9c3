"""``tfgrpc-fabric``: build, list and remove emulated fabrics (hosts as network namespaces).

``tfgrpc-fabric up --hosts ps0,ps1@200mbit,w0,w1 --rate 1gbit --agents --token-file T`` builds
a fabric that stays until ``tfgrpc-fabric down NAME`` (or ``down --all``); with ``--agents``
every host runs ``tfgrpc-node`` on its interface at :data:`~pytest_tfgrpc.hosts.agent.
DEFAULT_PORT`. ``status`` lists fabrics, hosts, addresses, rates and the processes in each
host. ``down --stale`` (also run before every ``up``) removes what dead owners left.
See :mod:`pytest_tfgrpc.hosts.emulated`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from pytest_tfgrpc.hosts.agent import DEFAULT_PORT
from pytest_tfgrpc.hosts.emulated import (
    STATE_DIR,
    FabricBuildError,
    build_fabric,
    can_build,
    list_fabrics,
    parse_hosts,
    remove_fabric,
    remove_leftovers,
    run_command,
)


def _up(args: argparse.Namespace) -> int:
    hosts = parse_hosts(args.hosts, args.rate)
    fabric = build_fabric(hosts, iface=args.iface, owner_pid=0)
    agents = {}
    if args.agents:
        try:
            for host in fabric.hosts:
                argv = host.command(
                    [sys.executable, "-m", "pytest_tfgrpc.hosts.agent", "--fabric", host.iface,
                     "--port", str(DEFAULT_PORT), "--token-file", args.token_file,
                     "--host-name", host.name]
                )  # fmt: skip
                # Detached: it lives until `tfgrpc-fabric down` kills the host's processes.
                log = STATE_DIR / f"{host.netns}.log"
                with open(log, "ab") as stderr:
                    proc = subprocess.Popen(
                        argv,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=stderr,
                        start_new_session=True,
                    )
                assert proc.stdout is not None
                line = proc.stdout.readline()
                proc.stdout.close()
                if not line:
                    raise FabricBuildError(
                        f"the agent on {host.name} exited with {proc.wait()}; see {log}"
                    )
                agents[host.name] = json.loads(line)["target"]
        except BaseException:
            remove_fabric(fabric, quiet=True)
            raise
    print(f"fabric {fabric.name}: driver {fabric.driver_address} on {fabric.bridge}")
    for host in fabric.hosts:
        where = f" agent {agents[host.name]}" if host.name in agents else ""
        rate = host.rate or "uncapped"
        print(f"  {host.name}: {host.address} ({host.iface} in {host.netns}, {rate}){where}")
    return 0


def _down(args: argparse.Namespace) -> int:
    if args.all:
        removed = remove_leftovers(everything=True)
    elif args.names:
        known = {fabric.name: fabric for fabric in list_fabrics()}
        removed = []
        for name in args.names:
            if name not in known:
                print(f"tfgrpc-fabric: no fabric {name!r} (see `tfgrpc-fabric status`)")
                return 2
            remove_fabric(known[name])
            removed.append(name)
    else:
        removed = remove_leftovers()
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return 0


def _status(args: argparse.Namespace) -> int:
    fabrics = list_fabrics()
    if not fabrics:
        print("no emulated fabrics")
    for fabric in fabrics:
        owner = f"owner pid {fabric.owner_pid}" if fabric.owner_pid else "kept until down"
        print(f"fabric {fabric.name}: driver {fabric.driver_address} on {fabric.bridge} ({owner})")
        for host in fabric.hosts:
            pids = run_command(["ip", "netns", "pids", host.netns], timeout=10, check=False)
            count = len(pids.stdout.split())
            rx, tx = fabric.counters(host.name) if host.link else (0, 0)
            print(
                f"  {host.name}: {host.address} {host.rate or 'uncapped'},"
                f" {count} processes, received {rx} B, sent {tx} B"
            )
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tfgrpc-fabric``."""
    parser = argparse.ArgumentParser(prog="tfgrpc-fabric", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build a fabric that stays until `down`")
    up.add_argument("--hosts", required=True, help="a count, or name[@rate],... (ps0,w0@200mbit)")
    up.add_argument("--rate", help="cap of every host's link without its own (e.g. 1gbit)")
    up.add_argument("--iface", default="fab0", help="interface name inside each host")
    up.add_argument("--agents", action="store_true", help="run tfgrpc-node in every host")
    up.add_argument("--token-file", help="the agents' shared token (with --agents)")
    down = sub.add_parser("down", help="remove fabrics (default: those whose owner died)")
    down.add_argument("names", nargs="*", help="fabrics to remove (tfgf<k>)")
    down.add_argument("--all", action="store_true", help="remove every emulated fabric")
    sub.add_parser("status", help="list fabrics, hosts and their processes")
    args = parser.parse_args(argv)
    ok, why = can_build()
    if not ok:
        parser.error(why)
    if args.command == "up" and args.agents and not args.token_file:
        parser.error("--agents needs --token-file (the token the driver will send)")
    try:
        return {"up": _up, "down": _down, "status": _status}[args.command](args)
    except (ValueError, FabricBuildError) as exc:
        parser.error(str(exc))
    return 2


if __name__ == "__main__":
    sys.exit(main())
