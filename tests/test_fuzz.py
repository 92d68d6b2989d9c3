"""The Python parsers a stranger's bytes reach, fuzzed for a few seconds (the long run:
``scripts/fuzz_parsers.py --seconds 120``, output in benchmarks/results/fuzz_parsers.txt)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "scripts" / "fuzz_parsers.py"


def test_no_byte_string_drives_a_parser_into_an_error_of_its_own_or_a_long_call() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--seconds", "3"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 findings" in done.stdout
    for target in ("content_span", "decode_tensor", "decode_pull_request", "role_argv"):
        line = next(x for x in done.stdout.splitlines() if x.startswith(f"{target}:"))
        assert int(line.split()[1]) > 100, line  # it did try inputs
