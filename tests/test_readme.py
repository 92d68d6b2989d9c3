"""Every code example of the README and of the documentation site's pages (``docs/``), run or
checked as written, each in one place.

* ``python`` blocks that define tests are suites: they run together under pytester, as a user
  would run them, and must pass; blocks that implement the plugin's hooks (``pytest_*``
  functions) are the suites' conftest, and each engine they register measures a latency in
  that run; the other ``python`` blocks run as scripts in the same folder
  afterwards (the JUnit XML the suites wrote is there), and where the text after a block says
  what it ``prints`` the output must be exactly that.
* ``sh`` blocks: each command line is checked: the program exists, every option it gives is in
  that program's ``--help``, extras and paths exist; the command lines that are safe to run (the
  analytic model, on the run's own XML and results file) are run and must succeed.
* ``ini`` blocks run as the ``pytest.ini`` of a small suite, whose figures show they took effect.
* ``text`` blocks are illustrations (formulas) or outputs: an output, marked
  ``<!-- output: NAME -->``, must be what a fresh run prints (``scripts/readme_outputs.py
  --check``). A block without a language fails: nothing is skipped silently.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The README, then every page of the site (mkdocs.yml, docs/).
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
BIN = Path(sys.executable).parent
LANGUAGES = ("python", "sh", "ini", "text", "yaml")


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "readme_outputs", ROOT / "scripts" / "readme_outputs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


OUTPUTS = _script()


def _blocks(language: str | None = None) -> Iterator[tuple[Path, Any]]:
    for doc in DOCS:
        for block in OUTPUTS.blocks(doc.read_text()):
            if language is None or block.language == language:
                yield doc, block


def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


def test_every_block_has_a_language_this_test_knows() -> None:
    unknown = [
        f"{_name(doc)}:{block.line + 1}: ```{block.language}"
        for doc, block in _blocks()
        if block.language not in LANGUAGES
    ]
    assert unknown == []
    # The docs have examples of every kind this test runs, so none of its parts is idle.
    assert {block.language for _, block in _blocks()} == set(LANGUAGES)


def test_every_example_is_in_one_place() -> None:
    """A page shows the README's examples by including them (``--8<--``), never by a copy,
    so each is run or checked once and cannot drift from its twin."""
    seen: dict[str, str] = {}
    twins = []
    for doc, block in _blocks():
        where = f"{_name(doc)}:{block.line + 1}"
        if block.text in seen:
            twins.append(f"{where} repeats {seen[block.text]}")
        seen.setdefault(block.text, where)
    assert twins == []


# ---------------------------------------------------------------------------------------------
# python: suites under pytester, then the snippets, then the shell lines that read their output


def _after(doc: Path, line: int) -> str:
    """The paragraph right after the block whose opening fence is on ``line``."""
    lines = doc.read_text().splitlines()
    end = next(i for i in range(line + 1, len(lines)) if lines[i].startswith("```"))
    return " ".join(lines[end + 1 : end + 4])


def _test_functions(source: str) -> list[ast.FunctionDef]:
    """The test functions a suite defines (not those in the strings it writes for pytester)."""
    return [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
    ]


def _hooks(source: str) -> list[str]:
    """The pytest hooks (``pytest_*`` functions) a block defines at its top level."""
    return [
        node.name
        for node in ast.parse(source).body
        if isinstance(node, ast.FunctionDef) and node.name.startswith("pytest_")
    ]


def _engine_names(source: str) -> list[str]:
    """The ``name = "..."`` of every class a block defines (the engines it registers)."""
    return [
        stmt.value.value
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef)
        for stmt in node.body
        if isinstance(stmt, ast.Assign)
        and [getattr(t, "id", None) for t in stmt.targets] == ["name"]
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    ]


def test_the_python_examples_pass_as_written(pytester: pytest.Pytester) -> None:
    python = list(_blocks("python"))
    suites = [b for _, b in python if "def test_" in b.text]
    # A block that implements the plugin's hooks is a conftest: it runs as one (pytest refuses
    # a hook it does not know, pluggy an argument the hook does not have).
    conftests = [b for _, b in python if "def test_" not in b.text and _hooks(b.text)]
    snippets = [(d, b) for d, b in python if "def test_" not in b.text and not _hooks(b.text)]
    assert len(suites) >= 2 and snippets and conftests
    for i, suite in enumerate(suites):
        pytester.makepyfile(**{f"test_readme_{i}": suite.text})
    # The engines the conftest blocks register measure what they implement, through the
    # plugin's engine selection.
    engines = [name for c in conftests for name in _engine_names(c.text)]
    assert engines
    pytester.makepyfile(
        test_readme_engines="import pytest\n"
        + "".join(
            f"\n\n@pytest.mark.tfgrpc_engines({name!r})\n"
            f"def test_readme_engine_{name}(tfgrpc, tensor_server):\n"
            f"    result = tfgrpc.p2p_latency(tensor_server, ['1KiB'], iterations=5)\n"
            f"    assert result.settings['engine'] == {name!r}\n"
            for name in engines
        )
    )
    # A suite that says which conftest it needs gets it; the hook blocks are conftest code.
    pytester.makeconftest(
        "\n".join(
            [
                line.removeprefix("# conftest.py: ")
                for s in suites
                for line in s.text.splitlines()
                if line.startswith("# conftest.py: ")
            ]
            + [c.text for c in conftests]
        )
    )
    tests = [t for s in suites for t in _test_functions(s.text)]
    # Examples on emulated hosts need root; elsewhere they skip, saying so.
    need_root = [t for t in tests if "tfgrpc_emulated_hosts" in (a.arg for a in t.args.args)]
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "--junitxml=perf.xml", "--tfgrpc-results=results.jsonl", "-rA"
    )
    outcomes = result.parseoutcomes()
    assert not {"failed", "errors", "error"} & set(outcomes), result.stdout.str()
    for name in engines:
        result.stdout.fnmatch_lines([f"PASSED test_readme_engines.py::test_readme_engine_{name}*"])
    # The run metadata the hook blocks add reach the JUnit suite properties.
    if any("pytest_tfgrpc_run_metadata" in _hooks(c.text) for c in conftests):
        assert 'name="tfgrpc.meta.extra.' in (pytester.path / "perf.xml").read_text()
    # Every test the README shows ran (a test may run once per fabric or engine).
    for test in tests:
        if os.geteuid() == 0 or test not in need_root:
            result.stdout.fnmatch_lines([f"PASSED test_readme_*::{test.name}*"])
        else:
            result.stdout.fnmatch_lines([f"SKIPPED *{test.name}*root*"])
    for doc, snippet in snippets:
        done = subprocess.run(
            [sys.executable, "-c", snippet.text],
            cwd=pytester.path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        said = re.match(r"prints `([^`]*)`", _after(doc, snippet.line))
        if said:
            assert done.stdout.strip() == said[1]
        if "JUnitXml" in snippet.text:
            # A p99 for the 1KiB latency of the README's latency test, on each fabric.
            assert re.search(r"^test_gradient_latency\[lo\] \d+(\.\d+)?$", done.stdout, re.M)
    # The command lines that read a run's output run on this run's output.
    runnable = [line for line in _command_lines() if _runnable(line)]
    assert runnable
    for line in runnable:
        done = subprocess.run(
            _with_venv(shlex.split(line)), cwd=pytester.path, capture_output=True, text=True,
            timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"


# ---------------------------------------------------------------------------------------------
# sh: every command line checked


#: A command substitution, checked as a command line of its own.
_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")


def _command_lines() -> list[str]:
    out: list[str] = []
    for _, block in _blocks("sh"):
        text = re.sub(r"\\\n\s*", " ", block.text)  # continuation lines
        for raw in text.splitlines():
            line = raw.split(" #")[0].strip()
            if line and not line.startswith("#"):
                out.extend(inner.strip() for inner in _SUBSTITUTION.findall(line))
                out.append(_SUBSTITUTION.sub("SUBSTITUTED", line))
    return out


def _runnable(line: str) -> bool:
    """Safe to run in a test: the analytic model, which only computes."""
    return line.startswith("tfgrpc-model ")


#: A program run from a virtual environment of the checkout (``.venv``, ``.venv-tf``).
_VENV = re.compile(r"^\.venv[\w-]*/bin/")


def _with_venv(argv: list[str]) -> list[str]:
    program = _VENV.sub("", argv[0])
    if (BIN / program).exists():
        return [str(BIN / program), *argv[1:]]
    return argv


def _commands(line: str) -> list[list[str]]:
    """The simple commands of a command line (split at ``&&``, ``;``, ``|``, ``>``)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&;|>")
    lexer.whitespace_split = True
    out: list[list[str]] = [[]]
    redirect = False
    for token in lexer:
        if token in ("&&", ";", "|", "||", "&"):
            out.append([])
            redirect = False
        elif token == ">":
            redirect = True
        elif not redirect:
            out[-1].append(token)
    return [command for command in out if command]


