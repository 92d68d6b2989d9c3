"""``tfgrpc-fabric``: build, list and remove emulated fabrics (hosts as network namespaces).

``tfgrpc-fabric up --hosts ps0,ps1@200mbit,w0,w1 --rate 1gbit --agents --token-file T`` builds
a fabric that stays until ``tfgrpc-fabric down NAME`` (or ``down --all``: every fabric you
built; ``down --all-owners``: everyone's); with ``--agents`` every host runs ``tfgrpc-node`` on
its interface at :data:`~pytest_tfgrpc.hosts.agent.DEFAULT_PORT`. ``status`` lists fabrics,
their owners, hosts, addresses, rates and the processes in each host, and says of an agent
that is not running how to start it again (``tfgrpc-fabric agent NAME HOST``).
``down`` with no names (also run before every ``up``) removes what dead owners left.
See :mod:`pytest_tfgrpc.hosts.emulated`.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import subprocess
import sys

from pytest_tfgrpc.hosts.agent import DEFAULT_PORT
from pytest_tfgrpc.hosts.emulated import (
    AGENT_MODULE,
    STATE_DIR,
    EmulatedFabric,
    EmulatedHost,
    FabricBuildError,
    agent_pids,
    build_fabric,
    caller_uid,
    can_build,
    list_fabrics,
    parse_hosts,
    remove_fabric,
    remove_leftovers,
    run_command,
)
from pytest_tfgrpc.units import format_size

PROG = "tfgrpc-fabric"


def _start_agent(fabric: EmulatedFabric, host: EmulatedHost) -> str:
    """Start ``tfgrpc-node`` in ``host`` on :data:`DEFAULT_PORT`, detached: it lives until
    ``tfgrpc-fabric down`` kills the host's processes. Its target once it serves."""
    argv = host.command(
        [sys.executable, "-m", AGENT_MODULE, "--fabric", host.iface, "--port",
         str(DEFAULT_PORT), "--token-file", fabric.agent_token_file, "--host-name", host.name,
         *(["--tf-python", fabric.agent_tf_python] if fabric.agent_tf_python else [])]
    )  # fmt: skip
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
        raise FabricBuildError(f"the agent on {host.name} exited with {proc.wait()}; see {log}")
    return str(json.loads(line)["target"])


def _up(args: argparse.Namespace) -> int:
    hosts = parse_hosts(args.hosts, args.rate)
    token_file = os.path.abspath(args.token_file) if args.agents else ""
    fabric = build_fabric(
        hosts,
        iface=args.iface,
        owner_pid=0,
        agent_token_file=token_file,
        agent_tf_python=os.path.abspath(args.tf_python) if args.tf_python else "",
    )
    agents = {}
    if args.agents:
        try:
            for host in fabric.hosts:
                agents[host.name] = _start_agent(fabric, host)
        except BaseException:
            remove_fabric(fabric, quiet=True)
            raise
    print(f"fabric {fabric.name}: driver {fabric.driver_address} on {fabric.bridge}")
    for host in fabric.hosts:
        where = f" agent {agents[host.name]}" if host.name in agents else ""
        rate = host.rate or "uncapped"
        print(f"  {host.name}: {host.address} ({host.iface} in {host.netns}, {rate}){where}")
    return 0


def _user(uid: int) -> str:
    if uid < 0:
        return "an unrecorded user"
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _down(args: argparse.Namespace) -> int:
    me = caller_uid()
    if args.all_owners:
        removed = remove_leftovers(everything=True)
    elif args.all:
        removed = remove_leftovers(everything=True, uid=me)
        others = [f for f in list_fabrics() if f.owner_uid != me]
        if others:
            owners = ", ".join(f"{f.name} of {_user(f.owner_uid)}" for f in others)
            print(f"kept other users' fabrics: {owners} (--all-owners removes them too)")
    elif args.names:
        known = {fabric.name: fabric for fabric in list_fabrics()}
        removed = []
        for name in args.names:
            if name not in known:
                print(f"{PROG}: no fabric {name!r} (see `{PROG} status`)")
                return 2
            remove_fabric(known[name])
            removed.append(name)
    else:
        removed = remove_leftovers()
    print("removed: " + (", ".join(removed) if removed else "nothing"))
    return 0


