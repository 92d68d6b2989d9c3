"""Our parameter server (my_ps.py) as a pytest-tfgrpc engine: the plugin's suites, statistics,
budgets, JUnit properties and baseline gate, measuring our own service. Each PS task of a
``ps_cluster`` is one my_ps.py process (the engine's default cluster)."""

import subprocess
import sys
from pathlib import Path

import grpc
from my_ps import UNLIMITED

from pytest_tfgrpc import Engine, Measured


class MyPS:
    """One my_ps.py process bound to the fabric's address, and a channel to it."""

    def __init__(self, fabric, env):
        argv = [sys.executable, str(Path(__file__).with_name("my_ps.py")), fabric.address]
        self.fabric, self.proc = fabric, subprocess.Popen(argv, stdin=-1, stdout=-1, env=env)
        host = f"[{fabric.address}]" if ":" in fabric.address else fabric.address
        self.target = f"{host}:{int(self.proc.stdout.readline())}"
        self.channel = grpc.insecure_channel(self.target, options=UNLIMITED)
        self.call = {m: self.channel.unary_unary(f"/myps.PS/{m}") for m in ("Push", "Pull", "Echo")}

    def died(self, grace=0.5):
        return None if self.proc.poll() is None else RuntimeError("my_ps.py exited")

    def stop(self):
        self.channel.close()
        self.proc.stdin.close()
        self.proc.wait(10)


class MyPSEngine(Engine):
    name = "myps"

    def start_server(self, provision):
        return MyPS(provision.fabric, provision.env)

    def echo(self, server, tensor, *, mode, rpc, run):
        return Measured.timed(lambda: server.call["Echo"](tensor.content), run)

    def push(self, server, tensor, *, mode, rpc, chunk_bytes, run):
        return Measured.timed(lambda: server.call["Push"](b"w\0" + tensor.content), run)

    def pull(self, server, tensor, *, mode, rpc, chunk_bytes, run):
        server.call["Push"](b"w\0" + tensor.content)
        return Measured.timed(lambda: server.call["Pull"](b"w"), run)

    def ps_exchange(self, cluster, variables, *, mode, run):
        calls = [(cluster.ps[v.ps].call, v.name.encode()) for v in variables]
        for (call, name), v in zip(calls, variables, strict=True):
            call["Push"](name + b"\0" + bytes(v.nbytes))

        def exchange():  # pull every variable, push a gradient of its size back
            for call, name in calls:
                call["Push"](name + b"\0" + call["Pull"](name))

        return Measured.timed(exchange, run)


def pytest_tfgrpc_add_engines(registry):
    registry.add(MyPSEngine())
