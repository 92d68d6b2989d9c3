"""Protobuf push with the TensorProto encoded once, outside the timed region (an experiment).

    python benchmarks/experiments/protobuf_prepared.py [--rounds 5] [--sizes 4,64]

Raw mode slices the tensor before timing ("TensorFlow's send path hands gRPC the tensor's own
buffer"); protobuf mode encodes every TensorChunk inside the timed region, one copy of the
content per tensor. TensorFlow's own coding (grpc_tensor_coding.cc) writes the header into a
small slice and hands the tensor buffer over without a copy, so its per-byte cost is zero.
This measures, side by side in one run on one server: raw, protobuf as it is, and protobuf
with ``codec.encode_tensor_chunks`` / ``codec.encode_tensor`` memoized per tensor (monkeypatched
here; ``src/`` is unchanged), for the stream and the unary push; and for the stream, memoized
chunks whose first one carries the header on top of its content (one message fewer).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from pytest_tfgrpc.bench import BandwidthCall, RunSpec, p2p_bandwidth
from pytest_tfgrpc.roles.processes import ServerProcess
from pytest_tfgrpc.tuning import allocator as tuning
from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire.fabric import resolve_fabric

MiB = 1 << 20
RUN = RunSpec(iterations=20, warmup=2, max_seconds=2.0, warmup_seconds=2.0)
STOCK_CHUNKS = codec.encode_tensor_chunks
STOCK_TENSOR = codec.encode_tensor


def header_first_chunks(
    content: Any, dtype: str, shape: tuple[int, ...], chunk_bytes: int
) -> list[bytes]:
    """``codec.encode_tensor_chunks`` with the header on top of the first chunk's content, so
    a tensor of n * chunk_bytes is n messages, not n + 1 (recommended change 2)."""
    header = codec.encode_header(dtype, shape, len(content))
    view = memoryview(content)
    total = len(header) + len(view)
    bounds = [0, *range(len(header) + chunk_bytes, total, chunk_bytes), total]
    chunks = []
    for start, end in itertools.pairwise(bounds):
        parts: list[bytes | memoryview] = [b"\x0a", codec.varint(end - start)]
        if start < len(header):
            parts.append(header[start : min(end, len(header))])
        if end > len(header):
            parts.append(view[max(start - len(header), 0) : end - len(header)])
        chunks.append(b"".join(parts))
    return chunks


def memoized(
    header_first: bool = False,
) -> tuple[Callable[..., list[bytes]], Callable[..., bytes]]:
    """Encoders that encode a given tensor once and hand back the same bytes after."""
    chunks: dict[tuple[int, int], list[bytes]] = {}
    whole: dict[int, bytes] = {}
    encoder = header_first_chunks if header_first else STOCK_CHUNKS

    def encode_chunks(content: Any, dtype: str, shape: tuple[int, ...], chunk: int) -> list[bytes]:
        key = (id(content), chunk)
        if key not in chunks:
            chunks.clear()
            chunks[key] = encoder(content, dtype, shape, chunk)
        return chunks[key]

    def encode_tensor(content: Any, dtype: str, shape: tuple[int, ...]) -> bytes:
        if id(content) not in whole:
            whole.clear()
            whole[id(content)] = STOCK_TENSOR(content, dtype, shape)
        return whole[id(content)]

    return encode_chunks, encode_tensor


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--sizes", default="4,64", help="MiB")
    args = p.parse_args(argv)
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    env = tuning.apply_policy("tuned")
    variants = [
        ("raw", "raw", 0),
        ("protobuf (encoded in the timed loop)", "protobuf", 0),
        ("protobuf (encoded once, before timing)", "protobuf", 1),
        ("protobuf (once, header in chunk 1)", "protobuf", 2),
    ]
    got: dict[tuple[str, str, int], list[float]] = {}
    load0 = os.getloadavg()
    with ServerProcess.start(resolve_fabric("lo"), env=env) as server:
        for r in range(args.rounds):
            for size in sizes:
                for rpc in ("stream", "unary"):
                    for name, mode, prepared in variants:
                        if prepared == 2 and rpc == "unary":
                            continue  # unary sends one whole TensorProto: no chunks
                        if prepared:
                            chunks, whole = memoized(header_first=prepared == 2)
                            codec.encode_tensor_chunks = chunks  # type: ignore[assignment,unused-ignore]
                            codec.encode_tensor = whole  # type: ignore[assignment,unused-ignore]
                        try:
                            call = BandwidthCall(mode=mode, rpc=rpc, run=RUN)
                            result = p2p_bandwidth(server, [size], call)
                        finally:
                            codec.encode_tensor_chunks = STOCK_CHUNKS  # type: ignore[assignment,unused-ignore]
                            codec.encode_tensor = STOCK_TENSOR  # type: ignore[assignment,unused-ignore]
                        median = float(np.median(result.sizes[0].samples_ns))
                        got.setdefault((rpc, name, size), []).append(size * 1e9 / median)
            print(f"round {r + 1}/{args.rounds}", file=sys.stderr, flush=True)
    print(f"{args.rounds} rounds; load average {load0} -> {os.getloadavg()}")
    for size in sizes:
        for rpc in ("stream", "unary"):
            raw = statistics.median(got[rpc, "raw", size])
            for name, _, _ in variants:
                if (rpc, name, size) not in got:
                    continue
                rounds = got[rpc, name, size]
                med = statistics.median(rounds)
                print(
                    f"{size // MiB:>3} MiB {rpc:<6} {name:<40} {med / 1e9:.3f} GB/s  "
                    f"x raw {med / raw:.2f}  rounds {', '.join(f'{x / 1e9:.2f}' for x in rounds)}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