def _agent_state(fabric: EmulatedFabric, host: EmulatedHost) -> str:
    if not fabric.agent_token_file:
        return ""
    pids = agent_pids(host, fabric.timeout)
    if pids:
        return f", agent running (pid {pids[0]}, port {DEFAULT_PORT})"
    return f", agent NOT RUNNING: start it again with `{PROG} agent {fabric.name} {host.name}`"


def _status(args: argparse.Namespace) -> int:
    fabrics = list_fabrics()
    if not fabrics:
        print("no emulated fabrics")
    for fabric in fabrics:
        kept = f"owner pid {fabric.owner_pid}" if fabric.owner_pid else "kept until down"
        print(
            f"fabric {fabric.name}: driver {fabric.driver_address} on {fabric.bridge} "
            f"(built by {_user(fabric.owner_uid)}, {kept})"
        )
        for host in fabric.hosts:
            pids = run_command(["ip", "netns", "pids", host.netns], timeout=10, check=False)
            count = len(pids.stdout.split())
            rx, tx = fabric.counters(host.name) if host.link else (0, 0)
            print(
                f"  {host.name}: {host.address} {host.rate or 'uncapped'},"
                f" {count} process{'' if count == 1 else 'es'}, received {format_size(rx)},"
                f" sent {format_size(tx)}{_agent_state(fabric, host)}"
            )
    return 0


def _agent(args: argparse.Namespace) -> int:
    fabric = {f.name: f for f in list_fabrics()}.get(args.fabric)
    if fabric is None:
        print(f"{PROG}: no fabric {args.fabric!r} (see `{PROG} status`)")
        return 2
    if not fabric.agent_token_file:
        print(f"{PROG}: fabric {fabric.name} was built without --agents")
        return 2
    try:
        host = fabric.host(args.host)
    except KeyError as exc:
        print(f"{PROG}: {exc.args[0]}")
        return 2
    running = agent_pids(host, fabric.timeout)
    if running:
        print(f"{PROG}: the agent on {host.name} is running (pid {running[0]})")
        return 0
    print(f"  {host.name}: agent {_start_agent(fabric, host)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``tfgrpc-fabric``."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="build a fabric that stays until `down`")
    up.add_argument("--hosts", required=True, help="a count, or name[@rate],... (ps0,w0@200mbit)")
    up.add_argument("--rate", help="cap of every host's link without its own (e.g. 1gbit)")
    up.add_argument("--iface", default="fab0", help="interface name inside each host")
    up.add_argument("--agents", action="store_true", help="run tfgrpc-node in every host")
    up.add_argument("--token-file", help="the agents' shared token (with --agents)")
    up.add_argument(
        "--tf-python",
        metavar="PATH",
        help="the agents run TensorFlow's tasks with this python (with --agents; see tfgrpc-node)",
    )
    down = sub.add_parser("down", help="remove fabrics (default: those whose owner died)")
    down.add_argument("names", nargs="*", help="fabrics to remove (tfgf<k>)")
    down.add_argument("--all", action="store_true", help="remove every fabric you built")
    down.add_argument(
        "--all-owners",
        action="store_true",
        help="remove every emulated fabric on this host, other users' too",
    )
    sub.add_parser("status", help="list fabrics, their owners, hosts, processes and agents")
    agent = sub.add_parser("agent", help="start the agent of a host of an `up --agents` fabric")
    agent.add_argument("fabric", help="the fabric (tfgf<k>)")
    agent.add_argument("host", help="the host whose agent to start")
    args = parser.parse_args(argv)
    ok, why = can_build()
    if not ok:
        parser.error(why)
    if args.command == "up" and args.agents and not args.token_file:
        parser.error("--agents needs --token-file (the token the driver will send)")
    if args.command == "up" and args.tf_python:
        if not args.agents:
            parser.error("--tf-python goes with --agents (it is their TensorFlow Python)")
        if not (os.path.isfile(args.tf_python) and os.access(args.tf_python, os.X_OK)):
            parser.error(f"--tf-python {args.tf_python}: not an executable file")
    try:
        commands = {"up": _up, "down": _down, "status": _status, "agent": _agent}
        return commands[args.command](args)
    except (ValueError, FabricBuildError) as exc:
        parser.error(str(exc))
    return 2


if __name__ == "__main__":
    sys.exit(main())
