"""The results file keeps every finished test: across kills, concurrent writers, odd values."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from pytest_tfgrpc.report.results_file import PIPE_BUF, ResultLog, atomic_write, plain, read_results

# A child that appends records until killed and prints each index once its append returned.
WRITER = textwrap.dedent(
    """
    import sys
    from pytest_tfgrpc.report.results_file import ResultLog

    path, name, count, pad = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    log = ResultLog(path)
    i = 0
    while count < 0 or i < count:
        size = pad if i % 3 else 100  # mix short lines with ones far beyond PIPE_BUF
        log.append(
            f"{name}::test_{i}",
            outcome="passed",
            duration=0.001 * i,
            properties=[("tfgrpc.p2p_latency.1KiB.p99_us", 12.5 + i), ("pad", "x" * size)],
            worker=name,
        )
        print(i, flush=True)
        i += 1
    """
)


def _writer(path: Path, name: str, count: int, pad: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), name, str(count), str(pad)],
        stdout=subprocess.PIPE,
        text=True,
    )


def _check_records(records: list[dict[str, object]], name: str, pad: int) -> list[int]:
    """The indices of ``name``'s records, each checked whole."""
    indices = []
    for record in records:
        test = str(record["test"])
        if not test.startswith(f"{name}::"):
            continue
        i = int(test.rsplit("_", 1)[1])
        props = record["properties"]
        assert isinstance(props, dict)
        assert props["tfgrpc.p2p_latency.1KiB.p99_us"] == 12.5 + i
        assert props["pad"] == "x" * (pad if i % 3 else 100)
        assert record["worker"] == name
        indices.append(i)
    return indices


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_killed_writer_keeps_every_line_it_finished(tmp_path: Path, sig: signal.Signals) -> None:
    path = tmp_path / "results.jsonl"
    pad = 3 * PIPE_BUF
    child = _writer(path, "w", -1, pad)
    assert child.stdout is not None
    acknowledged = -1
    for line in child.stdout:  # let it write a while, then kill it wherever it is
        acknowledged = int(line)
        if acknowledged >= 200:
            break
    child.send_signal(sig)
    for line in child.stdout:  # appends that returned between our last read and the kill
        acknowledged = int(line)
    assert child.wait(timeout=10) == -sig

    records = read_results(path)
    indices = _check_records(records, "w", pad)
    # Every append that returned is there, in order; at most the one being written is lost.
    assert indices[: acknowledged + 1] == list(range(acknowledged + 1))
    assert len(indices) in (acknowledged + 1, acknowledged + 2)
    assert records.skipped <= 1


