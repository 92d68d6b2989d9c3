"""The documentation site: it builds with warnings as errors, its generated tables come from
the code, and every code block on every page runs or is checked here."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 has no tomllib; tomli is its backport
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
PAGES = sorted(DOCS.rglob("*.md"))


def blocks(language: str) -> list[tuple[str, str]]:
    """(page, code) of every ``language`` block on every page."""
    return [
        (str(page.relative_to(DOCS)), match.group(2))
        for page in PAGES
        for match in BLOCK.finditer(page.read_text())
        if match.group(1) == language
    ]


def test_the_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the site needs the 'docs' extra")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    metrics = (tmp_path / "site/reference/metrics/index.html").read_text()
    options = (tmp_path / "site/reference/options/index.html").read_text()
    commands = (tmp_path / "site/reference/cli/index.html").read_text()
    assert "p99_us" in metrics and "throughput_MBps" in metrics
    assert "--tfgrpc-max-regression" in options and "tfgrpc_baseline" in options
    assert "tfgrpc-node" in commands and "tfgrpc-fabric" in commands
    assert (tmp_path / "site/search/search_index.json").exists()  # the search box's index


@pytest.mark.parametrize(("page", "code"), blocks("python"), ids=lambda v: str(v)[:40])
def test_python_blocks_run_as_suites(pytester: pytest.Pytester, page: str, code: str) -> None:
    pytester.makepyfile(test_page=code)
    count = len(re.findall(r"^def test_", code, re.M))
    # p99 budgets need 100 samples: the pages' defaults, kept short in time
    quick = ("--tfgrpc-iterations=100", "--tfgrpc-warmup=3", "--tfgrpc-max-seconds=30")
    pytester.runpytest(*quick).assert_outcomes(passed=count)


def _commands() -> list[tuple[str, list[str]]]:
    out = []
    for page, code in blocks("sh"):
        for line in code.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|;|\|", line.split("#")[0]):
                words = shlex.split(part.strip().rstrip("&"))
                if words:
                    out.append((page, words))
    return out


EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
)
SCRIPTS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def _help_of(program: list[str]) -> str:
    return subprocess.run(
        [*program, "--help"], capture_output=True, text=True, timeout=60, cwd=ROOT
    ).stdout


def _pytest_takes(options: list[str], tmp: Path) -> str:
    """pytest's complaint about ``options`` it does not know ('' when it knows them all):
    ``--version`` parses the command line and stops before any plugin is configured."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, "--version"],
        capture_output=True, text=True, timeout=60, cwd=tmp,
    )  # fmt: skip
    return done.stderr if "unrecognized arguments" in done.stderr else ""


@pytest.mark.parametrize(
    ("page", "words"), _commands(), ids=lambda v: " ".join(v)[:50] if isinstance(v, list) else v
)
def test_shell_lines_name_what_exists(page: str, words: list[str], tmp_path: Path) -> None:
    """pip lines install extras that exist, from the checkout; the tools are the package's
    and take the options the page gives them."""
    name = Path(words[0]).name
    if name == "pip" or (words[1:2] == ["-m"] and words[2:3] == ["pip"]):
        targets = [w for w in words if w.startswith((".", "'.", '".'))]
        assert targets, f"{page}: pip installs from the checkout ('.[extra]'): {words}"
        for extra in re.findall(r"\[([\w,]+)\]", " ".join(targets)):
            assert set(extra.split(",")) <= EXTRAS, f"{page}: no such extra: {extra}"
    elif name == "pytest":
        options = [w for w in words[1:] if w.startswith("-")]
        assert not _pytest_takes(options, tmp_path), f"{page}: {words}"
    elif name in SCRIPTS:
        program = [str(Path(sys.executable).parent / name)]
        sub = [w for w in words[1:2] if not w.startswith("-")] if name == "tfgrpc-fabric" else []
        known = _help_of([*program, *sub])
        for word in words[1:]:
            if word.startswith("--"):
                option = word.split("=")[0]
                assert option in known, f"{page}: {name} has no option {option}"
