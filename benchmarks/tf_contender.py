"""TensorFlow's own gRPC runtime as a contender: a tensor pulled from a PS task by a worker task.

Two ``tf.distribute.Server`` tasks, job ``ps`` task 0 and job ``worker`` task 0, each in its own
process on 127.0.0.1, started with the Python of an environment where TensorFlow is installed
(``--tf-python``; this harness's own interpreter needs no TensorFlow)::

    TF_PYTHON tf_contender.py serve --job ps     --cluster JSON --lifetime S
    TF_PYTHON tf_contender.py serve --job worker --cluster JSON --lifetime S

Both print one JSON line when serving (pid, TensorFlow's version) and exit on stdin EOF (the
lifeline: the harness holds the other end), on SIGTERM, when their parent dies
(``PR_SET_PDEATHSIG``) or after ``--lifetime`` seconds, whichever comes first.

The worker also measures, on command (one JSON line on stdin, one JSON line back): for a tensor
of ``size`` bytes (float32) it keeps a ``tf.Variable`` placed on ``/job:ps/task:0`` and runs, as
one graph step of a ``tf.compat.v1.Session`` on its own server (the classic between-graph
replication a ``tf.distribute.Server`` serves), an op on ``/job:worker/task:0`` that reads the
variable. The PS task reads the variable and the worker fetches the whole tensor with TF's
``RecvTensor`` RPC over its gRPC runtime: the same path parameters take in distributed TF.

- ``op="slice"`` (the default, the harness's rows): ``v[0] + 1``. The whole tensor crosses
  (Send/Recv move whole tensors; the step time grows with the size, 1 KiB to 64 MiB), and the
  worker then does no per-byte work, as the plugin's server only counts what it receives.
- ``op="sum"``: ``reduce_sum(v + 1)``; the worker also reads every element once (a cross-check).

Every step is timed with ``perf_counter_ns`` after warm-up steps, bounded in count and time, the
cyclic GC off while timing. The same command also times steps on a 4-byte variable placed the
same way: TF's own per-step cost (session, the master's RunGraph call to the PS, a RecvTensor
round trip), returned beside the samples so it can be reported or subtracted.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import IO, Any

HOST = "127.0.0.1"
#: The step whose time is TF's own per-step cost: a one-element float32 variable.
OVERHEAD_BYTES = 4
OPS = ("slice", "sum")

# --------------------------------------------------------------------------------------------
# Task processes (run by the TensorFlow environment's Python)
# --------------------------------------------------------------------------------------------


def _tie_to_parent(lifetime: float) -> None:
    """Die with the parent, and after ``lifetime`` seconds whatever happens."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() == 1:  # the parent is already gone
        os._exit(2)
    timer = threading.Timer(lifetime, os._exit, args=(3,))
    timer.daemon = True
    timer.start()


def _cluster_spec(cluster: dict[str, list[str]]) -> Any:
    import tensorflow as tf

    return tf.train.ClusterSpec(cluster)


def _ready(job: str) -> None:
    import tensorflow as tf

    print(
        json.dumps(
            {
                "job": job,
                "pid": os.getpid(),
                "tensorflow": tf.version.VERSION,
                "tensorflow_git": tf.version.GIT_VERSION,
                "python": sys.version.split()[0],
            }
        ),
        flush=True,
    )