def test_concurrent_writers_produce_only_whole_lines(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    pad = 16 * PIPE_BUF  # several pages: a buffered or split write would interleave
    children = [_writer(path, name, 300, pad) for name in ("gw0", "gw1", "gw2")]
    for child in children:
        assert child.wait(timeout=120) == 0
    records = read_results(path)
    assert records.skipped == 0, records.problems
    for name in ("gw0", "gw1", "gw2"):
        assert sorted(_check_records(records, name, pad)) == list(range(300))
    raw_lines = path.read_bytes().split(b"\n")
    assert raw_lines[-1] == b""
    assert all(json.loads(line) for line in raw_lines[:-1])


def test_numpy_and_other_values_are_made_plain_json(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultLog(path) as log:
        written = log.append(
            "t::a",
            outcome="passed",
            duration=np.float64(0.25),
            properties={
                "f64": np.float64(1.5),
                "f32": np.float32(0.5),
                "i64": np.int64(7),
                "flag": np.bool_(True),
                "nan": float("nan"),
                "inf": np.float64("inf"),
                "path": Path("/tmp/x"),
                "pair": (np.int32(1), "b"),
                "array": np.array([1.0, 2.0]),
            },
        )
    [record] = read_results(path)
    assert record == written
    props = record["properties"]
    assert props == {
        "f64": 1.5,
        "f32": 0.5,
        "i64": 7,
        "flag": True,
        "nan": "nan",
        "inf": "inf",
        "path": "/tmp/x",
        "pair": [1, "b"],
        "array": [1.0, 2.0],
    }
    assert type(props["f64"]) is float and type(props["i64"]) is int
    assert type(props["flag"]) is bool and type(record["duration"]) is float
    assert plain(np.float64(2.0)).__class__ is float
    assert record["when"] == "call" and record["worker"] is None and record["outcome"] == "passed"


def test_a_name_given_twice_keeps_both_values(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultLog(path) as log:
        log.append(
            "t::two",
            outcome="passed",
            duration=1.0,
            properties=[("tfgrpc.fabric", "lo"), ("tfgrpc.fabric", "eth0"), ("x", "1")],
        )
    [record] = read_results(path)
    assert record["properties"] == {"tfgrpc.fabric": "lo", "x": "1"}
    assert record["repeated"] == [["tfgrpc.fabric", "eth0"]]


def test_a_truncated_last_line_is_skipped_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    with ResultLog(path) as log:
        for i in range(3):
            log.append(f"t::{i}", outcome="passed", duration=0.1)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"test": "t::3", "outcome": "pas')
    records = read_results(path)
    assert [r["test"] for r in records] == ["t::0", "t::1", "t::2"]
    assert records.skipped == 1
    assert "line 4: cut short" in records.problems[0]

    # A later run appends after the remains: its record starts a line of its own.
    with ResultLog(path) as log:
        log.append("t::4", outcome="failed", duration=0.2)
    records = read_results(path)
    assert [r["test"] for r in records] == ["t::0", "t::1", "t::2", "t::4"]
    assert records.skipped == 1
    assert "line 4: not a whole JSON object" in records.problems[0]


def test_a_record_glued_to_remains_is_recovered(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    glued = b'{"test": "t::0", "outc{"test": "t::1", "outcome": "passed"}\n'
    path.write_bytes(glued + b"\n[1, 2]\n")
    records = read_results(path)
    assert [r["test"] for r in records] == ["t::1"]
    assert records.skipped == 2  # the remains, and a line that is JSON but not an object


def test_a_whole_last_line_without_end_of_line_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text('{"test": "t::0"}\n{"test": "t::1"}')
    records = read_results(path)
    assert [r["test"] for r in records] == ["t::0", "t::1"] and records.skipped == 0


def test_a_closed_log_refuses_to_write(tmp_path: Path) -> None:
    log = ResultLog(tmp_path / "r.jsonl")
    log.close()
    log.close()
    with pytest.raises(ValueError, match="closed"):
        log.append("t", outcome="passed", duration=0.0)


def test_atomic_write_replaces_whole_files(tmp_path: Path) -> None:
    target = tmp_path / "junit.xml"
    target.write_text("old")
    atomic_write(target, "<testsuites>\u00e9</testsuites>")
    assert target.read_text(encoding="utf-8") == "<testsuites>\u00e9</testsuites>"
    atomic_write(target, b"\x00\x01")
    assert target.read_bytes() == b"\x00\x01"
    assert os.listdir(tmp_path) == ["junit.xml"]  # no temporary file left behind
    umask = os.umask(0o022)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_atomic_write_leaves_the_old_file_when_it_fails(tmp_path: Path) -> None:
    target = tmp_path / "junit.xml"
    target.write_text("old")
    os.mkdir(tmp_path / "blocker")
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / "blocker", "new")  # os.replace cannot put a file over a dir
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["blocker", "junit.xml"]


def test_the_results_file_is_written_as_it_happens(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    log = ResultLog(path)
    try:
        log.append("t::0", outcome="passed", duration=0.0)
        # Another reader sees the line before the log is closed or the process exits.
        assert [r["test"] for r in read_results(path)] == ["t::0"]
        log.append("t::1", outcome="passed", duration=0.0)
        assert len(read_results(path)) == 2
    finally:
        log.close()
