"""The engine seam: the plugin asks engines for servers and clusters and never branches on
their classes."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest_tfgrpc

PLUGIN = Path(pytest_tfgrpc.__file__).parent / "plugin"
ENGINE_CLASSES = {"LoopEngine", "GrpcioEngine", "NativeEngine", "TensorFlowEngine", "PSCluster"}


def test_the_plugin_has_no_isinstance_on_engine_classes() -> None:
    found = []
    for path in sorted(PLUGIN.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id in ENGINE_CLASSES:
                found.append(f"{path.name}:{node.lineno}: {node.id}")
            if (
                isinstance(node, ast.ImportFrom)
                and node.module
                and (
                    node.module.startswith("pytest_tfgrpc.bench.engines.")
                    or node.module in ("pytest_tfgrpc.bench.fit", "pytest_tfgrpc.ps.ps_cluster")
                )
            ):
                found.append(f"{path.name}:{node.lineno}: from {node.module}")
    assert found == []
