"""The HTML report: its content from properties, and a real run's report in headless Chromium."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from pytest_tfgrpc.report.html import HtmlRun, render_html, write_html
from pytest_tfgrpc.report.record import read_record
from pytest_tfgrpc.stats.sketch import Sketch

CHROMIUM = next(
    (path for name in ("chromium", "chromium-browser") if (path := shutil.which(name))), None
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium here (apt-get install chromium): the report is not checked in a browser",
)


def _sketch(p50_us: float, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return Sketch.from_samples(
        (p50_us * 1e3 * rng.uniform(0.95, 1.05, 300)).astype(np.int64)
    ).to_string()


def _props(fabric: str, p50_us: float, seed: int, verdict: bool) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [
        ("tfgrpc.fabric", fabric),
        ("tfgrpc.p2p_latency.1KiB.p50_us", str(p50_us)),
        ("tfgrpc.p2p_latency.1KiB.p99_us", str(2 * p50_us)),
        ("tfgrpc.p2p_latency.1KiB.samples", "300"),
        ("tfgrpc.p2p_latency.1KiB.sketch", _sketch(p50_us, seed)),
    ]
    if verdict:
        out += [
            ("tfgrpc.p2p_latency.1KiB.p50.verdict", "regression"),
            ("tfgrpc.p2p_latency.1KiB.p50.change", "0.25"),
            ("tfgrpc.p2p_latency.1KiB.p50.detectable", "0.031"),
            ("tfgrpc.p2p_latency.1KiB.p50.verdict_reason", "p50 grew 25% (p=0.0001)"),
        ]
    return out


def _run() -> HtmlRun:
    props = {
        "t.py::test_rtt[lo]": _props("lo", 100.0, 1, verdict=True),
        "t.py::test_rtt[veth0]": _props("veth0", 300.0, 2, verdict=False),
    }
    return HtmlRun(
        records={test: read_record(test, pairs) for test, pairs in props.items()},
        outcomes={"t.py::test_rtt[lo]": "failed", "t.py::test_rtt[veth0]": "passed"},
        fabrics=["lo", "veth0"],
        meta={"tfgrpc.meta.host": "box<1>", "tfgrpc.meta.grpcio": "1.2.3"},
    )


class _Outline(HTMLParser):
    """Tags, table headers, external references and the visible text of a document."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.headers: list[str] = []
        self.sources: list[str] = []
        self.text: list[str] = []
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_th = tag == "th"
        for name, value in attrs:
            if name in ("src", "href") and value is not None:
                self.sources.append(value)

    def handle_endtag(self, tag: str) -> None:
        self._in_th = False if tag == "th" else self._in_th

    def handle_data(self, data: str) -> None:
        if self._in_th and data.strip():
            self.headers.append(data.strip())
        self.text.append(data)


def _outline(document: str) -> _Outline:
    parser = _Outline()
    parser.feed(document)
    return parser


def test_the_report_shows_fabrics_side_by_side_verdicts_and_metadata() -> None:
    document = render_html(_run())
    outline = _outline(document)
    text = " ".join(" ".join(outline.text).split())
    # One table for the benchmark, the two fabrics as column groups, in command-line order.
    assert "t.py::test_rtt" in text and "p2p_latency" in text
    assert outline.headers[:3] == ["size", "lo", "veth0"]
    assert "100us best" in text and "300us worst" in text
    # The verdict with its change and its detectable change, and the metadata, escaped.
    assert "regression" in text and "+25.0%" in text and "±3.1%" in text
    assert "p50 grew 25% (p=0.0001)" in text
    assert "box<1>" in text and "box<1>" not in document  # escaped in the markup
    assert "1 failed" in text and "1 passed" in text
    # Self-contained: no script, nothing fetched from anywhere.
    assert "script" not in outline.tags
    assert all(source.startswith("data:") for source in outline.sources), outline.sources


def test_the_report_embeds_its_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = write_html(_run(), tmp_path / "sub" / "report.html")
    outline = _outline(path.read_text())
    images = [s for s in outline.sources if s.startswith("data:image/png;base64,")]
    assert len(images) == 1  # the latency plot of the one benchmark


def _chromium(url: str, *args: str) -> tuple[str, str]:
    """Run headless Chromium on ``url`` with a fresh profile: (stdout, stderr)."""
    assert CHROMIUM is not None
    with tempfile.TemporaryDirectory(prefix="tfgrpc-chromium-") as profile:
        done = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                f"--user-data-dir={profile}",
                "--enable-logging=stderr",
                "--v=0",
                *args,
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, done.stderr


def _console_messages(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


@needs_chromium
def test_the_console_check_sees_a_page_that_logs_an_error(tmp_path: Path) -> None:
    page = tmp_path / "bad.html"
    page.write_text("<p>x</p><script>console.error('tfgrpc-broken')</script>")
    _, stderr = _chromium(page.as_uri(), "--dump-dom")
    assert any("tfgrpc-broken" in line for line in _console_messages(stderr))


@needs_chromium
def test_a_real_runs_report_renders_in_headless_chromium(
    pytester: pytest.Pytester, quick: tuple[str, ...]
) -> None:
    pytest.importorskip("matplotlib")
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["64B", "4KiB"])
        def test_rtt(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server, floor=True)
        """
    )
    report = pytester.path / "report.html"
    result = pytester.runpytest(*quick, f"--tfgrpc-html={report}")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"tfgrpc: HTML report {report}"])
    dom, stderr = _chromium(report.as_uri(), "--dump-dom")
    assert _console_messages(stderr) == []
    outline = _outline(dom)
    text = " ".join(" ".join(outline.text).split())
    assert "test_rtt" in text and "p2p_latency" in text and "p2p_latency_floor" in text
    assert "No baseline was given" in text
    assert [s for s in outline.sources if s.startswith("data:image/png")]
    assert all(s.startswith("data:") for s in outline.sources)
    # A screenshot shows the page (the table and the plot above the fold at this size).
    shot = pytester.path / "report.png"
    _chromium(report.as_uri(), f"--screenshot={shot}", "--window-size=1280,1600")
    from matplotlib.image import imread

    image = imread(shot)
    assert image.shape[:2] == (1600, 1280)
    assert image.std() > 0.05  # not a blank page
    keep = os.environ.get("TFGRPC_KEEP_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
