"""The analytic model against measured sync-SGD steps on this machine (the
model's +-25% check, docs/tasks/model.md).

    python benchmarks/model_inrun.py [--profile hep_cnn] [--scale 1] [--workers 1,2,3,4]
        [--ps 1,2] [--sharding greedy] [--iterations 20] [--fabric lo] [--repeat 1]
        [--hosts ps0,ps1@200mbit,w0,w1 --rate 1gbit] [--json out.json]

For every (PS, workers) a fresh cluster starts on the fabric; ``sync_sgd_step(model=True)``
fits the link and host on PS 0 and worker 0 (2-4 s: P2P sweep, the step's exchange at four
generic shard layouts, numpy costs, the other sessions' load) and predicts the step from that
fit alone, then measures the steps. The table shows the prediction, the measured step p50,
the error, which term of the model limits the step, the other sessions' load the probes
found, the prediction and its error without that load (as if the cluster had the machine
alone), and the 1-minute load average (the machine is shared: other processes' load changes
what the cluster gets).

``--hosts`` runs the cluster on emulated hosts instead (root: network namespaces joined by
veth links on a bridge, ``tbf``-capped at ``--rate`` or a host's own ``@rate``; the syntax of
``tfgrpc-fabric up --hosts``), every role started by its host's node agent and the driver on
the bridge: the PS tasks on the hosts named ``ps*``, the workers on ``w*`` (one topology,
their counts; ``--ps`` and ``--workers`` are not used). One PS behind a slower link is the
model's check that it fits each PS task's own link (docs/tasks/model.md).

Nothing here asserts: the rows and the count within +-25% are printed. With ``--repeat N``
every topology is run N times, each with a fit of its own, and a second table puts the median
prediction beside the median measured step, with the range of the passes' errors: on a shared
machine one pass's fit or steps can meet a burst of other work.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from pytest_tfgrpc.bench.ps import sync_sgd_step
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.hosts.agent_client import AgentClient
from pytest_tfgrpc.hosts.emulated import (
    HostAgent,
    HostSpec,
    can_build,
    emulated_fabric,
    parse_hosts,
)
from pytest_tfgrpc.model.analytic import predict_step
from pytest_tfgrpc.model.placement import SHARDINGS, Topology
from pytest_tfgrpc.model.profiles import load_profile
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.roles.processes import Launcher
from pytest_tfgrpc.wire.fabric import resolve_fabric

TOLERANCE = 0.25


@dataclass(frozen=True)
class Row:
    ps: int
    workers: int
    predicted_ms: float
    measured_p50_ms: float
    error_pct: float
    limit: str
    cores: float | None
    utilization: float
    other_load: float
    predicted_idle_ms: float
    error_idle_pct: float
    chain_ms: float
    shared_ms: float
    link_ms: float
    steps: int
    load_1min: float
    host: str


def _counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(item) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 1,2,4") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: counts must be at least 1")
    return counts


@dataclass(frozen=True)
class Hosts:
    """Emulated hosts the cluster runs on: the driver's fabric (the bridge) and each role's
    launcher (its host's node agent), PS tasks in order, then workers."""

    fabric: str
    ps: tuple[Launcher, ...]
    workers: tuple[Launcher, ...]


def _roles(hosts: Sequence[HostSpec]) -> dict[str, list[HostSpec]]:
    """The PS hosts (``ps*``) and the worker hosts (``w*``), each in name order; ValueError
    for a host that is neither, or a role without a host."""
    others = [h.name for h in hosts if not h.name.startswith(("ps", "w"))]
    if others:
        raise ValueError(f"{', '.join(others)}: neither a PS host (ps*) nor a worker host (w*)")
    roles = {
        role: sorted((h for h in hosts if h.name.startswith(prefix)), key=lambda h: h.name)
        for role, prefix in (("ps", "ps"), ("workers", "w"))
    }
    if not roles["ps"] or not roles["workers"]:
        raise ValueError("name PS hosts ps* and worker hosts w*")
    return roles


@contextmanager
def emulated_hosts(hosts: Sequence[HostSpec]) -> Iterator[Hosts]:
    """``hosts`` built for the block (PS tasks on ``ps*``, workers on ``w*``), with a node
    agent each (one fresh token), removed however it ends."""
    roles = _roles(hosts)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        token = secrets.token_hex(24)
        token_file = Path(tmp) / "token"
        token_file.write_text(token + "\n")
        token_file.chmod(0o600)  # the agents refuse a token others can read
        fabric = stack.enter_context(emulated_fabric(hosts))
        launchers = {}
        for host in fabric.hosts:
            agent = HostAgent(host, str(token_file))
            stack.callback(agent.stop)
            client = stack.enter_context(AgentClient(agent.target, token))
            launchers[host.name] = client.launcher()
        yield Hosts(
            fabric.bridge,
            tuple(launchers[h.name] for h in roles["ps"]),
            tuple(launchers[h.name] for h in roles["workers"]),
        )


def _row(ps: int, workers: int, args: argparse.Namespace, hosts: Hosts | None = None) -> Row:
    profile = load_profile(args.profile)
    if args.scale != 1.0:
        profile = profile.scaled(scale=args.scale)
    run = RunSpec(
        iterations=args.iterations, warmup=3, max_seconds=args.max_seconds, warmup_seconds=10.0
    )
    topology = Topology(ps, workers, args.sharding)
    if hosts is None:
        cluster = PSCluster(resolve_fabric(args.fabric), topology)
    else:
        cluster = PSCluster(
            resolve_fabric(hosts.fabric),
            topology,
            ps_launchers=list(hosts.ps),
            worker_launchers=list(hosts.workers),
        )
    with cluster:
        result = sync_sgd_step(cluster, profile, run=run, model=True)
    prediction = result.prediction
    assert prediction is not None and prediction.host is not None  # model=True
    point = result.sizes[0]
    measured = point.summary.p50_ns / 1e6
    predicted = prediction.iter_s * 1e3
    idle = predict_step(
        profile,
        prediction.topology,
        prediction.link,
        host=replace(prediction.host, load=0.0),
        ps_links=prediction.ps_links,  # each PS task's own link, as the prediction had
        chunk_bytes=int(result.settings["chunk_bytes"]),
        partition_bytes=int(result.settings["partition_bytes"]),
    )
    return Row(
        ps=ps,
        workers=workers,
        predicted_ms=predicted,
        measured_p50_ms=measured,
        error_pct=100 * (predicted - measured) / measured,
        limit=prediction.limit,
        cores=prediction.host.cores,
        utilization=prediction.utilization,
        other_load=prediction.host.load,
        predicted_idle_ms=idle.iter_s * 1e3,
        error_idle_pct=100 * (idle.iter_s * 1e3 - measured) / measured,
        chain_ms=prediction.chain_s * 1e3,
        shared_ms=prediction.shared_s * 1e3,
        link_ms=prediction.link_s * 1e3,
        steps=point.count,
        load_1min=os.getloadavg()[0],
        host=prediction.host.describe(),
    )


def _table(rows: Sequence[Row]) -> str:
    header = (
        *("workers", "ps", "predicted", "measured p50", "error", "limit", "others"),
        *("busy", "if alone", "error", "loadavg"),
    )
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        lines.append(
            (
                str(r.workers),
                str(r.ps),
                f"{r.predicted_ms:.1f} ms",
                f"{r.measured_p50_ms:.1f} ms",
                f"{r.error_pct:+.0f}%",
                r.limit,
                f"{r.other_load:.1f}",
                f"{r.utilization:.0%}",
                f"{r.predicted_idle_ms:.1f} ms",
                f"{r.error_idle_pct:+.0f}%",
                f"{r.load_1min:.2f}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    )


def _medians(rows: Sequence[Row]) -> tuple[str, int, int]:
    """Per topology over the passes: the median prediction against the median measured step,
    and the range of the passes' errors; the table, the topologies within tolerance, and how
    many topologies there are."""
    by_topology: dict[tuple[int, int], list[Row]] = {}
    for r in rows:
        by_topology.setdefault((r.workers, r.ps), []).append(r)
    header = ("workers", "ps", "passes", "median predicted", "median measured", "error", "range")
    lines: list[tuple[str, ...]] = [header]
    within = 0
    for (workers, ps), same in sorted(by_topology.items(), key=lambda item: item[0][::-1]):
        predicted = statistics.median(r.predicted_ms for r in same)
        measured = statistics.median(r.measured_p50_ms for r in same)
        error = 100 * (predicted - measured) / measured
        within += abs(error) <= 100 * TOLERANCE
        errors = [r.error_pct for r in same]
        lines.append(
            (
                str(workers),
                str(ps),
                str(len(same)),
                f"{predicted:.1f} ms",
                f"{measured:.1f} ms",
                f"{error:+.0f}%",
                f"{min(errors):+.0f}% .. {max(errors):+.0f}%",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    table = "\n".join(
        "  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=True)) for line in lines
    )
    return table, within, len(by_topology)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--profile", default="hep_cnn")
    p.add_argument("--scale", type=float, default=1.0, help="shrink every tensor to this share")
    p.add_argument("--workers", type=_counts, default=(1, 2, 3, 4))
    p.add_argument("--ps", type=_counts, default=(1, 2))
    p.add_argument("--sharding", choices=SHARDINGS, default="greedy")
    p.add_argument("--iterations", type=int, default=20, help="measured steps (at most)")
    p.add_argument("--max-seconds", type=float, default=10.0, help="measured time, at most")
    p.add_argument("--fabric", default="lo")
    p.add_argument("--repeat", type=int, default=1, help="passes over the grid")
    p.add_argument("--hosts", help="emulated hosts, e.g. ps0,ps1@200mbit,w0,w1 (root)")
    p.add_argument("--rate", help="the emulated hosts' link rate where a host names none")
    p.add_argument("--json", help="also write the rows and load averages here")
    args = p.parse_args(argv)
    try:
        RunSpec(
            iterations=args.iterations, warmup=3, max_seconds=args.max_seconds, warmup_seconds=10.0
        )
    except ValueError as error:
        p.error(str(error))
    specs: tuple[HostSpec, ...] = ()
    if args.hosts is not None:
        try:
            specs = parse_hosts(args.hosts, args.rate)
            _roles(specs)
        except ValueError as error:
            p.error(f"--hosts {args.hosts!r}: {error}")
        ok, why = can_build()
        if not ok:
            p.error(f"--hosts: {why}")
    elif args.rate is not None:
        p.error("--rate: the emulated hosts' rate, only with --hosts")
    load_start = os.getloadavg()
    started = time.perf_counter()
    rows = []
    with ExitStack() as stack:
        hosts = stack.enter_context(emulated_hosts(specs)) if specs else None
        grid = (
            [(len(hosts.ps), len(hosts.workers))]
            if hosts
            else [(ps, workers) for ps in args.ps for workers in args.workers]
        )
        if hosts is not None:
            args.fabric = f"emulated {args.hosts}" + (f" at {args.rate}" if args.rate else "")
        for _ in range(max(1, args.repeat)):
            for ps, workers in grid:
                rows.append(_row(ps, workers, args, hosts))
                print(_table(rows).splitlines()[-1], file=sys.stderr, flush=True)
    load_end = os.getloadavg()
    within = sum(abs(r.error_pct) <= 100 * TOLERANCE for r in rows)
    within_idle = sum(abs(r.error_idle_pct) <= 100 * TOLERANCE for r in rows)
    print(
        f"{args.profile} (scale {args.scale:g}), sharding {args.sharding}, fabric {args.fabric}, "
        f"{os.cpu_count()} CPUs; load average (1, 5, 15 min) "
        f"{' '.join(f'{x:.2f}' for x in load_start)} at start, "
        f"{' '.join(f'{x:.2f}' for x in load_end)} at end; "
        f"{time.perf_counter() - started:.0f} s\n"
    )
    print(_table(rows))
    print(
        f"\n{within} of {len(rows)} rows within +-{TOLERANCE:.0%}; "
        f"{within_idle} if the other sessions' load is left out"
    )
    if args.repeat > 1:
        table, close, topologies = _medians(rows)
        print(f"\nover the {args.repeat} passes, per topology:\n\n{table}")
        print(f"\n{close} of {topologies} topologies within +-{TOLERANCE:.0%} by their medians")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(
                {
                    "profile": args.profile,
                    "scale": args.scale,
                    "sharding": args.sharding,
                    "fabric": args.fabric,
                    "cpus": os.cpu_count(),
                    "loadavg": [load_start, load_end],
                    "rows": [asdict(r) for r in rows],
                },
                out,
                indent=2,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
