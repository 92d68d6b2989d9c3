"""The documentation site: it builds with warnings as errors, its generated tables come from
the code, and it shows the parts of the README it includes. Every code block on every page runs
or is checked in ``tests/test_readme.py``, with the README's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the site needs the 'docs' extra")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    site = tmp_path / "site"
    metrics = (site / "reference/metrics/index.html").read_text()
    options = (site / "reference/options/index.html").read_text()
    commands = (site / "reference/cli/index.html").read_text()
    assert "p99_us" in metrics and "throughput_MBps" in metrics
    assert "--tfgrpc-max-regression" in options and "tfgrpc_baseline" in options
    assert "tfgrpc-node" in commands and "tfgrpc-fabric" in commands
    assert (site / "search/search_index.json").exists()  # the search box's index
    for html_file in site.rglob("*.html"):  # theme.font: false: no third-party font is loaded
        assert "fonts.googleapis.com" not in html_file.read_text(), html_file
    # The README's parts the pages include (--8<--), there and whole: no marker left behind.
    shown = {
        "index.html": ("Two commands, on a machine", "runs the plugin's own tests"),
        "tasks/write-a-suite/index.html": ("test_gradient_latency", "test_resnet50_step"),
        "reference/junit/index.html": ("vs baseline", "test_weight_bandwidth"),
    }
    for page, words in shown.items():
        html = (site / page).read_text()
        assert all(word in html for word in words), page
        assert "--8&lt;--" not in html and "[start:" not in html, page
