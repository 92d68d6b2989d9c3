"""The all-reduce model against measured all-reduces on this machine (docs/tasks/model.md,
"All-reduce among the workers").

    python benchmarks/allreduce_model.py [--workers 4] [--sizes 64KiB,1MiB,4MiB]
        [--algorithms ring,halving_doubling] [--iterations 20] [--repeat 3] [--fabric lo]
        [--emulated RATE [--tls]]

One cluster of ``--workers`` grpcio workers starts on the fabric (1 PS, idle); with
``--emulated 1gbit`` (root) each worker and the PS on an emulated host of its own instead,
its link capped at that rate, started through a node agent there (a token; with ``--tls``
mutual TLS as ``tests/test_allreduce_emulated.py`` runs it: a fresh CA (trustme, the ``dev``
extra) gives every host and the driver a certificate for its own address, and the agents,
the workers' channels and the driver's speak mutual TLS). For every
algorithm and pass, :func:`~pytest_tfgrpc.bench.allreduce.allreduce` measures every size
(check=True: every sum verified) with ``--rounds`` rounds of the model's inputs between the
sizes (each a two-rank ring on workers 0 and 1; the run's own ranks at a small size, which give
a step's fixed cost where they share cores; the other sessions' load), takes each input's
median over the rounds, and predicts each size. Each row: the measured p50, the prediction, its
error, which term limits it, its link and CPU parts (the CPU part with the whole-buffer term,
shown as ``whole``: copy-in and verification at the ranks' share, and the fixed part of each
step measured in place, shown as ``step``, with ``+-`` its rounds' spread: highest less lowest
in percent of the median), busbw, the load the probes found (their median, and lowest-highest),
the 1-minute load average, the error the same inputs give without the in-place step (each
step's fixed part the two-rank sweep's CPU at the ranks' share, the model without that term), a
rank's bytes per CPU second from the two-rank sweep (``cpu MB/s``, where encryption shows, with
its rounds' spread), a rank's CPU per all-reduce as the workers measured it (``rank cpu``)
beside the model's (``model``: the whole buffer, the in-place step's CPU and the pieces' bytes),
the cores the ranks kept busy, and the TLS the ranks reported for the inputs' channels. Then the
counts within +-25%, each input's spread across the repeats beside the measured p50s', and per
size the measured-over-model ratios of a rank's CPU and of the busy cores, whose quotient is the
time's. Nothing here asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import secrets
import statistics
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pytest_tfgrpc.bench.allreduce import (
    MODEL_ROUNDS,
    AllReduceCosts,
    allreduce,
    predict_allreduce,
)
from pytest_tfgrpc.bench.timing import RunSpec
from pytest_tfgrpc.model.analytic import relative_error
from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.model.scaling import allreduce_pieces
from pytest_tfgrpc.ps.ps_cluster import PSCluster
from pytest_tfgrpc.units import parse_sizes, size_label
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TlsFiles, child_env, load_tls, use_tls

if TYPE_CHECKING:
    from pytest_tfgrpc.hosts.emulated import EmulatedFabric

TOLERANCE = 25.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--sizes", default="64KiB,1MiB,4MiB")
    parser.add_argument("--algorithms", default="ring,halving_doubling")
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--rounds", type=int, default=MODEL_ROUNDS, help="rounds of the model's probes"
    )
    parser.add_argument("--fabric", default="lo")
    parser.add_argument("--emulated", metavar="RATE", help="emulated hosts, links at RATE")
    parser.add_argument("--tls", action="store_true", help="with --emulated: mutual TLS")
    args = parser.parse_args()
    if args.tls and args.emulated is None:
        parser.error("--tls: only with --emulated RATE (the hosts' agents issue the certificates)")
    sizes = [int(s) for s in parse_sizes(args.sizes)]
    run = RunSpec(iterations=args.iterations, warmup=3, max_seconds=10.0, warmup_seconds=5.0)
    header = (
        f"{'algorithm':<17} {'size':>6} {'measured':>9} {'model':>9} {'error':>7} {'limit':>5} "
        f"{'link':>8} {'cpu':>8} {'whole':>7} {'step':>7} {'+-':>4} {'busbw':>10} "
        f"{'load':>5} {'lo-hi':>9} {'loadavg':>7} {'w/o step':>8} {'cpu MB/s':>8} {'+-':>4} "
        f"{'rank cpu':>8} {'model':>7} {'busy':>5} {'inputs':>6}"
    )
    print(f"TLS: {'mtls' if args.tls else 'off'} (each row's inputs: the ranks' own report)")
    print(
        f"model inputs: medians of {args.rounds} rounds of probes, spread among the sizes "
        "(after each); +-: the rounds' spread (highest less lowest, % of the median)"
    )
    print(f"{os.uname().nodename}: load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(header)
    errors, without_step = [], []
    repeats: dict[str, list[AllReduceCosts]] = {}
    # per (algorithm, size): (measured / model) of a rank's CPU and of the cores kept busy
    ratios: dict[tuple[str, int], list[tuple[float, float]]] = {}
    measured: dict[tuple[str, int], list[float]] = {}
    with contextlib.ExitStack() as stack:
        cluster = stack.enter_context(
            cluster_of(stack, args.workers, args.fabric, args.emulated, tls=args.tls)
        )
        for algorithm in args.algorithms.split(","):
            for _ in range(args.repeat):
                result = allreduce(
                    cluster, sizes, run=run, algorithm=algorithm, check=True,
                    model_rounds=args.rounds,
                )  # fmt: skip
                for point, prediction in zip(result.sizes, result.predictions, strict=True):
                    assert prediction is not None
                    costs = prediction.costs
                    model = dict(prediction.figures(point.summary.p50_ns / 1e9))
                    busbw = next(f.value for f in point.figures() if f.metric.name == "busbw")
                    error = float(model["error_pct"])
                    whole = costs.whole_byte_s * point.size_bytes / prediction.rate
                    step = costs.step_s or 0.0
                    errors.append(error)
                    alone = predict_allreduce(
                        replace(costs, step_s=None), point.size_bytes, result.ranks, algorithm
                    )
                    measured_s = point.summary.p50_ns / 1e9
                    measured.setdefault((algorithm, point.size_bytes), []).append(measured_s)
                    without_step.append(100 * relative_error(alone.step_s, measured_s))
                    cpu = point.cpu["workers"]
                    rank_cpu = (cpu.user_ns + cpu.system_ns) / 1e9 / result.ranks / point.count
                    rank_model = model_rank_cpu(costs, point.size_bytes, result.ranks, algorithm)
                    load = costs.spread("load")
                    busy = result.ranks * rank_cpu / measured_s
                    busy_model = result.ranks * rank_model / prediction.step_s
                    ratios.setdefault((algorithm, point.size_bytes), []).append(
                        (rank_cpu / rank_model, busy / busy_model)
                    )
                    print(
                        f"{algorithm:<17} {size_label(point.size_bytes):>6} "
                        f"{measured_s * 1e3:>7.2f}ms {prediction.step_s * 1e3:>7.2f}ms "
                        f"{error:>+6.0f}% {model['limit']:>5} {prediction.link_s * 1e3:>6.2f}ms "
                        f"{prediction.host_s * 1e3:>6.2f}ms {whole * 1e3:>5.2f}ms "
                        f"{step * 1e3:>5.2f}ms {spread_pct(costs, 'step_s'):>4} "
                        f"{busbw / 1e6:>6.1f}MB/s {costs.load:>5.2f} "
                        f"{f'{load.low:.2f}-{load.high:.2f}' if load else '-':>9} "
                        f"{os.getloadavg()[0]:>7.2f} "
                        f"{without_step[-1]:>+7.0f}% {float(model['cpu_MBps']):>8.1f} "
                        f"{spread_pct(costs, 'byte_s'):>4} {rank_cpu * 1e3:>6.2f}ms "
                        f"{rank_model * 1e3:>5.2f}ms "
                        f"{busy:>5.2f} "
                        f"{model['inputs_tls']:>6}"
                    )
                repeats.setdefault(algorithm, []).append(costs)
    for name, found in (("", errors), ("without the in-place step: ", without_step)):
        within = sum(abs(e) <= TOLERANCE for e in found)
        print(
            f"{'' if name else chr(10)}{name}{within} of {len(found)} predictions within "
            f"+-{TOLERANCE:g}% (median error {statistics.median(found):+.0f}%)"
        )
    print(
        "\nacross repeats, highest less lowest in % of the median (the inputs; the measured p50s):"
    )
    for algorithm, costs_seen in repeats.items():
        inputs = {
            "step": [c.step_s or 0.0 for c in costs_seen],
            "cpu MB/s": [1 / c.cpu.byte_s if c.cpu.byte_s > 0 else math.inf for c in costs_seen],
            "cpu/step": [c.cpu.rpc_s for c in costs_seen],
        }
        loads = [c.load for c in costs_seen]
        sizes_seen = sorted(n for a, n in measured if a == algorithm)
        print(
            f"{algorithm:<17} "
            + " ".join(f"{name} {relative_range(values):.0f}%" for name, values in inputs.items())
            + f" load {min(loads):.2f}-{max(loads):.2f}; measured "
            + " ".join(
                f"{size_label(n)} {relative_range(measured[algorithm, n]):.0f}%" for n in sizes_seen
            )
        )
    print(
        "\nmeasured / model, medians over repeats: the all-reduce's time is a rank's CPU times "
        "the ranks over the cores they kept busy, so its ratio is the CPU's over the busy cores'"
    )
    for (algorithm, nbytes), pairs in ratios.items():
        cpu_ratio = statistics.median(c for c, _ in pairs)
        busy_ratio = statistics.median(b for _, b in pairs)
        print(
            f"{algorithm:<17} {size_label(nbytes):>6}: a rank's CPU x{cpu_ratio:.2f}, "
            f"cores busy x{busy_ratio:.2f}, time x{cpu_ratio / busy_ratio:.2f}"
        )


def spread_pct(costs: AllReduceCosts, name: str) -> str:
    """The rounds' spread of input ``name`` in percent of its median, or ``-``."""
    spread = costs.spread(name)
    return f"{100 * spread.relative:.0f}%" if spread is not None else "-"


