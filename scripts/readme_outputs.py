"""Regenerate the outputs the README and the documentation site's pages show, from real runs:
nothing there is typed by hand.

Usage::

    python scripts/readme_outputs.py           # run, then rewrite the pages' output blocks
    python scripts/readme_outputs.py --check   # run the quick ones, compare their shape

An output block is a fenced ``text`` block right after an ``<!-- output: NAME -->`` line, on
whichever page (``README.md``, ``docs/**/*.md``) shows it:

* ``marker-error``: pytest's one-line summary of a test whose marker is malformed;
* ``budget-breach``: the failure of a test whose budget is broken;
* ``summary``: the terminal summary of the README's first suite ("Writing a suite"), on
  loopback and on a veth link into a network namespace (as root; on loopback alone
  otherwise), gated against an earlier run of itself.

``--check`` (what ``tests/test_readme.py`` runs) regenerates the first two and compares them with
the pages, digits and ports masked; of the summary it checks the header and the fabrics. Every
run happens in a temporary directory with this interpreter's pytest.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
#: Every page that may show an output: the README, then the site's pages.
PAGES = (README, *sorted((ROOT / "docs").rglob("*.md")))
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- output: ([\w-]+) -->\s*$")
#: The veth link of the summary's second fabric: a network namespace of its own, addresses in
#: 198.18.0.0/15 (RFC 2544, set aside for benchmarks).
NETNS = "tfgrpc-readme"
VETH = ("veth0", "veth1")
ADDRESSES = ("198.18.250.1/24", "198.18.250.2/24")


@dataclass(frozen=True)
class Block:
    """A fenced block of a Markdown file: its language, its text, the line of its opening
    fence (0-based) and the output marker before it, if any."""

    language: str
    text: str
    line: int
    output: str = ""


def blocks(markdown: str) -> list[Block]:
    """Every fenced block of ``markdown``, in order."""
    lines = markdown.splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        marker = _MARKER.match(lines[i - 1]) if i > 0 else None
        out.append(Block(match[1], "\n".join(lines[i + 1 : end]), i, marker[1] if marker else ""))
        i = end + 1
    return out


def first_suite(markdown: str) -> str:
    """The README's first Python suite (the first python block defining a test)."""
    return next(
        b.text for b in blocks(markdown) if b.language == "python" and "def test_" in b.text
    )


def _pytest(folder: Path, *args: str, columns: int = 400) -> str:
    # Wide by default, so that pytest's one-line summary keeps the whole message.
    env = dict(os.environ, COLUMNS=str(columns), PYTHONDONTWRITEBYTECODE="1")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout


def marker_error(folder: Path) -> str:
    """pytest's one-line summary of a test with a malformed marker."""
    (folder / "test_x.py").write_text(
        "import pytest\n\n\n"
        '@pytest.mark.message_profile("resnet50", scale=2)\n'
        "def test_marked(tfgrpc, tensor_server):\n"
        "    tfgrpc.p2p_latency(tensor_server)\n"
    )
    out = _pytest(folder, "test_x.py")
    return next(line for line in out.splitlines() if line.startswith("ERROR test_x.py"))


def budget_breach(folder: Path) -> str:
    """The ``E`` lines of a failure whose budget is broken (a p50 budget no one can keep)."""
    (folder / "test_y.py").write_text(
        "import pytest\nfrom pytest_tfgrpc import assert_budget\n\n\n"
        '@pytest.mark.message_profile(["1KiB"])\n'
        "def test_latency(tfgrpc, tensor_server):\n"
        "    result = tfgrpc.p2p_latency(tensor_server)\n"
        '    assert_budget(result, p50="1ns", p99="20ms")\n'
    )
    out = _pytest(folder, "test_y.py")
    lines = [line for line in out.splitlines() if line.startswith("E   ")]
    start = next(i for i, line in enumerate(lines) if "BudgetExceeded" in line)
    return "\n".join(lines[start : start + 3])


def _run(command: Sequence[str]) -> None:
    subprocess.run(list(command), check=True, capture_output=True, timeout=30)


