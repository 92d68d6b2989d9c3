"""The longer fuzzing run of the tensor servers' parsers (the CI test runs a few seconds of it).

Usage: ``python scripts/fuzz_servers.py [--seconds S] [--seeds N] [--engines native,grpcio]``

For each engine and each seed, a fresh server (job token set, tensor limit 1 MiB) takes up to
``S`` seconds of random, hostile and mutated byte strings through raw gRPC generic calls to
every method of every service (``tests/fuzz_wire.py``); it must answer every call within the
call's deadline, still answer ``Status`` afterwards, and stay alive. Prints one line per run
(calls, status codes, failures, peak resident memory) and exits 1 if any run failed. The
committed output is ``benchmarks/results/fuzz_servers.txt``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path

from pytest_tfgrpc.roles.native_server import start_tensor_server
from pytest_tfgrpc.wire.fabric import resolve_fabric
from pytest_tfgrpc.wire.security import TOKEN_ENV

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "fuzz-servers-token"
LIMIT = 1 << 20


def _fuzz_wire():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("fuzz_wire", ROOT / "tests" / "fuzz_wire.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_wire"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="per engine and seed")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--engines", default="native,grpcio")
    args = parser.parse_args()
    fuzz_wire = _fuzz_wire()
    lo = resolve_fabric("lo")
    failed = False
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for engine in args.engines.split(","):
        for seed in range(args.seeds):
            server = start_tensor_server(
                lo, engine=engine, env={**os.environ, TOKEN_ENV: TOKEN}, max_tensor_bytes=LIMIT
            )
            try:
                report = fuzz_wire.fuzz(
                    server.target,
                    server.pid,
                    TOKEN,
                    seed=seed,
                    calls=10**9,
                    seconds=args.seconds,
                )
                alive = server.poll() is None
            finally:
                server.stop()
            codes = " ".join(f"{code}={n}" for code, n in sorted(report.codes.items()))
            ok = alive and not report.failures
            failed |= not ok
            print(
                f"{engine:<6} seed {seed}: {report.calls} calls in {report.seconds:.0f} s, "
                f"peak RSS {report.peak_rss_kib / 1024:.0f} MiB, "
                f"{'ok' if ok else 'FAILED'}: {codes}"
            )
            for failure in report.failures:
                print(f"    {failure}")
            if not alive:
                print("    the server died")
    print(f"load after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
