"""A tensor server's 1 KiB echo latency while a stranger attacks it over HTTP/2.

A Python tensor server (``tfgrpc-server --fabric lo``, as the plugin starts it) is measured by a
gRPC client doing 1 KiB raw echoes, one at a time, each with a 2 s deadline, in three phases:

* ``quiet``: nobody else;
Each phase warms its channel up with 50 echoes before the stranger starts.

* ``idle-streams``: a stranger (no token, no TLS needed: the tensor service is open) opens
  ``--idle`` streams of ``Echo`` over ``--connections`` connections, sends their headers and
  nothing more, and holds them open through the phase (which lasts the server's idle bound
  longer: echoes fail until the server cancels the idle streams); once the stranger has gone,
  ``--after`` more echoes on the client's SAME connection (the one whose calls expired
  queued behind the idle streams) say whether it is answered again;
* ``rapid-reset``: a stranger opens streams and resets each at once (HTTP/2 RST_STREAM,
  CVE-2023-44487), as fast as one thread can, on one connection.

Every phase is bounded in count (``--calls`` echoes and as many failures, ``--resets``
streams) and in time (``--seconds``); after a failed echo the next waits 50 ms, so that a server
that refuses at once cannot use a phase's calls up before the stranger is gone. Traffic goes to
loopback only. The stranger (``tests/stranger.py``) speaks raw HTTP/2 with the ``h2`` library
(``pip install h2``). Each phase reports the echoes' count, failures (deadline or refusal) by
status code, p50, p99 and max, and what the stranger did.

    python benchmarks/stranger_streams.py --out benchmarks/results/stranger_streams.txt  # ~2 min
    python benchmarks/stranger_streams.py --phases quiet,rapid-reset   # without the 60 s idle phase
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import os
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from pytest_tfgrpc.roles.idle import IDLE_STREAM_S
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.wire import grpc_settings
from pytest_tfgrpc.wire.fabric import resolve_fabric

ECHO = grpc_settings.method("raw", "Echo")
ROOT = Path(__file__).resolve().parent.parent
#: tfgrpc-server's default handler threads.
THREADS = 16
PHASES = ("quiet", "idle-streams", "rapid-reset")


def _stranger():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("stranger", ROOT / "tests" / "stranger.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stream_options() -> str:
    """The server options that bound streams, as this tree sets them."""
    bounds = [f"{k}={v}" for k, v in grpc_settings.SERVER_OPTIONS if "stream" in k]
    return ", ".join(bounds) or "no stream bound"


def warm_up(channel: grpc.Channel) -> None:
    """50 echoes on ``channel`` before the stranger starts (its connection made)."""
    for _ in range(50):
        channel.unary_unary(ECHO)(bytes(1024), timeout=2)


#: After a failed echo, the next waits this long: a server that refuses at once would
#: otherwise use the phase's whole budget of calls in a moment, before the stranger is gone.
RETRY_PAUSE_S = 0.05


def measure(channel: grpc.Channel, calls: int, seconds: float) -> dict[str, Any]:
    """``calls`` 1 KiB echoes within ``seconds`` (at most ``calls`` failures too), every one
    counted: latency figures of the answered ones, the failures and their status codes."""
    payload = bytes(1024)
    samples: list[int] = []
    failures: collections.Counter[str] = collections.Counter()
    echo = channel.unary_unary(ECHO)
    deadline = time.monotonic() + seconds
    while len(samples) < calls and failures.total() < calls and time.monotonic() < deadline:
        start = time.perf_counter_ns()
        try:
            echo(payload, timeout=2)
        except grpc.RpcError as error:
            failures[error.code().name] += 1  # type: ignore[attr-defined]
            time.sleep(RETRY_PAUSE_S)
            continue
        samples.append(time.perf_counter_ns() - start)
    ns = np.array(samples or [0], dtype=np.float64)
    return {
        "echoes": len(samples),
        "failures": failures.total(),
        "codes": dict(failures),
        "p50_us": float(np.percentile(ns, 50)) / 1e3,
        "p99_us": float(np.percentile(ns, 99)) / 1e3,
        "max_us": float(ns.max()) / 1e3,
    }


def answered_after(channel: grpc.Channel, calls: int) -> str:
    """``calls`` echoes on ``channel`` once the stranger has gone: how many were answered,
    and the status codes of the others (``answered 20 of 20`` or ``answered 0 of 20
    {'UNAVAILABLE': 20}``)."""
    echo = channel.unary_unary(ECHO)
    failed: collections.Counter[str] = collections.Counter()
    for _ in range(calls):
        try:
            echo(bytes(1024), timeout=2)
        except grpc.RpcError as error:
            failed[error.code().name] += 1  # type: ignore[attr-defined]
            time.sleep(RETRY_PAUSE_S)
    return f"answered {calls - failed.total()} of {calls}" + (f" {dict(failed)}" if failed else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--idle", type=int, default=32, help="idle streams the stranger holds")
    parser.add_argument("--connections", type=int, default=4)
    parser.add_argument("--resets", type=int, default=200_000, help="reset streams at most")
    parser.add_argument(
        "--after", type=int, default=20, help="echoes on the same connection after the stranger"
    )
    parser.add_argument(
        "--phases", default=",".join(PHASES), help=f"comma-separated, of {', '.join(PHASES)}"
    )
    parser.add_argument("--label", default="", help="what the run measured (e.g. a tree)")
    parser.add_argument(
        "--under-load",
        action="store_true",
        help="say in the output that other work shared the machine (figures not for targets)",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    chosen = args.phases.split(",")
    if unknown := sorted(set(chosen) - set(PHASES)):
        parser.error(f"--phases: unknown {', '.join(unknown)}; choose from {', '.join(PHASES)}")
    lines = [
        f"# {Path(__file__).name}: Python tensor server on lo, 1 KiB raw echo, one at a time, "
        f"2 s deadline; {args.calls} echoes or {args.seconds:g} s per phase",
        f"# load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} (1, 5 min)"
        f"{' (UNDER LOAD: other work on this machine)' if args.under_load else ''}; "
        f"{os.cpu_count()} CPUs; grpcio {grpc.__version__}; "
        f"server: {grpc_settings.max_concurrent_rpcs(THREADS)} calls at once, {THREADS} threads, "
        f"idle calls cancelled after {IDLE_STREAM_S:g} s (the idle phase lasts that longer per "
        f"{THREADS} idle streams); server options {_stream_options()}"
        + (f"; {args.label}" if args.label else ""),
    ]
    with ServerProcess.start(resolve_fabric("lo")) as server:
        host, _, port_text = server.target.rpartition(":")
        port = int(port_text)
        stranger = _stranger()
        phases = [
            ("quiet", contextlib.nullcontext({})),
            ("idle-streams", stranger.idle_streams(host, port, ECHO, args.idle, args.connections)),
            ("rapid-reset", stranger.rapid_reset(host, port, ECHO, args.resets, args.seconds)),
        ]
        for name, attack in phases:
            if name not in chosen:
                continue
            # Idle streams hold the 16 threads an idle bound each, in rounds of 16: the phase
            # outlasts them.
            rounds = -(-args.idle // THREADS) if name == "idle-streams" else 0
            seconds = args.seconds + IDLE_STREAM_S * rounds
            with grpc.insecure_channel(
                server.target, options=grpc_settings.CHANNEL_OPTIONS
            ) as channel:
                warm_up(channel)
                with attack as attacking:
                    figures = measure(channel, args.calls, seconds)
                    did = dict(attacking)
                after = answered_after(channel, args.after) if name != "quiet" else ""
            alive = server.poll() is None
            lines.append(
                f"{name:13s} echoes {figures['echoes']:5.0f} failures {figures['failures']:4.0f} "
                f"p50 {figures['p50_us']:9.1f} us  p99 {figures['p99_us']:9.1f} us  "
                f"max {figures['max_us']:9.1f} us  failed {figures['codes'] or '-'}  "
                f"stranger {did or '-'}  "
                f"server {'alive' if alive else 'DEAD'}"
                + (f"  after it left, same connection: {after}" if after else "")
            )
            print(lines[-1], flush=True)
    lines.append(f"# load after: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
