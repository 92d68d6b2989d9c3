"""The layers import only downward: import-linter's layers contract in pyproject.toml."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

ROOT = Path(__file__).resolve().parent.parent
#: The order the layout documents, top first; layers joined by ``|`` import nothing of each other.
LAYERS = (
    "plugin",
    "cli | bench",
    "hosts | ps | report",
    "roles",
    "tuning | native | model | wire",
    "results",
    "metrics | runlock",
    "stats | units | private_files | suggest | turns",
)
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _lint(config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", LINT, "--config", str(config), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_contract_lists_the_documented_layers_in_order() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    match = re.search(
        r'type = "layers"\s*containers = \["pytest_tfgrpc"\]\s*layers = \[(.*?)\]', text, re.S
    )
    assert match is not None, "no layers contract over pytest_tfgrpc in pyproject.toml"
    assert tuple(re.findall(r'"([\w |]+)"', match.group(1))) == LAYERS


def test_the_package_keeps_its_layers() -> None:
    out = _lint(ROOT / "pyproject.toml")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 kept, 0 broken" in out.stdout


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    # The same package with the layers upside down: every downward import is then upward.
    config = tmp_path / "upside_down.toml"
    upside_down = ", ".join(f'"{layer}"' for layer in reversed(LAYERS))
    config.write_text(
        '[tool.importlinter]\nroot_package = "pytest_tfgrpc"\n\n'
        '[[tool.importlinter.contracts]]\nname = "upside down"\ntype = "layers"\n'
        f'containers = ["pytest_tfgrpc"]\nlayers = [{upside_down}]\n'
    )
    out = _lint(config)
    assert out.returncode != 0
    assert "pytest_tfgrpc.plugin" in out.stdout and "BROKEN" in out.stdout
