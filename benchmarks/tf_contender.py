"""TensorFlow's own gRPC runtime as a contender: a tensor pulled from a PS task by a worker task.

The tasks and their measurements live in the package (``pytest_tfgrpc.roles.tf_task``, run by
the Python of an environment where TensorFlow is installed, and
``pytest_tfgrpc.ps.tf_cluster``, the harness's side), where the plugin's ``tensorflow``
engine uses them too; this module names them for ``run.py`` and keeps the ``check`` command.

Two ``tf.distribute.Server`` tasks, job ``ps`` task 0 and job ``worker`` task 0, each in its own
process on 127.0.0.1. For a tensor of ``size`` bytes (float32) the worker keeps a
``tf.Variable`` placed on ``/job:ps/task:0`` and runs, as one graph step of a
``tf.compat.v1.Session`` on its own server, an op on ``/job:worker/task:0`` that reads the
variable: the PS reads it and the worker fetches the whole tensor with TF's ``RecvTensor`` RPC.
``op="slice"`` (``v[0] + 1``, the harness's rows) or ``op="sum"`` (every element read once).
The same command also times steps on a one-element variable: TF's own per-step cost.

    python tf_contender.py check [--tf-python P] [--rounds N] [--sizes 1024,4194304] [--ops sum]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence

from pytest_tfgrpc.ps.tf_cluster import Steps, TFCluster, find_tf_python
from pytest_tfgrpc.roles.tf_task import OPS

__all__ = ["HOST", "OPS", "Steps", "TFCluster", "find_tf_python"]

#: Where the tasks listen: the loopback fabric.
HOST = "127.0.0.1"


def check(argv: Sequence[str]) -> int:
    """Pull each size with each op, rounds interleaved: ``check --tf-python P --rounds N``."""
    p = argparse.ArgumentParser(prog="tf_contender.py check")
    p.add_argument("--tf-python", default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="1024,4194304,67108864")
    p.add_argument("--ops", default="slice,sum")
    args = p.parse_args(argv)
    tf_python, note = find_tf_python(args.tf_python)
    if tf_python is None:
        print(note)
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average {os.getloadavg()}")
    with TFCluster(tf_python) as cluster:
        print(json.dumps(cluster.info))
        for r in range(args.rounds):
            for size in sizes:
                for op in args.ops.split(","):
                    got = cluster.measure(
                        size,
                        iterations=20 if size >= 1 << 20 else 300,
                        warmup=3,
                        max_seconds=3.0,
                        overhead_iterations=50,
                        op=op,
                    )
                    med = sorted(got.samples_ns)[len(got.samples_ns) // 2]
                    ovh = sorted(got.overhead_ns)[len(got.overhead_ns) // 2]
                    print(
                        f"round {r + 1} {size:>9} B {op:5}: step p50 {med / 1e3:9.1f} us "
                        f"({size / med:.3f} GB/s), 1-element step p50 {ovh / 1e3:7.1f} us, "
                        f"n={len(got.samples_ns)}",
                        flush=True,
                    )
    print(f"load average {os.getloadavg()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["check"]:
        return check(args[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
