"""Stream pull with the server's messages prepared once, against the stock server (an experiment).

    python benchmarks/experiments/pull_prepared.py [--rounds 5] [--sizes 4MiB,16MiB,64MiB]

The stock ``TensorService.pull_stream`` copies every slice of the cached tensor for every request
(``piece.tobytes()`` in raw mode, ``codec.encode_chunk(piece)`` in protobuf mode). The patched
server (this file run as ``serve ...``) keeps the list of ready messages per (size, dtype, chunk,
mode) and yields them as they are - the pull side of what db3e210 did for pushes. Nothing in
``src/`` changes: the method is replaced in the server process only.

Both servers run at once under the tuned allocator environment; every round measures every
size, mode and server back to back (``p2p_bandwidth(direction="pull", rpc="stream")``), and the
figures are medians over rounds with the median of per-round ratios (patched / stock).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def serve(argv: Sequence[str]) -> int:
    import grpc

    from pytest_tfgrpc.roles import tensor_server as server
    from pytest_tfgrpc.wire import codec, grpc_settings

    cache: dict[tuple[int, str, int, bool], list[bytes]] = {}
    lock = threading.Lock()

    def pull_stream(self: Any, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        nbytes, dtype, chunk = codec.decode_pull_request(request)
        chunk = chunk or grpc_settings.DEFAULT_CHUNK_BYTES
        key = (nbytes, dtype, chunk, self.protobuf)
        with lock:
            messages = cache.get(key)
            if messages is None:
                view = memoryview(self._encoded(nbytes, dtype))
                pieces = [view[s : s + chunk] for s in range(0, len(view), chunk)]
                messages = [codec.encode_chunk(p) if self.protobuf else p.tobytes() for p in pieces]
                cache.clear()  # keep one tensor, as the stock cache does
                cache[key] = messages
        yield from messages

    server.TensorService.pull_stream = pull_stream  # type: ignore[method-assign]
    return server.main(list(argv))


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    if args_in[:1] == ["serve"]:
        return serve(args_in[1:])
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="4MiB,16MiB,64MiB")
    args = p.parse_args(args_in)

    from pytest_tfgrpc.bench import BandwidthCall, RunSpec, p2p_bandwidth
    from pytest_tfgrpc.roles.processes import ServerProcess
    from pytest_tfgrpc.tuning import allocator as tuning
    from pytest_tfgrpc.units import parse_sizes
    from pytest_tfgrpc.wire.fabric import resolve_fabric

    env = tuning.apply_policy("tuned")
    fabric = resolve_fabric("lo")
    sizes = parse_sizes(args.sizes)
    run = RunSpec(iterations=20, warmup=2, max_seconds=3.0, warmup_seconds=3.0)
    print(f"load average {os.getloadavg()}", flush=True)
    stock = ServerProcess.start(fabric, env=env)
    patched = None
    try:
        argv = [sys.executable, str(HERE / "pull_prepared.py"), "serve"]
        argv += ["--fabric", fabric.name, "--exit-on-stdin-eof"]
        patched = ServerProcess(argv, fabric=fabric, name="pull-prepared server", env=env)
        patched._wait_ready(30.0)
        figures: dict[tuple[str, int, str], list[float]] = {}
        for r in range(args.rounds):
            for size in sizes:
                for mode in ("raw", "protobuf"):
                    for name, srv in (("stock", stock), ("prepared", patched)):
                        call = BandwidthCall(mode=mode, direction="pull", run=run)
                        res = p2p_bandwidth(srv, [size], call)
                        med = statistics.median(res.sizes[0].samples_ns)
                        figures.setdefault((mode, size, name), []).append(size / med)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
        print("mode      size   stock GB/s  prepared GB/s  ratio  paired  rounds stock | prepared")
        for size in sizes:
            for mode in ("raw", "protobuf"):
                a, b = figures[mode, size, "stock"], figures[mode, size, "prepared"]
                ma, mb = statistics.median(a), statistics.median(b)
                paired = statistics.median(y / x for x, y in zip(a, b, strict=True))
                print(
                    f"{mode:8} {size >> 20:3} MiB  {ma:10.3f}  {mb:13.3f}  {mb / ma:5.2f}  "
                    f"{paired:6.2f}  {', '.join(f'{x:.3f}' for x in a)} | "
                    f"{', '.join(f'{y:.3f}' for y in b)}"
                )
    finally:
        if patched is not None:
            patched.stop()
        stock.stop()
    print(f"load average {os.getloadavg()}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