def relative_range(values: list[float]) -> float:
    """Highest less lowest of ``values``, in percent of their median (0 for one value)."""
    median = statistics.median(values)
    return 100 * (max(values) - min(values)) / median if median else 0.0


def model_rank_cpu(costs: AllReduceCosts, nbytes: int, ranks: int, algorithm: str) -> float:
    """A rank's CPU seconds per all-reduce as the model's inputs give it: the whole buffer,
    and at each step the in-place step's CPU (``step_cpu_s``; else ``rpc_s``) and its piece's
    bytes, sent and taken, at ``byte_s``; beside the ranks' own CPU (``rank cpu``)."""
    fixed = costs.step_cpu_s if costs.step_cpu_s is not None else costs.cpu.rpc_s
    pieces = allreduce_pieces(nbytes, ranks, algorithm)
    return costs.whole_byte_s * nbytes + sum(fixed + 2 * n * costs.cpu.byte_s for n in pieces)


def cluster_of(
    stack: contextlib.ExitStack,
    workers: int,
    fabric: str,
    emulated: str | None,
    *,
    tls: bool = False,
) -> PSCluster:
    """The cluster: on ``fabric`` here, or each task on an emulated host of its own, links
    at ``emulated``, through an agent in each (removed when ``stack`` closes); with ``tls``
    every host and this process under mutual TLS from one fresh CA."""
    topology = Topology(ps=1, workers=workers)
    if emulated is None:
        return PSCluster(resolve_fabric(fabric), topology)
    from pytest_tfgrpc.hosts.agent_client import AgentClient, AgentTLS
    from pytest_tfgrpc.hosts.emulated import HostAgent, can_build, emulated_fabric, parse_hosts

    ok, why = can_build()
    if not ok:
        raise SystemExit(f"--emulated {emulated}: emulated hosts cannot be built here: {why}")
    names = ",".join(["ps0", *(f"w{i}" for i in range(workers))])
    hosts = stack.enter_context(emulated_fabric(parse_hosts(names, emulated)))
    token = secrets.token_hex(24)
    token_file = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    pki = tls_files(hosts, token_file.parent) if tls else {}
    agent_tls = None
    if tls:
        driver = pki["_driver"]
        use_tls(load_tls(driver))
        stack.callback(use_tls, None)
        agent_tls = AgentTLS.from_files(str(driver.ca), driver.cert, driver.key)
    launchers = []
    for host in hosts.hosts:
        own = pki.get(host.name)
        extra = [f"--tls-{k}={getattr(own, k)}" for k in ("cert", "key", "ca")] if own else []
        agent = HostAgent(host, str(token_file), extra_args=extra)
        stack.callback(agent.stop)
        client = AgentClient(agent.target, token, tls=agent_tls)
        stack.callback(client.close)
        launchers.append(client.launcher())
    return PSCluster(
        resolve_fabric(hosts.bridge),
        topology,
        env=child_env(),  # the run's TLS files: the agents start TLS roles with their own
        ps_launchers=launchers[:1],
        worker_launchers=launchers[1:],
    )


def tls_files(hosts: EmulatedFabric, where: Path) -> dict[str, TlsFiles]:
    """A fresh CA in ``where`` and a certificate for each host's address and this driver's
    (``_driver``), as ``tests/test_allreduce_emulated.py``'s hosts get them."""
    from pytest_tfgrpc.hosts.emulated import issue_certificates

    try:
        return issue_certificates(hosts, where)
    except ImportError:
        raise SystemExit("--tls needs trustme (the dev extra: pip install -e '.[dev]')") from None


if __name__ == "__main__":
    main()
