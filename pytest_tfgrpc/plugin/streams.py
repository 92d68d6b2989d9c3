"""How many concurrent connections a test's ``p2p_bandwidth`` calls use by default: the
``tfgrpc_streams(n)`` marker, else ``--tfgrpc-streams`` (both registered in ``options``; the
fixture is in ``fixtures``). Imported only once the plugin is awake."""

from __future__ import annotations

import pytest

from pytest_tfgrpc.bench.streams import check_streams
from pytest_tfgrpc.plugin.options import option


def default_streams(config: pytest.Config) -> int:
    """The run's default stream count: ``--tfgrpc-streams`` (checked as it is parsed), else
    its ini twin, else 1."""
    raw = option(config, "tfgrpc_streams")
    if raw is None:
        return 1
    try:
        return check_streams(int(raw))
    except ValueError as exc:
        pytest.fail(f"tfgrpc_streams (ini) = {raw!r}: {exc}", pytrace=False)


def streams_of(request: pytest.FixtureRequest) -> int:
    """The test's default stream count: its ``tfgrpc_streams(n)`` marker, else the run's."""
    marker = request.node.get_closest_marker("tfgrpc_streams")
    if marker is None:
        return default_streams(request.config)
    if len(marker.args) != 1 or marker.kwargs:
        pytest.fail(
            f"{request.node.nodeid}: tfgrpc_streams takes one count, e.g. tfgrpc_streams(2)", False
        )
    try:
        return check_streams(marker.args[0])
    except ValueError as exc:
        pytest.fail(f"{request.node.nodeid}: tfgrpc_streams: {exc}", pytrace=False)
