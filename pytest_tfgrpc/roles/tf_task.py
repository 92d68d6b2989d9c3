"""A task of TensorFlow's own gRPC runtime: a ``tf.distribute.Server`` process, PS or worker.

Run by the Python of an environment where TensorFlow is installed, as a script (this file
imports only the standard library and TensorFlow, so that environment needs no
pytest-tfgrpc)::

    TF_PYTHON tf_task.py serve --job ps     --index I --cluster JSON --lifetime S
    TF_PYTHON tf_task.py serve --job worker --index 0 --cluster JSON --lifetime S

Each task prints one JSON line when it serves (pid, TensorFlow's version) and exits on stdin
EOF (its lifeline: the parent holds the other end), on SIGTERM, when its parent dies
(``PR_SET_PDEATHSIG``) or after ``--lifetime`` seconds, whichever comes first.

The worker measures on command (one JSON line on stdin, one JSON line back) with TensorFlow's
own transfers, as one graph step of a ``tf.compat.v1.Session`` on its own server (the classic
between-graph replication a ``tf.distribute.Server`` serves); variables live on PS tasks:

- ``pull``: an op on the worker reads a PS variable (``v[0] + 1``): the PS reads it and the
  whole tensor crosses through TF's ``RecvTensor`` RPC; the worker does no per-byte work.
  ``op="sum"`` reads every element on the worker instead (a cross-check).
- ``push``: the PS adds a gradient held by the worker to its variable (``assign_add``): the PS
  fetches the gradient from the worker through ``RecvTensor``, the step ends when the PS is done.
- ``echo``: the PS takes the worker's tensor (``identity`` placed on the PS) and the worker
  reads it back: one round trip of the whole tensor.
- ``ps``: one exchange with every PS: the worker pulls every listed variable and pushes a
  gradient of the same shape to each, all in one step (``variables``: ``[name, ps, shape,
  dtype]`` lists, a model profile's real shapes).

Every step is timed with ``perf_counter_ns`` after warm-up steps, bounded in count and time,
the cyclic GC off while timing. ``overhead_iterations`` also times steps of a one-element
variable placed the same way: TF's own per-step cost, returned beside the samples.

What a task accepts is decided here, once: :func:`check_cluster` (the cluster spec) and
:func:`check_command` (a worker's command: kinds, names, dtypes, counts, bytes and seconds
bounded). The task checks both; a node agent that starts a task (``tfgrpc-node --tf-python``)
checks them before they reach it, as it checks every role's parameters.

TensorFlow's server takes a port, not an address: it listens on every interface of its host
(``[::]:port``, IPv4 and IPv6), while the cluster spec, and so every transfer, names the
fabric's address. It serves no TLS and authenticates no caller.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

#: The environment variable naming the Python of an environment that has TensorFlow.
TF_PYTHON_ENV = "TFGRPC_TF_PYTHON"
OPS = ("slice", "sum")
KINDS = ("pull", "push", "echo", "ps")
JOBS = ("ps", "worker")
#: The dtypes a variable may have, with their item sizes in bytes.
DTYPES = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
    "complex64": 8, "complex128": 16,
}  # fmt: skip
#: Bounds of a command: what one step may allocate and move, and how long it may run.
MAX_VARIABLES = 4096
MAX_VARIABLE_BYTES = 2**31 - 1
MAX_STEP_BYTES = 2**35
MAX_ITERATIONS = 10_000_000
MAX_SECONDS = 3600.0
MAX_TASKS = 256
#: The longest line a task reads (a command of MAX_VARIABLES variables fits).
MAX_LINE_BYTES = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9_.:/@-]{1,200}")
_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+(%[A-Za-z0-9_.-]+)?\]|[A-Za-z0-9_.-]{1,253}):([0-9]{1,5})")


class TaskInputError(ValueError):
    """A cluster spec or a command outside what a task accepts; the message says which part."""


def _int(doc: dict[str, Any], key: str, low: int, high: int, default: int | None = None) -> int:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise TaskInputError(f"{key}={value!r}: a whole number from {low} to {high}")
    return value


def _seconds(doc: dict[str, Any], key: str, default: float | None = None) -> float:
    value = doc.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TaskInputError(f"{key}={value!r}: seconds, from 0 to {MAX_SECONDS:g}")
    if not 0.0 <= value <= MAX_SECONDS:
        raise TaskInputError(f"{key}={value!r}: seconds, from 0 to {MAX_SECONDS:g}")
    return float(value)


def check_cluster(text: str, job: str, index: int) -> dict[str, list[str]]:
    """The cluster spec ``text`` (JSON: ``{"ps": ["host:port", ...], "worker": ["host:port"]}``)
    if task ``index`` of ``job`` is in it and it is well formed, else :class:`TaskInputError`:
    exactly the jobs ps and worker, 1 to 256 PS tasks, one worker, each task ``host:port``."""
    if job not in JOBS:
        raise TaskInputError(f"job {job!r}: expected one of {', '.join(JOBS)}")
    if len(text) > MAX_LINE_BYTES:
        raise TaskInputError(f"cluster spec of {len(text)} bytes, over {MAX_LINE_BYTES}")
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TaskInputError(f"cluster spec is not JSON: {exc}") from None
    if not isinstance(doc, dict) or sorted(doc) != sorted(JOBS):
        raise TaskInputError('cluster spec: expected {"ps": [...], "worker": [...]}')
    for name, tasks in doc.items():
        if not isinstance(tasks, list) or not 1 <= len(tasks) <= (MAX_TASKS if name == "ps" else 1):
            most = MAX_TASKS if name == "ps" else 1
            raise TaskInputError(f"cluster spec: job {name!r} needs 1 to {most} tasks")
        for task in tasks:
            match = _HOST.fullmatch(task) if isinstance(task, str) else None
            if match is None or not 1 <= int(match.group(3)) <= 65535:
                raise TaskInputError(f"cluster spec: task {task!r} of job {name!r} is no host:port")
    if not 0 <= index < len(doc[job]):
        raise TaskInputError(f"task {index} of job {job!r} is not in the cluster spec")
    return {name: list(tasks) for name, tasks in doc.items()}


def check_command(doc: Any, ps_tasks: int) -> dict[str, Any]:
    """A worker's command (a decoded JSON line) if it is within bounds, else
    :class:`TaskInputError`: a known ``kind`` and ``op``, 1 to :data:`MAX_VARIABLES` variables
    ``[name, ps, shape, dtype]`` on PS tasks below ``ps_tasks``, each at most
    :data:`MAX_VARIABLE_BYTES` and all together at most :data:`MAX_STEP_BYTES` (twice: a
    gradient beside each variable), counts and seconds bounded."""
    if not isinstance(doc, dict):
        raise TaskInputError("a command is a JSON object")
    unknown = set(doc) - {
        "kind", "variables", "iterations", "warmup", "max_seconds", "warmup_seconds",
        "overhead_iterations", "op",
    }  # fmt: skip
    if unknown:
        raise TaskInputError(f"unknown command fields: {', '.join(sorted(map(str, unknown)))}")
    if doc.get("kind") not in KINDS:
        raise TaskInputError(f"kind={doc.get('kind')!r}: expected one of {', '.join(KINDS)}")
    if doc.get("op", "slice") not in OPS:
        raise TaskInputError(f"op={doc.get('op')!r}: expected one of {', '.join(OPS)}")
    variables = doc.get("variables")
    if not isinstance(variables, list) or not 1 <= len(variables) <= MAX_VARIABLES:
        raise TaskInputError(f"variables: a list of 1 to {MAX_VARIABLES} [name, ps, shape, dtype]")
    total = 0
    for variable in variables:
        if not (isinstance(variable, list) and len(variable) == 4):
            raise TaskInputError(f"variable {variable!r}: expected [name, ps, shape, dtype]")
        name, ps, shape, dtype = variable
        if not (isinstance(name, str) and _NAME.fullmatch(name)):
            raise TaskInputError(f"variable name {name!r}: 1-200 of A-Z a-z 0-9 _ . : / @ -")
        if isinstance(ps, bool) or not isinstance(ps, int) or not 0 <= ps < ps_tasks:
            raise TaskInputError(f"variable {name}: ps={ps!r}, and the cluster has {ps_tasks}")
        if dtype not in DTYPES:
            raise TaskInputError(f"variable {name}: dtype {dtype!r}; known: {', '.join(DTYPES)}")
        dims = isinstance(shape, list) and 1 <= len(shape) <= 8
        if not dims or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in shape):
            raise TaskInputError(f"variable {name}: shape {shape!r}: 1 to 8 dimensions, each >= 1")
        nbytes = DTYPES[dtype]
        for dim in shape:
            nbytes *= dim
        if nbytes > MAX_VARIABLE_BYTES:
            raise TaskInputError(f"variable {name}: {nbytes} bytes, over {MAX_VARIABLE_BYTES}")
        total += nbytes
    if 2 * total > MAX_STEP_BYTES:
        raise TaskInputError(f"variables of {total} bytes in all, over {MAX_STEP_BYTES // 2}")
    _int(doc, "iterations", 1, MAX_ITERATIONS)
    _int(doc, "warmup", 0, MAX_ITERATIONS)
    _int(doc, "overhead_iterations", 0, MAX_ITERATIONS, default=0)
    _seconds(doc, "max_seconds")
    _seconds(doc, "warmup_seconds", default=0.0)
    return doc


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


def _ready(job: str, index: int) -> None:
    import tensorflow as tf

    doc = {
        "job": job,
        "index": index,
        "pid": os.getpid(),
        "tensorflow": tf.version.VERSION,
        "tensorflow_git": tf.version.GIT_VERSION,
        "python": sys.version.split()[0],
    }
    print(json.dumps(doc), flush=True)


class _Worker:
    """The worker's graph: variables on PS tasks, and the ops that move them."""

    def __init__(self, server: Any, ps_tasks: int) -> None:
        import tensorflow as tf

        self.tf = tf
        self.ps_tasks = ps_tasks
        self.graph = tf.Graph()
        # Grappler off: the graph runs as written, so no optimizer folds an echo's identity
        # on the PS into a local read (the transfers are the measurement).
        config = tf.compat.v1.ConfigProto()
        config.graph_options.rewrite_options.disable_meta_optimizer = True
        self.session = tf.compat.v1.Session(server.target, graph=self.graph, config=config)
        self.ops: dict[Any, Any] = {}
        self.variables: dict[tuple[str, str], Any] = {}
        self._init: list[Any] = []

    def _variable(self, device: str, name: str, shape: Sequence[int], dtype: str) -> Any:
        """A variable of ``shape`` on ``device``, made once."""
        key = (device, f"{name}_{dtype}_{'x'.join(map(str, shape))}")
        found = self.variables.get(key)
        if found is not None:
            return found
        tf = self.tf
        with tf.device(device):
            init = tf.ones if device.startswith("/job:worker") else tf.zeros
            var = tf.compat.v1.Variable(
                init(list(shape), dtype),
                name=name.replace("/", "_").replace("@", "_at_"),
                use_resource=True,
            )
        self.variables[key] = var
        self._init.append(var.initializer)
        return var

    def _first(self, value: Any, kind: str) -> Any:
        """A scalar of ``value`` computed on the current device: the whole tensor must come."""
        tf = self.tf
        flat = tf.reshape(value, [-1])
        if kind == "sum":
            return tf.reduce_sum(tf.cast(flat, tf.float32) + 1.0)
        return tf.cast(flat[0], tf.float32) + 1.0

    def op(self, cmd: dict[str, Any]) -> Any:
        kind = str(cmd["kind"])
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
        variables = [
            (str(n), int(p), tuple(int(d) for d in s), str(t)) for n, p, s, t in cmd["variables"]
        ]
        op_kind = str(cmd.get("op", "slice"))
        if op_kind not in OPS:
            raise ValueError(f"unknown op {op_kind!r}; known: {', '.join(OPS)}")
        key = (kind, op_kind, tuple(variables))
        if key in self.ops:
            return self.ops[key]
        tf = self.tf
        worker = "/job:worker/task:0"
        outs = []
        with self.graph.as_default():
            for name, ps, shape, dtype in variables:
                ps_device = f"/job:ps/task:{ps}"
                if kind in ("pull", "ps"):
                    var = self._variable(ps_device, name, shape, dtype)
                    with tf.device(worker):
                        outs.append(self._first(var.value(), op_kind))
                if kind in ("push", "ps"):
                    var = self._variable(ps_device, name, shape, dtype)
                    grad = self._variable(worker, "g_" + name, shape, dtype)
                    with tf.device(ps_device):
                        outs.append(var.assign_add(grad.value(), read_value=False))
                if kind == "echo":
                    grad = self._variable(worker, "g_" + name, shape, dtype)
                    with tf.device(ps_device):
                        there = tf.identity(grad.value())
                    with tf.device(worker):
                        outs.append(self._first(there, op_kind))
            step = tf.group(*outs)
            if self._init:
                self.session.run(self._init)
                self._init = []
        self.ops[key] = step
        return step

    def time_steps(
        self, op: Any, iterations: int, warmup: int, max_seconds: float, warmup_seconds: float
    ) -> tuple[list[int], int]:
        run = self.session.run
        deadline = time.monotonic() + warmup_seconds
        for _ in range(warmup):
            run(op)
            if time.monotonic() > deadline:
                break
        samples: list[int] = []
        clock = time.perf_counter_ns
        deadline = time.monotonic() + max_seconds
        was_enabled = gc.isenabled()
        gc.disable()
        start = clock()
        try:
            for _ in range(iterations):
                t0 = clock()
                run(op)
                samples.append(clock() - t0)
                if time.monotonic() > deadline:
                    break
        finally:
            elapsed = clock() - start
            if was_enabled:
                gc.enable()
        return samples, elapsed

    def measure(self, cmd: dict[str, Any]) -> dict[str, Any]:
        check_command(cmd, self.ps_tasks)
        iterations, warmup = int(cmd["iterations"]), int(cmd["warmup"])
        max_seconds = float(cmd["max_seconds"])
        warmup_seconds = float(cmd.get("warmup_seconds", max_seconds))
        main = self.op(cmd)
        overhead: list[int] = []
        overhead_iterations = int(cmd.get("overhead_iterations", 0))
        if overhead_iterations:
            tiny = [["overhead", 0, [1], "float32"]]
            tiny_op = self.op({**cmd, "variables": tiny})
            overhead, _ = self.time_steps(tiny_op, overhead_iterations, 2, 1.0, 1.0)
        samples, elapsed = self.time_steps(main, iterations, warmup, max_seconds, warmup_seconds)
        return {"samples_ns": samples, "elapsed_ns": elapsed, "overhead_ns": overhead}


