"""Fuzz the Python parsers a stranger's bytes reach: the tensor codec and the agent's role
parameters. Every input must end (within ``--call-limit`` seconds) in a result or the
parser's own refusal (``CodecError``, ``RoleError``); anything else, or a call that takes
longer, is a finding. Inputs: random bytes, and valid encodings mutated (bit flips, cuts,
splices, fields with huge lengths); random parameter and environment strings for roles.

    python scripts/fuzz_parsers.py --seconds 120 --seed 1   # the committed long run
    python scripts/fuzz_parsers.py --seconds 3              # what CI runs (tests/test_fuzz.py)

Prints one line per target (inputs tried, refusals, slowest call) and exits 1 on a finding,
printing the input (hex) that caused it.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable

from pytest_tfgrpc.hosts.agent import ROLES, RoleError, role_argv
from pytest_tfgrpc.wire import codec
from pytest_tfgrpc.wire.fabric import Fabric

FABRIC = Fabric(name="lo", address="127.0.0.1", family="ipv4")


def _seeds() -> list[bytes]:
    return [
        codec.encode_tensor(bytes(16), "float32", (2, 2)),
        codec.encode_tensor(b"", "uint8", (0,)),
        codec.encode_header("float32", (1 << 20,), 4 << 20),
        codec.encode_ack(1 << 30, 7),
        codec.encode_chunk(bytes(9)),
        codec.encode_pull_request(1 << 40, "float32", 1 << 20),
        bytes([0x22, 0xF5, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]),  # 2^64-11
    ]


def _mutate(rng: random.Random, seeds: list[bytes]) -> bytes:
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(64))
    data = bytearray(rng.choice(seeds))
    if kind == 1 and data:
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif kind == 2:
        data = data[: rng.randrange(len(data) + 1)]
    elif kind == 3:
        other = rng.choice(seeds)
        data = data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]
    elif kind == 4:  # a field whose length (or value) is a huge varint
        field = rng.choice([0x0A, 0x12, 0x22, 0x08, 0x10, 0x18])
        data = bytearray([field]) + codec.varint(rng.choice([2**63, 2**64 - 11, 2**35, 2**31]))
        data += rng.randbytes(rng.randrange(8))
    else:
        data += rng.randbytes(rng.randrange(16))
    return bytes(data)


def _strings(rng: random.Random) -> str:
    pool = ["", "0", "-1", "1e9", "nan", "inf", "4096", "2s", "$(x)", "\0", "a" * 300, "☃"]
    return rng.choice(pool) if rng.random() < 0.6 else rng.randbytes(8).decode("latin-1")


TARGETS: dict[str, Callable[[bytes], object]] = {
    "content_span": codec.content_span,
    "decode_tensor": codec.decode_tensor,
    "decode_ack": codec.decode_ack,
    "chunk_data": codec.chunk_data,
    "decode_pull_request": codec.decode_pull_request,
}


def fuzz(seconds: float, seed: int, call_limit: float) -> int:
    rng = random.Random(seed)
    seeds = _seeds()
    share = seconds / (len(TARGETS) + 1)
    findings = 0
    for name, parse in TARGETS.items():
        tried = refused = 0
        slowest = 0.0
        end = time.monotonic() + share
        while time.monotonic() < end:
            data = _mutate(rng, seeds)
            start = time.perf_counter()
            try:
                parse(data)
            except codec.CodecError:
                refused += 1
            except Exception as exc:  # a finding: report it, keep going
                findings += 1
                print(f"FINDING {name}({data.hex()}): {type(exc).__name__}: {exc}")
            took = time.perf_counter() - start
            slowest = max(slowest, took)
            if took > call_limit:
                findings += 1
                print(f"FINDING {name}({data.hex()}): took {took:.3f} s")
            tried += 1
        print(f"{name}: {tried} inputs, {refused} refused, slowest {slowest * 1e6:.0f} us")
    tried = refused = 0
    slowest = 0.0
    end = time.monotonic() + share
    while time.monotonic() < end:
        role = rng.choice([*ROLES, "nope", ""])
        params = {_strings(rng): _strings(rng) for _ in range(rng.randrange(3))}
        if rng.random() < 0.5:
            params[rng.choice(["workers", "delay", "max_tensor_bytes"])] = _strings(rng)
        env = {_strings(rng): _strings(rng) for _ in range(rng.randrange(2))}
        start = time.perf_counter()
        try:
            role_argv(role, params, env, FABRIC)
        except RoleError:
            refused += 1
        except Exception as exc:
            findings += 1
            print(f"FINDING role_argv({role!r}, {params!r}, {env!r}): {type(exc).__name__}: {exc}")
        slowest = max(slowest, time.perf_counter() - start)
        tried += 1
    print(f"role_argv: {tried} inputs, {refused} refused, slowest {slowest * 1e6:.0f} us")
    print(f"{findings} findings (seed {seed}, {seconds:g} s)")
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--call-limit", type=float, default=0.5, help="seconds one call may take")
    args = parser.parse_args(argv)
    return 1 if fuzz(args.seconds, args.seed, args.call_limit) else 0


if __name__ == "__main__":
    sys.exit(main())
