"""The plugin costs nothing until a run uses it: no grpc or numpy import, no set-up, no
header line in a project with no tfgrpc test; all of it once a test or an option uses it."""

from __future__ import annotations

import sys

import pytest
from junitparser.xunit2 import JUnitXml

RUNNER = """
import sys
import pytest

code = pytest.main(sys.argv[1:])
heavy = (
    "grpc",
    "numpy",
    "pytest_tfgrpc.plugin.session",
    "pytest_tfgrpc.plugin.agents",
    "pytest_tfgrpc.hosts.emulated",
    "pytest_tfgrpc.wire",
)
loaded = sorted(m for m in sys.modules if m.startswith(heavy))
print("HEAVY", len(loaded), " ".join(loaded[:5]))
sys.exit(code)
"""

PLAIN = """
def test_plain():
    assert 1 + 1 == 2
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    runner = pytester.path / "run_pytest.py"
    runner.write_text(RUNNER)
    return pytester.run(sys.executable, str(runner), "-p", "no:cacheprovider", *args)


def _heavy_modules(result: pytest.RunResult) -> int:
    line = next(x for x in result.outlines if x.startswith("HEAVY "))
    return int(line.split()[1])


@pytest.mark.parametrize("args", [("--co", "-q"), ("--co",), ("-v",), ("-v", "-n", "0")])
def test_a_project_without_tfgrpc_tests_pays_nothing(
    pytester: pytest.Pytester, args: tuple[str, ...]
) -> None:
    if "-n" in args:
        pytest.importorskip("xdist")
    pytester.makepyfile(test_plain=PLAIN)
    result = _run(pytester, *args)
    assert result.ret == 0, result.stdout.str()
    assert _heavy_modules(result) == 0, result.stdout.str()
    for line in result.outlines + result.errlines:
        assert not line.startswith("tfgrpc"), line


def test_a_bad_tf_config_does_not_matter_to_a_project_that_does_not_use_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_CONFIG", "{not json")
    pytester.makepyfile(test_plain=PLAIN)
    result = _run(pytester, "-q")
    assert result.ret == 0, result.stdout.str()
    assert _heavy_modules(result) == 0


@pytest.mark.parametrize(
    "test",
    [
        "def test_uses(fabric):\n    assert fabric.name == 'lo'\n",
        # through another fixture of the project's own
        "import pytest\n\n@pytest.fixture\ndef mine(fabric):\n    return fabric\n\n"
        "def test_uses(mine):\n    assert mine.name == 'lo'\n",
        "import pytest\n\n@pytest.mark.budget(p99='2ms')\ndef test_uses():\n    pass\n",
        "import pytest\n\npytestmark = pytest.mark.tfgrpc_run(iterations=5)\n\n"
        "def test_uses():\n    pass\n",
        "import pytest\n\n@pytest.mark.tfgrpc_engines('grpcio')\ndef test_uses():\n    pass\n",
        "import pytest\n\n@pytest.mark.tfgrpc_streams(2)\ndef test_uses():\n    pass\n",
        "def test_uses(tfgrpc_engine):\n    assert tfgrpc_engine.name == 'grpcio'\n",
    ],
    ids=[
        "fixture",
        "indirect-fixture",
        "marker",
        "module-marker",
        "engine",
        "streams",
        "engine-fixture",
    ],
)
def test_a_test_that_uses_the_plugin_wakes_it(pytester: pytest.Pytester, test: str) -> None:
    pytester.makepyfile(test_plain=PLAIN, test_uses=test)
    result = _run(pytester, "-v")
    assert result.ret == 0, result.stdout.str()
    assert _heavy_modules(result) > 0
    # Woken during collection: the header lines follow the "collected" line.
    result.stdout.fnmatch_lines(["*collected 2 items", "tfgrpc: fabrics lo (127.0.0.1*"])
    assert sum(line.startswith("tfgrpc: fabrics") for line in result.outlines) == 1


@pytest.mark.parametrize(
    "option",
    [
        "--fabric=lo",
        "--tfgrpc-agent-token-file=token",
        "--tfgrpc-engines=grpcio",
        "--tfgrpc-streams=2",
    ],
)
def test_an_option_wakes_the_plugin_before_collection(
    pytester: pytest.Pytester, option: str
) -> None:
    pytester.makepyfile(test_plain=PLAIN)
    result = _run(pytester, "-v", option)
    assert result.ret == 0, result.stdout.str()
    assert _heavy_modules(result) > 0
    result.stdout.fnmatch_lines(["tfgrpc: fabrics lo (127.0.0.1*", "*collected 1 item"])
    assert sum(line.startswith("tfgrpc: fabrics") for line in result.outlines) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tfgrpc_fabric = nosuchif0", "*nosuchif0*"),
        ("tfgrpc_iterations = many", "iterations='many' from ini tfgrpc_iterations: *"),
        ("tfgrpc_allocator = greedy", "*tfgrpc_allocator*'greedy'*"),
    ],
)
def test_bad_settings_found_on_waking_are_usage_errors(
    pytester: pytest.Pytester, value: str, message: str
) -> None:
    pytester.makeini(f"[pytest]\n{value}\n")
    pytester.makepyfile(test_uses="def test_uses(fabric):\n    pass\n")
    result = pytester.runpytest()  # what is imported is not in question: in this process
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {message}"])
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    assert "Traceback" not in result.stdout.str() + result.stderr.str()


def test_a_bad_tf_config_found_on_waking_is_a_header_note(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Training containers set TF_CONFIG for TensorFlow, not for this plugin (issue 12).
    monkeypatch.setenv("TF_CONFIG", "{not json")
    pytester.makepyfile(test_uses="def test_uses(fabric):\n    pass\n")
    result = pytester.runpytest()
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["tfgrpc: TF_CONFIG ignored, servers run here: TF_CONFIG: not JSON*"]
    )


def test_the_xdist_controller_wakes_on_the_first_tfgrpc_report(
    pytester: pytest.Pytester,
) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_plain=PLAIN, test_uses="def test_uses(fabric):\n    pass\n")
    xml = pytester.path / "out.xml"
    result = pytester.runpytest_subprocess("-n", "2", f"--junitxml={xml}")
    result.assert_outcomes(passed=2)
    suite = next(iter(JUnitXml.fromfile(str(xml))))
    names = {p.name for p in suite.properties()}  # type: ignore[no-untyped-call]
    assert "tfgrpc.meta.host" in names or any(n.startswith("tfgrpc.meta.") for n in names)

    # and stays asleep when no test uses the plugin
    xml.unlink()
    pytester.path.joinpath("test_uses.py").unlink()
    result = pytester.runpytest_subprocess("-n", "2", f"--junitxml={xml}")
    result.assert_outcomes(passed=1)
    suite = next(iter(JUnitXml.fromfile(str(xml))))
    assert not any(p.name.startswith("tfgrpc.") for p in suite.properties())  # type: ignore[no-untyped-call]


UNTOUCHED = """
import os
import signal

def test_untouched():
    # A run that does not use tfgrpc keeps pytest's SIGTERM and its previous JUnit file
    # (pytest replaces it only when the session ends).
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    with open(os.environ["OLD_XML"]) as old:
        assert old.read() == "<old/>"
"""


def test_a_project_without_tfgrpc_tests_keeps_its_sigterm_and_old_junit(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    xml = pytester.path / "old.xml"
    xml.write_text("<old/>")
    monkeypatch.setenv("OLD_XML", str(xml))
    pytester.makepyfile(test_plain=UNTOUCHED)
    result = _run(pytester, "-q", f"--junitxml={xml}")
    assert result.ret == 0, result.stdout.str()
    assert _heavy_modules(result) == 0
    assert "<old/>" not in xml.read_text()  # written anew at the end, as pytest does
