"""TensorFlow's gRPC runtime as processes: PS tasks and a worker task bound to a fabric.

:class:`TFCluster` starts ``tf.distribute.Server`` tasks (:mod:`pytest_tfgrpc.roles.tf_task`, run
as a script by the Python of an environment with TensorFlow: this one if it imports TensorFlow,
else ``TFGRPC_TF_PYTHON``) on the fabric's address, and asks its worker task to time TensorFlow's
own transfers. No TensorFlow is imported in this process. Each task runs here or, through its
launcher, on a node agent's host (``tfgrpc-node --tf-python``), run by that host's TensorFlow
Python; the worker's commands then travel on the agent's ``Run`` stream.

Every task's port is held (:meth:`~pytest_tfgrpc.roles.processes.Launcher.reserve_port`)
before any task starts, since each starts with the whole cluster spec, and until the cluster
stops. TensorFlow's server listens on every interface of its host (``tf.distribute.Server``
takes a port, not an address); the cluster spec, and so every transfer, names the fabric's
address.
"""

from __future__ import annotations

import importlib.util
import json
import os
import selectors
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.roles import tf_task
from pytest_tfgrpc.roles.processes import (
    LOCAL,
    ChildProcess,
    HeldPort,
    Launcher,
    ServerDied,
    ServerError,
)
from pytest_tfgrpc.roles.tf_task import TF_PYTHON_ENV
from pytest_tfgrpc.wire.fabric import Fabric, resolve_fabrics

__all__ = ["TF_PYTHON_ENV", "Steps", "TFCluster", "TFTaskError", "find_tf_python"]


class TFTaskError(ServerError):
    """A TensorFlow task that did not start, did not answer, or reported an error."""


def find_tf_python(given: str | None = None) -> tuple[str | None, str]:
    """The interpreter to run TensorFlow tasks with, or None and why not.

    This interpreter if TensorFlow is importable here; else ``given`` or ``$TFGRPC_TF_PYTHON``.
    """
    if importlib.util.find_spec("tensorflow") is not None:
        return sys.executable, "TensorFlow importable in this interpreter"
    given = given or os.environ.get(TF_PYTHON_ENV)
    if not given:
        return None, (
            "TensorFlow is not installed: pip install -e '.[tensorflow]' in a checkout of "
            "pytest-tfgrpc (or point "
            f"{TF_PYTHON_ENV} at the python of an environment that has tensorflow)"
        )
    if not (os.path.isfile(given) and os.access(given, os.X_OK)):
        return None, f"{TF_PYTHON_ENV}={given!r} is not an executable file"
    return given, f"TensorFlow tasks run by {given}"


@dataclass(frozen=True)
class Steps:
    """Timed steps of one measurement, the measured phase's wall time, and TF's per-step cost
    (steps on a one-element variable) measured just before them, all in ns."""

    samples_ns: list[int]
    overhead_ns: list[int]
    elapsed_ns: int = 0


class _Task(ChildProcess):
    """One task: ``target`` its ``host:port`` in the cluster spec, ``launcher`` where it runs."""

    def __init__(
        self,
        tf_python: str,
        job: str,
        index: int,
        cluster: Mapping[str, Sequence[str]],
        env: Mapping[str, str],
        lifetime: float,
        launcher: Launcher,
    ) -> None:
        argv = tf_task.task_argv(tf_python, job, index, json.dumps(cluster), lifetime)
        where = f" on host {launcher.host}" if launcher is not LOCAL else ""
        name = f"TensorFlow {job} task {index}{where}"
        super().__init__(argv, name=name, env=env, launcher=launcher)
        self.job = job
        self.target = cluster[job][index]
        self._buf = b""

    def send(self, doc: Mapping[str, Any]) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps(doc).encode() + b"\n")
        self._proc.stdin.flush()

    def read_line(self, timeout: float) -> dict[str, Any]:
        assert self._proc.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise TFTaskError(f"{self.name}: no answer within {timeout:g} s")
                chunk = os.read(self._proc.stdout.fileno(), 1 << 20)
                if not chunk:
                    death = self.died(grace=5.0)
                    raise death or TFTaskError(f"{self.name} closed its output")
                self._buf += chunk
        line, _, self._buf = self._buf.partition(b"\n")
        out: dict[str, Any] = json.loads(line)
        return out


