"""What sets a run's "mode" beside a CPU-bound neighbour: placement, settings, process, time.

    python benchmarks/experiments/ab_modes.py [--cycles 20] [--variants auto,off,same0]

Each *run* is a fresh process (as a pytest run is one) that starts the plugin's tensor
server (``ServerProcess.start``, as the ``tensor_server`` fixture does), places client and
server as the variant says (through the plugin's own ``use_placement``/``pin_server``/
``measuring_cpus``), and measures the 1 KiB unary echo with the plugin's ``p2p_latency`` in
three *blocks* of ``--iterations`` (10 rounds each): block 1 and 2 on the same server
process (a new channel each), block 3 on a second server process started for it. So a run
says how far its blocks differ on one client/server pair (time only), after a new server
(server process), and the runs how far they differ between client processes.

Variants run interleaved in time (a seeded shuffle per cycle) while one CPU-bound Python loop
runs beside them the whole time (bounded; stopped at the end). For every run it records,
sampled every 20 ms from ``/proc/PID/task/*/stat`` (field 39, the CPU last run on, weighted
by the CPU time each thread used since the previous sample), the share of the client's and
the server's CPU time spent on the neighbour's CPU, and each side's thread migrations and
involuntary switches (``/proc/PID/task/*/sched``) over the run.

It prints per variant: the sd of log per-run p50 (block 1), the sd of the log ratio of
block 2 to block 1 and of block 3 to block 2 (within a run), and the correlation of the run's
p50 with the share of server/client CPU time on the neighbour's CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

VARIANTS: dict[str, dict[str, str]] = {
    # client CPUs : server CPUs ("" = unpinned), extra environment
    "auto": {"cpus": "0:1"},
    "off": {"cpus": ""},
    "same0": {"cpus": "0:0"},
    "same1": {"cpus": "1:1"},
    "norand": {"cpus": "0:1", "setarch": "1"},
    "srvw1": {"cpus": "0:1", "server_args": "--workers 1"},
    # EEVDF's per-task slice request (Linux 6.12+, sched_setattr's sched_runtime for
    # SCHED_OTHER): a short slice gives a waking thread an early deadline, so that it
    # preempts a CPU-bound neighbour rather than queueing behind its slice.
    "slice": {"cpus": "0:1", "slice_us": "100"},
    "sliceoff": {"cpus": "", "slice_us": "100"},
    # as auto, with the client idle 4 s between blocks 1 and 2 (same client, same server):
    # whether a mode lasts in time or with the process
    "gap": {"cpus": "0:1", "gap_s": "4"},
}


def set_slice(pid: int, slice_ns: int) -> int:
    """Ask EEVDF for a ``slice_ns`` slice for every thread of ``pid`` (nice kept); how many
    threads took it."""
    import ctypes

    class SchedAttr(ctypes.Structure):
        _fields_ = [
            ("size", ctypes.c_uint32),
            ("sched_policy", ctypes.c_uint32),
            ("sched_flags", ctypes.c_uint64),
            ("sched_nice", ctypes.c_int32),
            ("sched_priority", ctypes.c_uint32),
            ("sched_runtime", ctypes.c_uint64),
            ("sched_deadline", ctypes.c_uint64),
            ("sched_period", ctypes.c_uint64),
            ("sched_util_min", ctypes.c_uint32),
            ("sched_util_max", ctypes.c_uint32),
        ]

    libc = ctypes.CDLL(None, use_errno=True)
    done = 0
    for tid in map(int, os.listdir(f"/proc/{pid}/task")):
        try:
            nice = os.getpriority(os.PRIO_PROCESS, tid)
        except OSError:
            continue
        attr = SchedAttr(size=ctypes.sizeof(SchedAttr), sched_policy=0, sched_nice=nice)
        attr.sched_runtime = slice_ns
        if libc.syscall(314, tid, ctypes.byref(attr), 0) == 0:  # SYS_sched_setattr, x86-64
            done += 1
    return done


NEIGHBOUR_LIMIT_S = 1800


def child(variant: str, iterations: int) -> int:
    """One run: measure and print a JSON line of per-block round p50s and counters."""
    from pytest_tfgrpc.bench.p2p import LatencyCall, p2p_latency
    from pytest_tfgrpc.bench.timing import RunSpec
    from pytest_tfgrpc.roles.processes import ServerProcess
    from pytest_tfgrpc.tuning.cpus import (
        CpuPlacement,
        measuring_cpus,
        parse_cpu_list,
        pin_server,
        use_placement,
    )
    from pytest_tfgrpc.wire.fabric import resolve_fabric

    spec = VARIANTS[variant]
    if spec["cpus"]:
        c, s = spec["cpus"].split(":")
        use_placement(CpuPlacement(parse_cpu_list(c), parse_cpu_list(s)))
    fabric = resolve_fabric("lo")
    extra = spec.get("server_args", "").split()
    run = RunSpec(
        iterations=iterations, warmup=100, max_seconds=10.0, warmup_seconds=1.0, rounds=10
    )
    call = LatencyCall(run=run)
    blocks: list[list[float]] = []
    servers = []
    counters: dict[str, dict[str, int]] = {}
    try:
        for block in range(3):
            if block != 1:
                server = ServerProcess.start(fabric, extra_args=extra)
                pin_server(server.pid)
                servers.append(server)
                print(json.dumps({"server": server.pid}), flush=True)
            if block == 1 and spec.get("gap_s"):
                time.sleep(float(spec["gap_s"]))
            if spec.get("slice_us"):
                for pid in (os.getpid(), servers[-1].pid):
                    set_slice(pid, int(spec["slice_us"]) * 1000)
            with measuring_cpus():
                result = p2p_latency(servers[-1], [1024], call)
            (size,) = result.sizes
            blocks.append(list(size.round_figures()["p50"]))
        counters["client"] = _sched(os.getpid())
        counters["server1"] = _sched(servers[0].pid)
        counters["server2"] = _sched(servers[1].pid)
    finally:
        for server in servers:
            server.stop()
    print(json.dumps({"blocks": blocks, "counters": counters}), flush=True)
    return 0


def _sched(pid: int) -> dict[str, int]:
    got = {"nr_migrations": 0, "nr_involuntary_switches": 0, "nr_voluntary_switches": 0}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            text = Path(f"/proc/{pid}/task/{tid}/sched").read_text()
        except OSError:
            continue
        for line in text.splitlines():
            key, _, value = line.partition(":")
            key = key.strip().removeprefix("se.")
            if key in got:
                got[key] += int(float(value.strip()))
    return got


def _stat(pid: int) -> dict[int, tuple[int, int]]:
    """Per thread of ``pid``: (CPU time in ticks, CPU last run on)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            f = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(f[11]) + int(f[12]), int(f[36]))
    return out


