"""A parameter-server cluster on one fabric: P PS server processes and W worker processes.

:class:`PSCluster` starts the PS tasks (tensor servers, which also serve
``tfgrpc.ParameterServer``) and the workers (:mod:`pytest_tfgrpc.ps.worker`), hands jobs to the
workers, starts them together and collects what they measured, always with a deadline. Every
process it starts is tied to it: PS servers and workers stop when their stdin closes (so when
this process ends, however it ends), :meth:`PSCluster.stop` stops them in order, and an
``atexit`` hook stops any still running. A process that dies is reported with its exit status
and the end of its stderr (:class:`~pytest_tfgrpc.roles.processes.ServerDied`).
"""

from __future__ import annotations

import os
import selectors
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, overload

import grpc

from pytest_tfgrpc.model.placement import Topology
from pytest_tfgrpc.native import ENGINES, binaries
from pytest_tfgrpc.ps import jobs as protocol
from pytest_tfgrpc.ps.jobs import FromWorker, JobMessage, Reply
from pytest_tfgrpc.roles.native_server import start_native_server
from pytest_tfgrpc.roles.parameter_server import method
from pytest_tfgrpc.roles.processes import (
    LOCAL,
    ChildProcess,
    Launcher,
    ServerDied,
    ServerError,
    ServerProcess,
    describe_exit,
)
from pytest_tfgrpc.wire._proto import service_pb2
from pytest_tfgrpc.wire.client import BenchmarkError, connect, explain, rpc_timeout
from pytest_tfgrpc.wire.fabric import Fabric
from pytest_tfgrpc.wire.security import TOKEN_ENV, TOKEN_KEY, new_token

__all__ = ["ClusterError", "PSCluster", "Window", "WorkerProcess"]


class Window(Protocol):
    """Told when a job's workers are ready to go (with the ``(local, peer)`` ends of their
    connections to the PS tasks, as they reported them) and when their replies are in."""

    def start(self, connections: Sequence[tuple[str, str]] = ()) -> None: ...

    def stop(self) -> None: ...


class ClusterError(ServerError):
    """A cluster that could not start, or a job that did not finish in time."""


class WorkerProcess(ChildProcess):
    """One worker process; it speaks the worker protocol (``protos/tfgrpc/worker.proto``,
    framed by :mod:`pytest_tfgrpc.ps.jobs`) on its stdin and stdout."""

    def __init__(
        self,
        index: int,
        *,
        env: Mapping[str, str] | None = None,
        launcher: Launcher = LOCAL,
        engine: str = "grpcio",
    ) -> None:
        argv = (
            [str(binaries().worker)]
            if engine == "native"
            else [sys.executable, "-m", "pytest_tfgrpc.ps.worker"]
        )
        super().__init__(
            argv,
            name=f"{'native ' if engine == 'native' else ''}PS worker {index}" + _on(launcher),
            env=env,
            launcher=launcher,
        )
        self.index = index
        #: What the worker is: ``grpcio`` (ps/worker.py) or ``native`` (C++).
        self.engine = engine
        self._frames = protocol.Frames()

    def fileno(self) -> int:
        assert self._proc.stdout is not None
        return int(self._proc.stdout.fileno())

    def send(self, message: protocol.ToWorker) -> None:
        """Write one message to the worker; a worker that is gone raises ServerDied."""
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(protocol.frame(protocol.to_worker(message)))
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise self.died(grace=2.0) or ClusterError(f"{self.name} stopped reading") from None

    def take_message(self) -> FromWorker | None:
        """A complete message already read, if there is one; bytes that are not a message of
        the protocol raise ClusterError naming the worker."""
        try:
            body = self._frames.take()
            return None if body is None else protocol.reply_of(body)
        except protocol.MessageError as error:
            raise ClusterError(f"{self.name} wrote {error}") from None

    def read_more(self) -> bool:
        """Read what the worker wrote; False at end of file (the worker exited)."""
        chunk = os.read(self.fileno(), 1 << 20)
        self._frames.feed(chunk)
        return bool(chunk)

    def __repr__(self) -> str:
        return f"<WorkerProcess {self.index} pid={self.pid}>"


def _on(launcher: Launcher) -> str:
    return "" if launcher is LOCAL else f" on host {launcher.host}"


def _check_engine(engine: str, role: str) -> None:
    """``engine`` is one the cluster's ``role`` (``workers`` or ``ps``) can run."""
    if engine not in ENGINES:
        raise ValueError(f"{role}_engine={engine!r}: expected one of {', '.join(ENGINES)}")