class TFCluster:
    """``ps`` PS tasks and worker task 0 of TensorFlow's gRPC runtime on ``fabric`` (default
    loopback); a context manager. ``env`` is the environment of the task processes.
    PS task ``i`` runs through ``ps_launchers[i]`` (cyclically), the worker through
    ``worker_launcher``: here (the default) or on a node agent's host.

    ``target`` is PS task 0's address (what a P2P test measures against), ``targets`` every
    PS task's, ``ps`` and ``workers`` the tasks (each with its ``target`` and ``launcher``);
    :meth:`measure` and :meth:`run` time TensorFlow transfers on the worker.
    Raises :class:`TFTaskError` (with the task's stderr) when a task does not start.
    """

    def __init__(
        self,
        tf_python: str,
        env: Mapping[str, str] | None = None,
        *,
        fabric: Fabric | None = None,
        topology: Topology | None = None,
        lifetime: float = 3600.0,
        start_timeout: float = 180.0,
        ps_launchers: Sequence[Launcher] = (LOCAL,),
        worker_launcher: Launcher = LOCAL,
    ) -> None:
        self.tf_python = tf_python
        self.fabric = fabric if fabric is not None else resolve_fabrics(("lo",))[0]
        self.topology = topology if topology is not None else Topology(1, 1)
        if self.topology.workers != 1:
            raise ValueError(
                f"ps_topology(workers={self.topology.workers}): TensorFlow's engine runs one "
                "worker task"
            )
        self.env = dict(os.environ if env is None else env)
        self.env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        self.env.pop("PYTHONPATH", None)  # the TF environment's own packages
        self.lifetime = lifetime
        self.start_timeout = start_timeout
        if not ps_launchers:
            raise ValueError("ps_launchers: at least one (LOCAL: this host)")
        self.ps_launchers = tuple(ps_launchers)
        self.worker_launcher = worker_launcher
        self._ports: list[HeldPort] = []
        self.tasks: list[_Task] = []
        self.info: dict[str, Any] = {}
        self.targets: tuple[str, ...] = ()

    @property
    def target(self) -> str:
        return self.targets[0]

    @property
    def ps(self) -> tuple[_Task, ...]:
        return tuple(task for task in self.tasks if task.job == "ps")

    @property
    def workers(self) -> tuple[_Task, ...]:
        return tuple(task for task in self.tasks if task.job == "worker")

    @property
    def launcher(self) -> Launcher:
        """Where PS task 0 runs (a P2P test's server end)."""
        return self.ps_launchers[0]

    @property
    def pids(self) -> dict[str, int]:
        return {f"tf {t.job} {i}": t.pid for i, t in enumerate(self.tasks)}

    @property
    def version(self) -> str:
        return str(self.info.get("worker", {}).get("tensorflow", ""))

    def start(self) -> TFCluster:
        """Hold every task's port, then start every task with the cluster spec they make and
        wait until each serves; everything started is stopped if one does not."""
        zone = f"%{self.fabric.zone}" if self.fabric.zone else ""
        address = self.fabric.address + zone
        placed = [
            ("ps", i, self.ps_launchers[i % len(self.ps_launchers)])
            for i in range(self.topology.ps)
        ]
        placed.append(("worker", 0, self.worker_launcher))
        try:
            for _, _, launcher in placed:
                self._ports.append(launcher.reserve_port(address))
            hosts = [held.host_port for held in self._ports]
            cluster = {"ps": hosts[:-1], "worker": hosts[-1:]}
            for job, index, launcher in placed:
                self.tasks.append(
                    _Task(self.tf_python, job, index, cluster, self.env, self.lifetime, launcher)
                )
            for task in self.tasks:
                self.info[task.job] = task.read_line(self.start_timeout)
        except ServerError as exc:
            self.stop()
            raise TFTaskError(
                f"TensorFlow cluster did not start on {self.fabric.name}: {exc}"
            ) from None
        except BaseException:
            self.stop()
            raise
        self.info["cluster"] = cluster
        self.targets = tuple(cluster["ps"])
        return self

    def died(self, grace: float = 0.5) -> ServerDied | None:
        """The first task found dead, waiting ``grace`` s for each."""
        for task in self.tasks:
            death = task.died(grace)
            if death is not None:
                return death
        return None

    def run(
        self,
        kind: str,
        variables: Sequence[Sequence[Any]],
        *,
        iterations: int,
        warmup: int,
        max_seconds: float,
        warmup_seconds: float | None = None,
        overhead_iterations: int = 0,
        op: str = "slice",
    ) -> Steps:
        """Time ``kind`` (pull, push, echo, ps; see :mod:`pytest_tfgrpc.roles.tf_task`) of
        ``variables`` (``[name, ps, shape, dtype]``) on the worker."""
        worker = self.tasks[-1]
        command = {
            "kind": kind,
            "variables": [list(v) for v in variables],
            "iterations": iterations,
            "warmup": warmup,
            "max_seconds": max_seconds,
            "warmup_seconds": max_seconds if warmup_seconds is None else warmup_seconds,
            "overhead_iterations": overhead_iterations,
            "op": op,
        }
        worker.send(command)
        # Warm-up and timing are each bounded; building a graph and its variables is quick.
        reply = worker.read_line(2 * max_seconds + (warmup_seconds or max_seconds) + 120.0)
        if "error" in reply:
            raise TFTaskError(f"TensorFlow worker: {reply['error']}")
        return Steps(
            list(reply["samples_ns"]), list(reply["overhead_ns"]), int(reply["elapsed_ns"])
        )

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
        """A float32 variable of ``size`` bytes on PS 0 pulled by the worker (the speed
        harness's contender rows)."""
        return self.run(
            "pull",
            [tf_task.flat_variable(size)],
            iterations=iterations,
            warmup=warmup,
            max_seconds=max_seconds,
            overhead_iterations=overhead_iterations,
            op=op,
        )

    def stop(self) -> None:
        while self.tasks:
            self.tasks.pop().stop(timeout=10.0)
        while self._ports:
            self._ports.pop().release()

    def __enter__(self) -> TFCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<TFCluster {self.fabric.name} {', '.join(self.targets) or 'not started'}>"
