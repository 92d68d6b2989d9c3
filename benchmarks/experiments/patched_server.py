"""The plugin's tensor server with extra or changed gRPC server options (an experiment).

    python benchmarks/experiments/patched_server.py '[["grpc.http2.lookahead_bytes", 4194304]]' \
        --fabric lo --exit-on-stdin-eof

The first argument is a JSON list of ``[name, value]`` pairs that replace or extend
``pytest_tfgrpc.wire.grpc_settings.SERVER_OPTIONS`` (a pair whose value is null removes the
option); the rest go to ``pytest_tfgrpc.roles.tensor_server``.
``TFGRPC_EXPERIMENT_GC=freeze|off`` in the environment freezes or disables the cyclic garbage
collector first. Nothing in ``src/`` is changed: the module attribute is replaced in this process
only, before the server reads it.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from typing import Any

from pytest_tfgrpc.roles import tensor_server as server
from pytest_tfgrpc.wire import grpc_settings


def patched(
    base: tuple[tuple[str, int], ...], changes: list[list[object]]
) -> tuple[tuple[str, Any], ...]:
    options: dict[str, Any] = dict(base)
    for name, value in changes:
        if value is None:
            options.pop(str(name), None)
        else:
            options[str(name)] = value
    return tuple(options.items())


def main() -> int:
    # TFGRPC_EXPERIMENT_GC=freeze: move every object alive after start-up out of the cyclic
    # collector's reach (gc.freeze); =off: no cyclic collection at all (gc.disable).
    gc_mode = os.environ.get("TFGRPC_EXPERIMENT_GC", "")
    if gc_mode == "freeze":
        gc.freeze()
    elif gc_mode == "off":
        gc.disable()
    changes = json.loads(sys.argv[1])
    grpc_settings.SERVER_OPTIONS = patched(grpc_settings.SERVER_OPTIONS, changes)  # type: ignore[misc,assignment,unused-ignore]
    return server.main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