class Sampler:
    """Where the client's, the servers' and the neighbour's CPU time goes, every 20 ms."""

    def __init__(self, client: int, neighbour: int) -> None:
        self.pids = {"client": client}
        self.neighbour = neighbour
        self.on_nb = {"client": 0, "server": 0}
        self.total = {"client": 0, "server": 0}
        self.nb_cpu: list[int] = []
        self.stop = threading.Event()
        self.last: dict[tuple[str, int], int] = {}
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while not self.stop.wait(0.02):
            nb = _stat(self.neighbour)
            if not nb:
                continue
            nb_cpu = next(iter(nb.values()))[1]
            self.nb_cpu.append(nb_cpu)
            for role, pid in list(self.pids.items()):
                side = "server" if role.startswith("server") else "client"
                for tid, (ticks, cpu) in _stat(pid).items():
                    used = ticks - self.last.get((role, tid), ticks)
                    self.last[(role, tid)] = ticks
                    self.total[side] += used
                    if cpu == nb_cpu:
                        self.on_nb[side] += used

    def done(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        share = {
            k: self.on_nb[k] / self.total[k] if self.total[k] else math.nan for k in self.total
        }
        nb0 = self.nb_cpu.count(0) / len(self.nb_cpu) if self.nb_cpu else math.nan
        return {"client_on_nb": share["client"], "server_on_nb": share["server"], "nb_on_cpu0": nb0}


def one_run(variant: str, iterations: int, neighbour: int) -> dict[str, object]:
    argv = [sys.executable, __file__, "--child", variant, "--iterations", str(iterations)]
    env = dict(os.environ)
    if VARIANTS[variant].get("setarch"):
        argv = ["setarch", "-R", *argv]
        env["PYTHONHASHSEED"] = "0"
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    sampler = Sampler(proc.pid, neighbour)
    out: dict[str, object] = {}
    assert proc.stdout is not None
    servers = 0
    for line in proc.stdout:
        got = json.loads(line)
        if "server" in got:
            servers += 1
            sampler.pids[f"server{servers}"] = got["server"]
        else:
            out.update(got)
    proc.wait(timeout=120)
    out.update(sampler.done())
    out["wall_s"] = time.monotonic() - started
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--variants", default="auto,off,same0")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--label", default="UNDER LOAD: other helpers ran tests beside it")
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.iterations)
    variants = args.variants.split(",")
    loop = (
        f"import time\nend = time.monotonic() + {NEIGHBOUR_LIMIT_S}\n"
        "while time.monotonic() < end:\n    sum(range(1000))\n"
    )
    neighbour = subprocess.Popen([sys.executable, "-c", loop])
    load = os.getloadavg()
    print(f"# ab_modes.py {' '.join(sys.argv[1:])}, {args.label}", flush=True)
    print(f"# load before (neighbour just started): {load}", flush=True)
    coin = random.Random(args.seed)
    found: dict[str, list[dict[str, object]]] = {v: [] for v in variants}
    try:
        for cycle in range(args.cycles):
            order = list(variants)
            coin.shuffle(order)
            for variant in order:
                run = one_run(variant, args.iterations, neighbour.pid)
                found[variant].append(run)
                blocks = run.get("blocks") or [[math.nan]] * 3
                meds = [statistics.median(b) / 1e3 for b in blocks]
                c = run.get("counters", {})
                print(
                    f"{cycle:2d} {variant:<7} p50 blocks {meds[0]:5.0f} {meds[1]:5.0f} "
                    f"{meds[2]:5.0f} us | client on nb {run['client_on_nb']:.2f} server on nb "
                    f"{run['server_on_nb']:.2f} nb@0 {run['nb_on_cpu0']:.2f} | migr c "
                    f"{c.get('client', {}).get('nr_migrations')} s "
                    f"{c.get('server1', {}).get('nr_migrations')} invol c "
                    f"{c.get('client', {}).get('nr_involuntary_switches')} s "
                    f"{c.get('server1', {}).get('nr_involuntary_switches')} | "
                    f"{run['wall_s']:.1f} s",
                    flush=True,
                )
    finally:
        neighbour.terminate()
        neighbour.wait(timeout=10)
        print(f"# load after (neighbour stopped): {os.getloadavg()}", flush=True)
    for variant, runs in found.items():
        ok = [r for r in runs if r.get("blocks")]
        med = [[math.log(statistics.median(b)) for b in r["blocks"]] for r in ok]  # type: ignore[union-attr]
        if len(med) < 3:
            continue
        b1 = [m[0] for m in med]
        runs_sd = statistics.stdev(b1)
        same = statistics.stdev([m[1] - m[0] for m in med]) / math.sqrt(2)
        new_server = statistics.stdev([m[2] - m[1] for m in med]) / math.sqrt(2)
        pair = statistics.stdev([b - a for a, b in zip(b1[::2], b1[1::2], strict=False)])
        rounds = statistics.median(
            statistics.stdev([math.log(x) for x in r["blocks"][0]])
            for r in ok  # type: ignore[index]
        )

        def corr(key: str, ok: list[dict[str, object]] = ok, b1: list[float] = b1) -> float:
            xs = [float(r[key]) for r in ok]  # type: ignore[arg-type]
            try:
                return statistics.correlation(xs, b1)
            except statistics.StatisticsError:
                return math.nan

        print(
            f"{variant:<7} {len(ok)} runs: geomean p50 "
            f"{math.exp(statistics.mean(b1)) / 1e3:.0f} us; "
            f"sd log per-run p50 {runs_sd:.1%} (pairs of runs {pair:.1%}); within a run: "
            f"block-to-block (same server) {same:.1%}, new server {new_server:.1%}, "
            f"rounds {rounds:.1%}; corr(p50, server on nb) {corr('server_on_nb'):+.2f}, "
            f"corr(p50, client on nb) {corr('client_on_nb'):+.2f}; median wall "
            f"{statistics.median(float(r['wall_s']) for r in ok):.1f} s",  # type: ignore[arg-type]
            flush=True,
        )
    if args.json:
        args.json.write_text(json.dumps(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
