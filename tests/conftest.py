"""Shared test helpers: quick run options, JUnit reading, process checks."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import scipy.stats  # noqa: F401  (the gate's t quantiles: numpy.fft et al. load with it)

# The plugin imports its machinery (numpy, grpc) only when a run uses it. pytester's
# in-process runs unload the modules first imported inside them, and numpy cannot be
# loaded twice in one process: load it all here, once.
import pytest_tfgrpc.plugin.session  # noqa: F401
from pytest_tfgrpc import native

if TYPE_CHECKING:
    from netns import VethLink

sys.path.insert(0, str(Path(__file__).parent))  # tests/netns.py as a plain module

# pytester moves HOME: every run, in-process or not, finds the native engine where it was built.
os.environ.setdefault(native.CACHE_ENV, str(native.cache_root()))

# A shell's background job starts with Ctrl-C ignored, and Python then installs no handler for
# it; the tests that interrupt a run need the handler here, and, since a handler is reset by
# exec, so do the processes they start.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = ["pytester"]

#: Run options that keep pytester runs short; measured figures stay real.
QUICK = ("--tfgrpc-iterations=30", "--tfgrpc-warmup=3", "--tfgrpc-max-seconds=2")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purposes
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.fixture
def quick() -> tuple[str, ...]:
    return QUICK


@pytest.fixture
def link() -> Iterator[VethLink]:
    """A veth link into a network namespace of its own (skips where none can be made)."""
    from netns import can_make_links, veth_link

    ok, reason = can_make_links()
    if not ok:
        pytest.skip(reason)
    with veth_link() as made:
        yield made


def pytest_configure(config: pytest.Config) -> None:
    """Under ``-n N``, work stealing rather than xdist's default ``load``: a worker that runs
    out of tests takes half of the other's queue ("load" left it idle while the other still
    had tests queued behind a long one, such as a 30 s fault row). Here, not in pyproject's
    ``addopts``: the example suites run from this directory without xdist installed."""
    chose = any(
        arg == "--dist" or arg.startswith(("--dist=", "-d"))
        for arg in config.invocation_params.args
    )
    if config.pluginmanager.hasplugin("xdist") and config.getoption("dist") == "load" and not chose:
        config.option.dist = "worksteal"