class _Worker:
    """The worker's graph: one PS variable per size, and the ops that pull it."""

    def __init__(self, server: Any) -> None:
        import tensorflow as tf

        self.tf = tf
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(server.target, graph=self.graph)
        self.ops: dict[tuple[int, str], Any] = {}

    def op(self, size: int, kind: str) -> Any:
        key = (size, kind)
        if key in self.ops:
            return self.ops[key]
        tf = self.tf
        elements = max(1, size // 4)
        with self.graph.as_default():
            name = f"v{elements}"
            existing = [v for v in self.graph.get_collection("variables") if v.op.name == name]
            if existing:
                var = existing[0]
            else:
                with tf.device("/job:ps/task:0"):
                    var = tf.compat.v1.Variable(
                        tf.zeros([elements], tf.float32), name=name, use_resource=True
                    )
                self.session.run(var.initializer)
            with tf.device("/job:worker/task:0"):
                if kind == "slice":
                    out = var[0] + 1.0
                elif kind == "sum":
                    out = tf.reduce_sum(var + 1.0)
                else:
                    raise ValueError(f"unknown op {kind!r}; known: {', '.join(OPS)}")
        self.ops[key] = out
        return out

    def time_steps(self, op: Any, iterations: int, warmup: int, max_seconds: float) -> list[int]:
        run = self.session.run
        deadline = time.monotonic() + max_seconds
        for _ in range(warmup):
            run(op)
            if time.monotonic() > deadline:
                break
        samples: list[int] = []
        clock = time.perf_counter_ns
        deadline = time.monotonic() + max_seconds
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for _ in range(iterations):
                t0 = clock()
                run(op)
                samples.append(clock() - t0)
                if time.monotonic() > deadline:
                    break
        finally:
            if was_enabled:
                gc.enable()
        return samples

    def measure(self, cmd: dict[str, Any]) -> dict[str, Any]:
        kind = str(cmd.get("op", "slice"))
        size = int(cmd["size"])
        iterations, warmup = int(cmd["iterations"]), int(cmd["warmup"])
        max_seconds = float(cmd["max_seconds"])
        main = self.op(size, kind)
        tiny = self.op(OVERHEAD_BYTES, kind)
        overhead_iterations = int(cmd.get("overhead_iterations", 0))
        overhead = (
            self.time_steps(tiny, overhead_iterations, 2, min(max_seconds, 1.0))
            if overhead_iterations
            else []
        )
        samples = self.time_steps(main, iterations, warmup, max_seconds)
        return {"samples_ns": samples, "overhead_ns": overhead}


def serve(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="tf_contender.py serve")
    p.add_argument("--job", choices=("ps", "worker"), required=True)
    p.add_argument("--cluster", required=True, help='{"ps": ["h:p"], "worker": ["h:p"]}')
    p.add_argument("--lifetime", type=float, default=3600.0)
    args = p.parse_args(argv)
    _tie_to_parent(args.lifetime)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    server = tf.distribute.Server(
        _cluster_spec(json.loads(args.cluster)),
        job_name=args.job,
        task_index=0,
        protocol="grpc",
        start=True,
    )
    if args.job == "ps":
        gc.freeze()
        _ready(args.job)
        while os.read(0, 4096):
            pass
        os._exit(0)  # TF's server has no clean stop; the process ends here
    tf.compat.v1.disable_eager_execution()
    worker = _Worker(server)
    gc.freeze()
    _ready(args.job)
    for line in sys.stdin:
        try:
            reply = worker.measure(json.loads(line))
        except Exception as exc:  # reported to the harness, which stops the cluster
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    os._exit(0)


# --------------------------------------------------------------------------------------------
# The harness's side (no TensorFlow needed here)
# --------------------------------------------------------------------------------------------


def find_tf_python(given: str | None) -> tuple[str | None, str]:
    """The interpreter to run the TF tasks with, or None and why not.

    This interpreter if TensorFlow is importable here; else ``given`` (``--tf-python``).
    """
    import importlib.util

    if importlib.util.find_spec("tensorflow") is not None:
        return sys.executable, "TensorFlow importable in the harness's interpreter"
    if not given:
        return None, (
            "TensorFlow's gRPC runtime skipped: tensorflow is not importable here and no "
            "--tf-python was given (tensorflow-cpu is an optional extra: install it, or point "
            "--tf-python at the python of an environment that has it)"
        )
    if not (os.path.isfile(given) and os.access(given, os.X_OK)):
        return None, f"TensorFlow's gRPC runtime skipped: --tf-python {given!r} is not executable"
    return given, f"TensorFlow tasks run by --tf-python {given}"


def _free_ports(count: int) -> list[int]:
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# A copy of pytest_tfgrpc.servers.processes.end_process's essentials: this file also runs as a
# script
# under TensorFlow's own venv, where pytest_tfgrpc is not installed.
def _terminate(proc: subprocess.Popen[bytes], timeout: float) -> None:
    if proc.poll() is not None:
        return
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class Steps:
    """Timed steps of one size, and TF's per-step cost measured just before them."""

    samples_ns: list[int]
    overhead_ns: list[int]


class _Task:
    def __init__(
        self,
        tf_python: str,
        job: str,
        cluster: dict[str, list[str]],
        env: dict[str, str],
        lifetime: float,
    ) -> None:
        argv = [tf_python, os.path.abspath(__file__), "serve", "--job", job]
        argv += ["--cluster", json.dumps(cluster), "--lifetime", str(lifetime)]
        self.job = job
        # Closed in stop(), which every path reaches (TFCluster is a context manager).
        self.stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            cwd=tempfile.gettempdir(),  # never import this checkout's modules by accident
        )
        weakref.finalize(self, _terminate, self.proc, 10.0)
        self._buf = b""

    def tail(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-1500:]

    def read_line(self, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise RuntimeError(f"TF {self.job} task: no answer in {timeout:.0f} s")
                chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    raise RuntimeError(
                        f"TF {self.job} task exited with {self.proc.wait()}: {self.tail()}"
                    )
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        out: dict[str, Any] = json.loads(line)
        return out

    def send(self, doc: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(doc).encode() + b"\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        _terminate(self.proc, 10.0)
        for f in (self.proc.stdout, self.stderr):
            if f is not None:
                f.close()


class TFCluster:
    """PS task 0 and worker task 0 of TensorFlow's gRPC runtime; a context manager.

    ``env`` is the environment of both task processes (the run's allocator variables).
    """

    def __init__(
        self,
        tf_python: str,
        env: dict[str, str] | None = None,
        *,
        lifetime: float = 3600.0,
        start_timeout: float = 180.0,
    ) -> None:
        self.tf_python = tf_python
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        # The TF environment's own packages, whatever this process put on its path.
        self.env.pop("PYTHONPATH", None)
        self.lifetime = lifetime
        self.start_timeout = start_timeout
        self.tasks: dict[str, _Task] = {}
        self.info: dict[str, Any] = {}

    @property
    def pids(self) -> dict[str, int]:
        return {f"tf {job} 0": task.proc.pid for job, task in self.tasks.items()}

    def __enter__(self) -> TFCluster:
        error: Exception | None = None
        for _ in range(3):  # a port taken between picking and binding: pick again, 3 times
            ps_port, worker_port = _free_ports(2)
            cluster = {"ps": [f"{HOST}:{ps_port}"], "worker": [f"{HOST}:{worker_port}"]}
            try:
                for job in ("ps", "worker"):
                    self.tasks[job] = _Task(self.tf_python, job, cluster, self.env, self.lifetime)
                for job, task in self.tasks.items():
                    self.info[job] = task.read_line(self.start_timeout)
                self.info["cluster"] = cluster
                return self
            except BaseException as exc:
                self.stop()
                if not isinstance(exc, RuntimeError):
                    raise
                error = exc
        raise RuntimeError(f"TF cluster did not start: {error}")

    @property
    def version(self) -> str:
        return str(self.info.get("worker", {}).get("tensorflow", ""))

    def measure(
        self,
        size: int,
        *,
        iterations: int,
        warmup: int,
        max_seconds: float,
        overhead_iterations: int = 0,
        op: str = "slice",
    ) -> Steps:
        worker = self.tasks["worker"]
        worker.send(
            {
                "size": size,
                "iterations": iterations,
                "warmup": warmup,
                "max_seconds": max_seconds,
                "overhead_iterations": overhead_iterations,
                "op": op,
            }
        )
        # Warm-up and timing are each bounded by max_seconds; creating a variable is quick.
        reply = worker.read_line(3 * max_seconds + 120.0)
        if "error" in reply:
            raise RuntimeError(f"TF worker: {reply['error']}")
        return Steps(list(reply["samples_ns"]), list(reply["overhead_ns"]))

    def stop(self) -> None:
        for task in self.tasks.values():
            task.stop()
        self.tasks = {}

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


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
                        f"({size / med:.3f} GB/s), 4-byte step p50 {ovh / 1e3:7.1f} us, "
                        f"n={len(got.samples_ns)}",
                        flush=True,
                    )
    print(f"load average {os.getloadavg()}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        return serve(args[1:])
    if args[:1] == ["check"]:
        return check(args[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
