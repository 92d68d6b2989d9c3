"""Stopping a run: SIGTERM mid-measurement ends it within 2 s, every role stopped, the JUnit
XML written, with a line that says what it stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import pid_alive

SUITE = """
import os, pytest

@pytest.mark.message_profile("resnet50")
@pytest.mark.ps_topology(ps=2, workers=2)
def test_step(tfgrpc, ps_cluster):
    with open(os.environ["PIDS"], "w") as out:
        out.write(" ".join(str(p.pid) for p in (*ps_cluster.ps, *ps_cluster.workers)))
    tfgrpc.sync_sgd_step(ps_cluster, iterations=100000, max_seconds=60)
"""

#: Seconds from SIGTERM to pytest's exit that the issue promises.
PROMPT_S = 2.0


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[list[str]]:
    """A node agent on loopback; the pytest arguments that use it."""
    token = tmp_path / "token"
    token.write_text("docs-stopping-token-0123456789\n")
    token.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_tfgrpc.hosts.agent", "--fabric", "lo", "--port", "0",
         "--token-file", str(token)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        target = json.loads(proc.stdout.readline())["target"]
        yield [f"--tfgrpc-agents={target}", f"--tfgrpc-agent-token-file={token}"]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("where", ["local", "agents"])
@pytest.mark.parametrize("delay_s", [0.0, 1.5], ids=["at-start", "mid-step"])
def test_sigterm_during_a_sync_sgd_step_ends_the_run_promptly(
    tmp_path: Path, where: str, delay_s: float, request: pytest.FixtureRequest
) -> None:
    extra = request.getfixturevalue("agent") if where == "agents" else []
    (tmp_path / "test_suite.py").write_text(SUITE)
    pids = tmp_path / "pids"
    xml = tmp_path / "perf.xml"
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *extra, f"--junitxml={xml}",
         str(tmp_path)],
        cwd=tmp_path, env={**os.environ, "PIDS": str(pids)},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (pids.exists() and pids.read_text()):
            assert time.monotonic() < deadline and run.poll() is None
            time.sleep(0.02)
        time.sleep(delay_s)
        sent = time.monotonic()
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=30)
        took = time.monotonic() - sent
    finally:
        run.kill()
        run.wait()
    text = output.decode()
    assert run.returncode == pytest.ExitCode.INTERRUPTED, text
    assert took < PROMPT_S, f"{took:.2f} s to stop\n{text}"
    assert "tfgrpc: stopping 4 process(es) this run started" in text, text
    assert xml.exists()
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(pid)