class PSCluster:
    """``topology.ps`` PS processes and ``topology.workers`` worker processes on ``fabric``.

    Use as a context manager, or call :meth:`stop`. ``ps`` holds the PS server handles
    (``.target``, ``.pid``), ``workers`` the worker handles (``.pid``). PS tasks refuse
    tensor messages over ``max_tensor_bytes`` (None: the largest gRPC carries), and take jobs
    only from this handle (a token of its own).

    ``workers_engine="native"`` starts the native engine's C++ workers
    (``tfgrpc-native-worker``, same protocol and PS calls) instead of Python ones;
    ``ps_engine="native"`` starts native PS tasks (``tfgrpc-native-server`` with the job
    token: the same PS service) instead of Python ones. Either pairing works with either:
    every PS call carries the cluster's job token, which workers get in their environment.
    Native roles speak the run's TLS and run here or through agents (from the agent host's
    own build). Raises :class:`~pytest_tfgrpc.native.NativeNotBuilt` when they are not built
    here (an agent's host without them refuses to start them, naming the host), ValueError
    for an engine that is neither.
    """

    def __init__(
        self,
        fabric: Fabric,
        topology: Topology,
        *,
        env: Mapping[str, str] | None = None,
        ready_timeout: float = 60.0,
        ps_launchers: Sequence[Launcher] = (LOCAL,),
        worker_launchers: Sequence[Launcher] = (LOCAL,),
        max_tensor_bytes: int | None = None,
        workers_engine: str = "grpcio",
        ps_engine: str = "grpcio",
    ) -> None:
        _check_engine(workers_engine, "workers")
        _check_engine(ps_engine, "ps")
        self.fabric = fabric
        #: The workers' engine: ``grpcio`` (Python workers) or ``native`` (C++ workers).
        self.workers_engine = workers_engine
        #: The PS tasks' engine: ``grpcio`` (Python) or ``native`` (C++).
        self.ps_engine = ps_engine
        self.topology = topology
        #: The largest tensor message a PS takes, if a limit below gRPC's was set.
        self.max_tensor_bytes = max_tensor_bytes
        self.ps: tuple[ServerProcess, ...] = ()
        self.workers: tuple[WorkerProcess, ...] = ()
        self._channels: list[grpc.Channel] = []
        self._job_ids = 0
        # The cluster's calls belong to this driver and its workers: its PS tasks take them
        # only with this token.
        self._token = new_token()
        ps_env = {**(os.environ if env is None else env), TOKEN_ENV: self._token}
        try:
            # Workers first: their interpreters start while the PS servers come up.
            self.workers = tuple(
                WorkerProcess(
                    i,
                    env=ps_env,
                    launcher=worker_launchers[i % len(worker_launchers)],
                    engine=workers_engine,
                )
                for i in range(topology.workers)
            )
            threads = str(max(16, 2 * topology.workers + 4))  # a blocked pull holds a thread
            for index in range(topology.ps):
                launcher = ps_launchers[index % len(ps_launchers)]
                name = f"PS {index}" + (_on(launcher) or f" on {fabric.name}")
                if ps_engine == "native":
                    # Completion-queue threads, not handler threads: a pull parked at the
                    # barrier holds none.
                    task = start_native_server(
                        fabric,
                        threads=2,
                        env=ps_env,
                        ready_timeout=ready_timeout,
                        name=f"native {name}",
                        launcher=launcher,
                        max_tensor_bytes=max_tensor_bytes,
                    )
                else:
                    task = ServerProcess.start(
                        fabric,
                        extra_args=("--workers", threads),
                        env=ps_env,
                        ready_timeout=ready_timeout,
                        name=name,
                        launcher=launcher,
                        max_tensor_bytes=max_tensor_bytes,
                    )
                self.ps = (*self.ps, task)
            hellos = self._collect(
                self.workers, time.monotonic() + ready_timeout, "start", protocol.Hello
            )
            for worker, hello in zip(self.workers, hellos, strict=True):
                if not isinstance(hello, protocol.Hello) or hello.pid != worker.pid:
                    raise ClusterError(f"{worker.name} greeted with {hello!r}")
            self._channels = [connect(ps.target, server=ps) for ps in self.ps]
        except BaseException:
            self.stop()
            raise

    @property
    def targets(self) -> tuple[str, ...]:
        """The PS targets, by task index."""
        return tuple(ps.target for ps in self.ps)

    def channel(self, task: int) -> grpc.Channel:
        """The parent's channel to PS ``task`` (for control calls, not for measuring)."""
        return self._channels[task]

    @property
    def pids(self) -> tuple[int, ...]:
        """Every process of the cluster: PS tasks, then workers."""
        return (*(ps.pid for ps in self.ps), *(w.pid for w in self.workers))

    # --- failures ------------------------------------------------------------------------
    def died(self, grace: float = 0.5) -> ServerDied | None:
        """The death of a PS or a worker, if one has died (the first found)."""
        for ps in self.ps:
            if ps.poll() is not None:
                death = ps.died(grace)
                if death is not None:
                    return death
        for worker in self.workers:
            if worker.poll() is not None:
                death = worker.died(grace)
                if death is not None:
                    return death
        return None

    def _failure(self, message: str) -> BaseException:
        # A worker's RPC error is usually the symptom of a PS that died: report the cause.
        return self.died(grace=1.0) or BenchmarkError(message)

    # --- PS control ----------------------------------------------------------------------
    @property
    def credentials(self) -> tuple[tuple[str, str], ...]:
        """The metadata every call to this cluster's PS tasks carries: its job token."""
        return ((TOKEN_KEY, self._token),)

    def next_job_id(self) -> int:
        self._job_ids += 1
        return self._job_ids

    def configure(self, jobs: Sequence[service_pb2.PSJob], timeout: float = 60.0) -> None:
        """Start ``jobs[i]`` on PS ``jobs[i].task`` (dropping its previous job and weights)."""
        self._call_all("Configure", [job.task for job in jobs], jobs, service_pb2.PSJob, timeout)

    def job_stats(
        self, tasks: Sequence[int] | None = None, timeout: float = 10.0
    ) -> tuple[service_pb2.PSJobStats, ...]:
        """What each PS of ``tasks`` (default: all) saw of its current job, in that order."""
        chosen = list(range(len(self.ps))) if tasks is None else list(tasks)
        requests = [service_pb2.StatusRequest() for _ in chosen]
        return self._call_all("JobStats", chosen, requests, service_pb2.StatusRequest, timeout)

    def _call_all(
        self,
        name: str,
        tasks: Sequence[int],
        requests: Sequence[Any],
        request_type: Any,
        timeout: float,
    ) -> tuple[service_pb2.PSJobStats, ...]:
        replies = []
        for task, request in zip(tasks, requests, strict=True):
            if not 0 <= task < len(self.ps):
                raise ValueError(f"task {task}: the cluster has PS tasks 0-{len(self.ps) - 1}")
            ps, channel = self.ps[task], self._channels[task]
            call = channel.unary_unary(
                method(name),
                request_serializer=request_type.SerializeToString,
                response_deserializer=service_pb2.PSJobStats.FromString,
            )
            try:
                replies.append(call(request, timeout=timeout, metadata=self.credentials))
            except grpc.RpcError as error:
                raise explain(error, ps, name) from None
        return tuple(replies)

    # --- worker jobs ---------------------------------------------------------------------
    @overload
    def run(
        self,
        jobs: Sequence[protocol.ThroughputJob],
        timeout: float,
        window: Window | None = None,
    ) -> list[protocol.ThroughputReply]: ...

    @overload
    def run(
        self,
        jobs: Sequence[protocol.SyncSGDJob],
        timeout: float,
        window: Window | None = None,
    ) -> list[protocol.SyncSGDReply]: ...

    def run(
        self, jobs: Sequence[JobMessage], timeout: float, window: Window | None = None
    ) -> Sequence[Reply]:
        """Give ``jobs[i]`` to worker ``i``, start them together, return their results.

        ``window`` is started once every worker is connected and ready, before they are told
        to go, and stopped once every reply is in (the workers keep their connections between
        jobs): to read the connections' TCP state around the job.

        With fewer jobs than workers, the workers after the last job stay idle. Raises
        ServerDied when a worker or a PS dies, BenchmarkError when a worker reports an error,
        ClusterError when they do not finish within ``timeout`` seconds.
        """
        if not 1 <= len(jobs) <= len(self.workers):
            raise ValueError(f"{len(jobs)} jobs for {len(self.workers)} workers")
        busy = self.workers[: len(jobs)]
        deadline = time.monotonic() + timeout
        for worker, job in zip(busy, jobs, strict=True):
            worker.send(job)
        self._start(busy, deadline, ready=window.start if window is not None else None)
        replies = self._collect(
            busy, deadline, "run", (protocol.ThroughputReply, protocol.SyncSGDReply)
        )
        if window is not None:
            window.stop()
        out: list[Reply] = []
        for worker, job, reply in zip(busy, jobs, replies, strict=True):
            wanted = (
                protocol.ThroughputReply
                if isinstance(job, protocol.ThroughputJob)
                else protocol.SyncSGDReply
            )
            if not isinstance(reply, wanted):
                raise ClusterError(
                    f"{worker.name} answered a {type(job).__name__} with a {type(reply).__name__}"
                )
            out.append(reply)
        return out

    def _start(
        self,
        busy: Sequence[WorkerProcess],
        deadline: float,
        before: Callable[[], None] | None = None,
        ready: Callable[[Sequence[tuple[str, str]]], None] | None = None,
    ) -> None:
        """The start barrier of jobs sent to ``busy``: run ``before`` (what must happen
        between the job and Ready), wait for every worker's Ready, run ``ready`` with the ends
        of their connections they reported (every worker connected, none started), then tell
        all to go; if any of that fails, call the job off
        at every worker still running."""
        try:
            if before is not None:
                before()
            said = self._collect(busy, deadline, "prepare", protocol.Ready)
            if ready is not None:
                ends = [
                    (local, peer)
                    for message in said
                    if isinstance(message, protocol.Ready)
                    for local, _, peer in (end.partition(">") for end in message.connections)
                ]
                ready(ends)
        except Exception:
            for worker in busy:
                if worker.poll() is None:
                    worker.send(protocol.Go(go=False))
            raise
        for worker in busy:
            worker.send(protocol.Go(go=True))

    def allreduce(
        self,
        nbytes: int,
        *,
        algorithm: str,
        warmup: int,
        iterations: int,
        seconds: float,
        check: bool,
        ranks: int | None = None,
    ) -> list[protocol.AllReduceReply]:
        """All-reduce ``nbytes`` of float32 among the first ``ranks`` workers (default: all),
        the workers talking to each other, no PS: each serves ``tfgrpc.worker.Collective`` on
        its own host's fabric address, learns the others', then after the start barrier runs
        ``warmup`` and at most ``iterations`` measured all-reduces, none started after
        ``seconds``. Returns every rank's reply, by rank.

        Raises ValueError for fewer than two ranks or more than the workers,
        :class:`~pytest_tfgrpc.ps.jobs.MessageError` for a job out of range (an algorithm,
        a size), BenchmarkError for native workers (they do not run it), and as :meth:`run`
        does otherwise."""
        count = len(self.workers) if ranks is None else ranks
        if not 2 <= count <= len(self.workers):
            raise ValueError(
                f"an all-reduce needs 2 to {len(self.workers)} ranks (the cluster's workers), "
                f"not {count}"
            )
        if self.workers_engine != "grpcio":
            raise BenchmarkError(
                f"all-reduce runs in the grpcio workers; this cluster's are {self.workers_engine}"
            )
        busy = self.workers[:count]
        jobs = [
            protocol.AllReduceJob(
                rank=rank,
                ranks=count,
                bind=worker.launcher.address or self.fabric.address,
                nbytes=nbytes,
                algorithm=algorithm,
                warmup=warmup,
                iterations=iterations,
                seconds=seconds,
                check=check,
            )
            for rank, worker in enumerate(busy)
        ]
        for job in jobs:
            protocol.check_allreduce(job)
        # Each all-reduce moves the buffer about twice through every rank, at 1 MB/s at worst.
        deadline = time.monotonic() + seconds + rpc_timeout(2 * nbytes * (warmup + 1)) + 60.0
        for worker, job in zip(busy, jobs, strict=True):
            worker.send(job)

        def exchange_addresses() -> None:
            listening = self._collect(busy, deadline, "listen", protocol.Listening)
            peers = protocol.Peers(
                addresses=[m.address for m in listening if isinstance(m, protocol.Listening)]
            )
            for worker in busy:
                worker.send(peers)

        self._start(busy, deadline, exchange_addresses)
        replies = self._collect(busy, deadline, "run", protocol.AllReduceReply)
        return [r for r in replies if isinstance(r, protocol.AllReduceReply)]

    def sync_sgd(
        self,
        shards: Sequence[Sequence[tuple[str, int, int]]],
        *,
        warmup: int,
        steps: int,
        warmup_seconds: float,
        max_seconds: float,
        timeout_s: float,
        workers: int,
        chunk_bytes: int,
        learning_rate: float,
        init: int,
        barrier_timeout: float,
        check: bool = False,
        window: Window | None = None,
    ) -> tuple[list[protocol.SyncSGDReply], tuple[service_pb2.PSJobStats, ...]]:
        """Run one sync-SGD job: PS ``p`` owns ``shards[p]`` (``(tensor, offset, nbytes)``,
        in its order), ``workers`` workers step against PS tasks ``0..len(shards)-1``.

        The PS tasks are configured (``warmup`` steps within ``warmup_seconds``, then at most
        ``steps`` within ``max_seconds``, each step's barrier bounded by ``barrier_timeout``);
        each worker gets a :class:`~pytest_tfgrpc.ps.jobs.SyncSGDJob` that allows one step
        more than that. Returns the workers' replies and what each PS saw, within
        ``timeout_s``. ``window``: as for :meth:`run`.
        """
        tasks = range(len(shards))
        self.configure(
            [
                service_pb2.PSJob(
                    job_id=self.next_job_id(),
                    task=ps,
                    workers=workers,
                    shards=[
                        service_pb2.ShardSpec(tensor=tensor, offset=offset, nbytes=nbytes)
                        for tensor, offset, nbytes in shards[ps]
                    ],
                    learning_rate=learning_rate,
                    init=init,
                    warmup_steps=warmup,
                    steps=steps,
                    warmup_seconds=warmup_seconds,
                    max_seconds=max_seconds,
                    barrier_timeout_seconds=barrier_timeout,
                )
                for ps in tasks
            ]
        )
        owned = [
            protocol.OwnedShards(
                shards=[protocol.Shard(offset=offset, nbytes=nbytes) for _, offset, nbytes in mine]
            )
            for mine in shards
        ]
        jobs = [
            protocol.SyncSGDJob(
                targets=self.targets[: len(shards)],
                worker=w,
                shards=owned,
                chunk_bytes=chunk_bytes,
                warmup=warmup,
                max_steps=warmup + steps + 1,
                barrier_timeout=barrier_timeout,
                check=check,
            )
            for w in range(workers)
        ]
        replies = self.run(jobs, timeout_s, window)
        return replies, self.job_stats(list(tasks))

    def _collect(
        self,
        workers: Sequence[WorkerProcess],
        deadline: float,
        what: str,
        expect: type[FromWorker] | tuple[type[FromWorker], ...],
    ) -> list[FromWorker]:
        """One message of type ``expect`` from each worker, or the first failure: a death,
        an error, a timeout. Other messages are passed over."""
        got: dict[int, FromWorker] = {}
        errors: list[str] = []
        with selectors.DefaultSelector() as selector:
            for worker in workers:
                selector.register(worker.fileno(), selectors.EVENT_READ, worker)
            while len(got) + len(errors) < len(workers):
                for worker in workers:
                    if worker.index in got:
                        continue
                    message = worker.take_message()
                    if message is None:
                        continue
                    if isinstance(message, protocol.WorkerFailed):
                        errors.append(f"{worker.name}: {message.error}")
                        got[worker.index] = message
                    elif isinstance(message, expect):
                        got[worker.index] = message
                if len(got) == len(workers):
                    break
                for ps in self.ps:
                    ps.check_alive()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = [w.name for w in workers if w.index not in got]
                    raise ClusterError(
                        f"{', '.join(missing)} did not {what} in time" + self._tails(workers)
                    )
                for key, _ in selector.select(min(remaining, 0.5)):
                    worker = key.data
                    if not worker.read_more():
                        selector.unregister(key.fileobj)
                        raise worker.died(grace=5.0) or ClusterError(
                            f"{worker.name} closed its stdout"
                        )
        if errors:
            raise self._failure("; ".join(errors))
        return [got[worker.index] for worker in workers]

    def _tails(self, workers: Sequence[WorkerProcess]) -> str:
        tails = [f"{w.name}: {w.stderr_tail(5)}" for w in workers if w.stderr_tail(5)]
        return ("; stderr:\n" + "\n".join(tails)) if tails else ""

    # --- lifetime ------------------------------------------------------------------------
    def stop(self) -> dict[str, str]:
        """Stop every process (workers first); return how each ended, by name."""
        ended: dict[str, str] = {}
        for channel in self._channels:
            channel.close()
        self._channels = []
        for worker in self.workers:
            ended[worker.name] = describe_exit(worker.stop())
        for ps in self.ps:
            ended[ps.name] = describe_exit(ps.stop())
        return ended

    def __enter__(self) -> PSCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"<PSCluster {self.topology.ps} PS x {self.topology.workers} workers "
            f"on {self.fabric.name}>"
        )