@contextlib.contextmanager
def veth_fabric() -> Iterator[str | None]:
    """A veth pair into a network namespace of its own, its root end named ``veth0``; yields
    that name, or None where it cannot be made (not root, no ``ip``, the name taken).
    The namespace and the pair are removed whatever happens."""
    if (
        os.geteuid() != 0
        or shutil.which("ip") is None
        or Path(f"/sys/class/net/{VETH[0]}").exists()
    ):
        yield None
        return
    try:
        _run(["ip", "netns", "add", NETNS])
        _run(["ip", "link", "add", VETH[0], "type", "veth", "peer", "name", VETH[1]])
        _run(["ip", "link", "set", VETH[1], "netns", NETNS])
        _run(["ip", "addr", "add", ADDRESSES[0], "dev", VETH[0]])
        _run(["ip", "link", "set", VETH[0], "up"])
        _run(["ip", "-n", NETNS, "addr", "add", ADDRESSES[1], "dev", VETH[1]])
        _run(["ip", "-n", NETNS, "link", "set", VETH[1], "up"])
        yield VETH[0]
    except subprocess.CalledProcessError:
        yield None
    finally:
        subprocess.run(["ip", "link", "del", VETH[0]], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", NETNS], capture_output=True, check=False)


def summary(folder: Path, markdown: str) -> str:
    """The terminal summary of the README's first suite on lo and a veth link, gated against
    an earlier run of itself."""
    (folder / "test_suite.py").write_text(first_suite(markdown) + "\n")
    with veth_fabric() as veth:
        fabrics = "lo" if veth is None else f"lo,{veth}"
        _pytest(folder, "test_suite.py", f"--fabric={fabrics}", "--junitxml=main.xml")
        out = _pytest(
            folder,
            "test_suite.py",
            f"--fabric={fabrics}",
            "--junitxml=pr.xml",
            "--tfgrpc-baseline=main.xml",
            "--tfgrpc-max-regression=p99:20%,throughput:10%",
            columns=80,
        )
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(r"^=+ tfgrpc =+$", line))
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("=="))
    return "\n".join(lines[start:end])


def mask(text: str) -> str:
    """``text`` with what changes from run to run masked: numbers and the alignment they
    move (runs of spaces)."""
    return re.sub(r" +", " ", re.sub(r"[0-9]+(\.[0-9]+)?", "0", text))


def replace_output(markdown: str, name: str, text: str) -> str:
    """``markdown`` with the output block ``name`` holding ``text``."""
    lines = markdown.splitlines()
    block = next(b for b in blocks(markdown) if b.output == name)
    end = block.line + 1 + len(block.text.splitlines()) if block.text else block.line + 1
    lines[block.line + 1 : end] = text.splitlines()
    return "\n".join(lines) + "\n"


def generate(markdown: str, names: Sequence[str]) -> dict[str, str]:
    """The outputs ``names`` from fresh runs, each in a temporary directory."""
    makers = {"marker-error": marker_error, "budget-breach": budget_breach}
    out = {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix="tfgrpc-readme-") as folder:
            if name == "summary":
                out[name] = summary(Path(folder), markdown)
            else:
                out[name] = makers[name](Path(folder))
    return out


def shown(pages: Sequence[Path] = PAGES) -> dict[str, tuple[Path, str]]:
    """Each output block of ``pages``: its name, the page that shows it and its text."""
    return {
        b.output: (page, b.text) for page in pages for b in blocks(page.read_text()) if b.output
    }


def check(pages: Sequence[Path] = PAGES) -> list[str]:
    """Where the outputs ``pages`` show differ from fresh runs (digits masked), as messages;
    the summary's header and fabrics only (a full run takes a minute)."""
    problems = []
    texts = {name: text for name, (_, text) in shown(pages).items()}
    for name, text in generate(README.read_text(), ["marker-error", "budget-breach"]).items():
        if mask(texts.get(name, "")) != mask(text):
            problems.append(f"output {name!r} differs from a fresh run:\n{text}")
    table = texts.get("summary", "").splitlines()
    if len(table) < 3 or not re.match(r"^=+ tfgrpc =+$", table[0]):
        problems.append("output 'summary' does not start with the tfgrpc rule and a table")
    else:
        from pytest_tfgrpc.report.summary import format_summary

        expected = format_summary([])[0].split()  # the header the summary writes today
        if table[1].split()[: len(expected)] != expected:
            problems.append(f"output 'summary' has another header: {table[1]}")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="compare instead of rewriting")
    args = parser.parse_args(argv)
    if args.check:
        problems = check()
        for problem in problems:
            print(problem)
        return 1 if problems else 0
    where = shown()
    outputs = generate(README.read_text(), ["marker-error", "budget-breach", "summary"])
    for name, text in outputs.items():
        page = where[name][0]
        page.write_text(replace_output(page.read_text(), name, text))
        print(f"{name} ({page.relative_to(ROOT)}):\n{text}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