@cache
def _help(program: str, subcommand: str | None = None) -> str:
    if program == "pytest":
        # --noconftest: from the repository's root pytest would load tests/conftest.py, which
        # imports the plugin's machinery for pytester (2.8 s of a 3.6 s --help); it adds no
        # option, so the help is the one a user's project shows.
        argv = [sys.executable, "-m", "pytest", "--noconftest"]
    elif program.startswith("benchmarks/"):
        argv = [sys.executable, str(ROOT / program)]
    else:
        argv = [str(BIN / program)]
    argv += [subcommand, "--help"] if subcommand else ["--help"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{program} --help: {done.stderr}"
    return done.stdout


def _extras() -> set[str]:
    from importlib.metadata import metadata

    return set(metadata("pytest-tfgrpc").get_all("Provides-Extra") or [])


#: Options whose --help lists only another spelling.
_ALIASES = {"--junitxml": "--junit-xml"}


#: Programs that run another command: the options they take before it (``srun -N2 cmd``).
_WRAPPERS = {"ssh": 1, "srun": 0}
#: Plain system tools a recipe may use; they must exist on this machine.
_SYSTEM_TOOLS = ("head", "base64", "cat", "apt-get", "mkdir", "date", "install")


def _check(command: list[str]) -> None:
    program = _VENV.sub("", command[0])
    args = command[1:]
    if program in _WRAPPERS:
        rest = [a for a in args if not a.startswith("-")][_WRAPPERS[program] :]
        assert rest, f"{command}: runs no command"
        _check(rest)
        return
    if program.startswith("example_suites/"):
        # A recipe's shipped script (the srun recipe's, run under a stand-in by test_emulated).
        assert os.access(ROOT / program, os.X_OK), f"{program}: not an executable in the repo"
        return
    if program in _SYSTEM_TOOLS:
        assert shutil.which(program), program
        return
    if program == "echo":
        if args[0].startswith("{"):
            json.loads(args[0])  # the cluster spec it writes is JSON
        return
    if program in ("python", "python3"):
        if args[:2] == ["-m", "venv"]:
            return
        if args[0] == "-m":  # a module of an extra the README installs (trustme: dev)
            assert importlib.util.find_spec(args[1]) is not None, command
            return
        assert (ROOT / args[0]).exists(), args[0]
        program, args = args[0], args[1:]
        if program.startswith("scripts/"):
            return  # scripts/gen_protos.py and readme_outputs.py: tested on their own
    if program == "pip":
        assert args[0] == "install", command
        for target in args[1:]:
            if target.startswith("-"):
                continue
            extras = re.fullmatch(r"\.(?:\[([\w,]+)\])?", target)
            assert extras is not None, f"pip installs {target!r}: the quick start installs '.'"
            assert set((extras[1] or "").split(",")) - {""} <= _extras(), target
        return
    if program in ("ruff", "mypy", "lint-imports"):
        assert (BIN / program).exists(), program
        return
    assert program in ("pytest", "mkdocs") or program.startswith(("tfgrpc-", "benchmarks/")), (
        f"a command this test does not know how to check: {command}"
    )
    text = _help(program)
    commands = re.search(r"\{([\w,-]+)\}", text)
    if commands and args and args[0] in commands[1].split(","):
        text = _help(program, args[0])  # a subcommand's options are in its own help
        args = args[1:]
    for arg in args:
        if arg.startswith("--"):
            option = _ALIASES.get(arg.split("=")[0], arg.split("=")[0])
            assert re.search(rf"(^|[\s,]){re.escape(option)}([\s=,]|$)", text, re.M), (
                f"{program} {option}: not in its --help"
            )
        elif (
            program == "pytest" and not arg.startswith(("-", "/", "~")) and "/" in arg
        ) or arg == "example_suites":
            assert (ROOT / arg.split("::")[0]).exists(), arg


def test_every_command_line_names_programs_options_and_paths_that_exist() -> None:
    lines = _command_lines()
    assert any(line.startswith("pytest ") for line in lines)
    for line in lines:
        for command in _commands(line):
            _check(command)


def test_the_options_page_names_the_group_of_the_help() -> None:
    """The option table itself is made from the option definitions (scripts/mkdocs_hooks.py);
    the page's words about ``pytest --help`` are checked here."""
    page = (ROOT / "docs" / "reference" / "options.md").read_text()
    title = re.search(r'Every option sits in the group "([^"]+)"', page)
    assert title is not None and f"\n{title[1]}:\n" in _help("pytest")


# ---------------------------------------------------------------------------------------------
# ini, outputs, and the words of the docs


def test_the_ini_example_takes_effect(pytester: pytest.Pytester) -> None:
    [(_, block)] = list(_blocks("ini"))
    pytester.makefile(".ini", pytest=block.text)
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.message_profile(["4B"])
        def test_rtt(tfgrpc, tensor_server):
            tfgrpc.p2p_latency(tensor_server)
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--junitxml=perf.xml")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["tfgrpc: fabrics lo (127.0.0.1*"])
    xml = (pytester.path / "perf.xml").read_text()
    # The run's settings, not its sample count: on a loaded machine the run's time bound
    # (max_seconds) can end the 2,000 echoes early.
    [settings] = re.findall(r'name="tfgrpc.p2p_latency.settings" value="([^"]*)"', xml)
    assert "iterations=2000" in settings.split(";"), settings
    assert 'name="tfgrpc.p2p_latency.4B.link_rate_MBps" value="10000"' in xml


def test_the_outputs_shown_are_those_of_a_fresh_run() -> None:
    assert {b.output for _, b in _blocks("text") if b.output} == {
        "marker-error",
        "budget-breach",
        "summary",
    }
    assert OUTPUTS.check() == []


def test_the_docs_and_help_texts_speak_of_the_project_not_of_issues() -> None:
    texts = {_name(doc): doc.read_text() for doc in DOCS}
    texts["benchmarks/RESULTS.md"] = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        texts[f"benchmarks/{script.name}"] = script.read_text()
    texts["targets.py --help"] = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "targets.py"), "--help"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    texts["pytest --help"] = _help("pytest")
    found = {
        name: re.findall(r"\bissues? \d+|\bissue's\b", text, re.I) for name, text in texts.items()
    }
    assert {name: hits for name, hits in found.items() if hits} == {}


# ---------------------------------------------------------------------------------------------
# yaml: manifests, whose containers' command lines are checked like the shell's


def _containers(node: object) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        if "command" in node and "image" in node:
            yield node
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


def test_every_manifest_parses_and_runs_commands_that_exist() -> None:
    yaml = pytest.importorskip("yaml", reason="PyYAML (the dev extra) reads the manifests")
    blocks = list(_blocks("yaml"))
    assert blocks
    for doc, block in blocks:
        for manifest in yaml.safe_load_all(block.text):
            assert {"apiVersion", "kind"} <= set(manifest), f"{_name(doc)}:{block.line + 1}"
            containers = list(_containers(manifest))
            assert containers, f"{_name(doc)}:{block.line + 1}: no container runs anything"
            for container in containers:
                _check([str(word) for word in container["command"]])