def serve(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="tf_task.py serve")
    p.add_argument("--job", choices=("ps", "worker"), required=True)
    p.add_argument("--index", type=int, default=0)
    p.add_argument("--cluster", required=True, help='{"ps": ["h:p"], "worker": ["h:p"]}')
    p.add_argument("--lifetime", type=float, default=3600.0)
    args = p.parse_args(argv)
    try:
        cluster = check_cluster(args.cluster, args.job, args.index)
    except TaskInputError as exc:
        p.error(str(exc))
    _tie_to_parent(args.lifetime)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(cluster),
        job_name=args.job,
        task_index=args.index,
        protocol="grpc",
        start=True,
    )
    if args.job == "ps":
        gc.freeze()
        _ready(args.job, args.index)
        while os.read(0, 4096):
            pass
        os._exit(0)  # TF's server has no clean stop; the process ends here
    tf.compat.v1.disable_eager_execution()
    worker = _Worker(server, len(cluster["ps"]))
    gc.freeze()
    _ready(args.job, args.index)
    for line in sys.stdin:
        try:
            if len(line) > MAX_LINE_BYTES:
                raise TaskInputError(f"a command line of {len(line)} bytes")
            reply = worker.measure(json.loads(line))
        except Exception as exc:  # reported to the parent, which fails the measurement
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()
    os._exit(0)


#: How a task's Python runs this file: as a script, without its directory or the working
#: directory on ``sys.path``, so that no module of a checkout shadows one TensorFlow imports.
RUN_SCRIPT = (
    "import runpy, sys; sys.path.pop(0); sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)


def task_argv(tf_python: str, job: str, index: int, cluster: str, lifetime: float) -> list[str]:
    """The command that runs task ``index`` of ``job`` with ``tf_python`` (a TensorFlow
    environment's interpreter) in the cluster spec ``cluster`` (JSON)."""
    argv = [tf_python, "-c", RUN_SCRIPT, os.path.abspath(__file__), "serve", "--job", job]
    return [*argv, "--index", str(index), "--cluster", cluster, "--lifetime", f"{lifetime:g}"]


def flat_variable(nbytes: int, name: str = "v", ps: int = 0) -> list[Any]:
    """A command's variable of ``nbytes`` bytes (float32, uint8 when not a multiple of 4)."""
    if nbytes % 4:
        return [name, ps, [nbytes], "uint8"]
    return [name, ps, [max(1, nbytes // 4)], "float32"]


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["serve"]:
        return serve(args[1:])
    print(__doc__)
    return 2


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())
