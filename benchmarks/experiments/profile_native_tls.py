"""Where the native engine's mutual-TLS push spends its CPU, against plaintext, between two
emulated hosts (the driver on the bridge, a native server on ``tls0`` started by its agent).

    python benchmarks/experiments/profile_native_tls.py [--size-mib 64] [--seconds 6] [--out DIR]

For plaintext and then mutual TLS (the host's own certificate, the driver's for the client) it
measures the native raw stream push for ``--seconds`` (bounded by a count too) while
``perf record -a`` samples the machine for the same window, then prints each
configuration's throughput, the CPU seconds per GB of the native client and server (from
``/proc``), each native process's samples by library and its top symbols. Needs root,
the native engine built, the ``dev`` extra (trustme) and ``perf``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from pytest_tfgrpc.bench import BandwidthCall, RunSpec, native_p2p
from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.wire.security import load_tls, use_tls

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from native_hosts import hosts_with_agents, uptime

MiB = 1 << 20
COMMS = ("tfgrpc-native-c", "tfgrpc-native-s")


def report(data: Path, comm: str, lines: int) -> str:
    done = subprocess.run(
        ["perf", "report", "-i", str(data), "--comm", comm, "--no-children", "--stdio",
         "-g", "none", "--percentage", "relative", "--sort", "dso,symbol"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    rows = [r.rstrip() for r in done.stdout.splitlines() if r.strip() and not r.startswith("#")]
    return "\n".join(rows[:lines])


def libraries(data: Path) -> str:
    """Each native process's samples by library (the kernel, libcrypto, libc, libgrpc...)."""
    done = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,ip,dso", "-G"],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    counts: dict[str, Counter[str]] = {comm: Counter() for comm in COMMS}
    for row in done.stdout.splitlines():
        fields = row.split()  # comm, ip, (dso)
        if len(fields) >= 3 and fields[0] in counts:
            counts[fields[0]][Path(fields[-1].strip("()")).name] += 1
    out = []
    for comm, by_dso in counts.items():
        total = sum(by_dso.values()) or 1
        shares = ", ".join(f"{dso} {n / total:.1%}" for dso, n in by_dso.most_common(6))
        out.append(f"{comm} ({total} samples): {shares}")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--out", default=None, help="keep perf.data files here")
    parser.add_argument(
        "--call-graph", default="fp", help="perf's --call-graph (fp; dwarf: slower, deeper)"
    )
    parser.add_argument("--only", choices=["plaintext", "mtls"], help="one configuration")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        print("perf is not installed")
        return 1
    print(f"load before: {uptime()}", flush=True)
    size = args.size_mib * MiB
    run = RunSpec(iterations=2000, warmup=2, max_seconds=args.seconds, warmup_seconds=1.0)
    call = BandwidthCall(mode="raw", rpc="stream", direction="push", run=run)
    warm = BandwidthCall(
        mode="raw", rpc="stream", direction="push",
        run=RunSpec(iterations=2, warmup=1, max_seconds=2.0, warmup_seconds=1.0),
    )  # fmt: skip
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tls-profile-")))
        out = Path(args.out) if args.out else tmp
        out.mkdir(parents=True, exist_ok=True)
        driver, agents, mine = hosts_with_agents(stack, "tls0")
        client = agents["tls0"]
        for label, files in (("plaintext", None), ("mtls", mine)):
            if args.only not in (None, label):
                continue
            env = {**os.environ, **(files.env() if files is not None else {})}
            server = start_tensor_server(
                driver, engine="native", env=env, launcher=client.launcher()
            )
            use_tls(load_tls(files) if files is not None else None)
            try:
                native_p2p.p2p_bandwidth(server, [size], warm)  # connections, pages
                data = out / f"{label}.perf.data"
                perf = subprocess.Popen(
                    ["perf", "record", "-a", "-F", "499", f"--call-graph={args.call_graph}",
                     "-o", str(data), "--", "sleep", str(args.seconds + 1.5)],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
                try:
                    began = time.monotonic()
                    result = native_p2p.p2p_bandwidth(server, [size], call)
                    took = time.monotonic() - began
                finally:
                    perf.wait(timeout=args.seconds + 60)
            finally:
                use_tls(None)
                server.stop()
            point = result.sizes[0]
            moved = point.count * size
            cpu = ", ".join(f"{k}={v.total_ns / moved:.3f}" for k, v in point.cpu.items())
            print(
                f"\n== {label}: {point.throughput_Bps / 1e9:.3f} GB/s, {point.count} pushes of "
                f"{args.size_mib} MiB in {took:.1f} s; CPU s/GB: {cpu or 'n/a'}",
                flush=True,
            )
            print(f"-- samples by library ({label}):\n{libraries(data)}")
            for comm in COMMS:
                print(f"-- {comm} ({label}), top symbols by samples:")
                print(report(data, comm, 12), flush=True)
    print(f"\nload after: {uptime()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
