"""The lockstep turnstile of ``tfgrpc-ab --interleave rounds`` (pytest_tfgrpc.turns)."""

from __future__ import annotations

import itertools
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from pytest_tfgrpc.turns import Turn, TurnClient, Turnstile


def _overlap_free(turns: list[Turn]) -> bool:
    return all(a.released <= b.granted for a, b in itertools.pairwise(turns))


def test_turns_alternate_strictly_and_never_overlap() -> None:
    rounds = 6
    with Turnstile(hold_s=10.0) as turnstile:
        assert stat.S_IMODE(Path(turnstile.path).parent.stat().st_mode) == 0o700
        clients = {side: TurnClient(turnstile.path, side, 20.0) for side in "AB"}

        def side_loop(client: TurnClient) -> None:
            for _ in range(rounds):
                client.take()
                time.sleep(0.01)  # the round's work, while holding the turn
            client.close()

        threads = [threading.Thread(target=side_loop, args=(c,)) for c in clients.values()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        time.sleep(0.1)
        turns = turnstile.turns()
    assert all(client.joined is False for client in clients.values())
    assert len(turns) == 2 * rounds
    sides = [turn.side for turn in turns]
    assert all(a != b for a, b in itertools.pairwise(sides)), sides
    assert _overlap_free(turns)


def test_a_side_that_closes_lets_the_other_run_free() -> None:
    with Turnstile(hold_s=10.0) as turnstile:
        a = TurnClient(turnstile.path, "A", 5.0)
        b = TurnClient(turnstile.path, "B", 5.0)
        a.take()
        b_done = threading.Event()

        def b_round() -> None:
            b.take()
            b_done.set()

        threading.Thread(target=b_round).start()
        time.sleep(0.1)
        assert not b_done.is_set()  # A holds the turn: B waits
        a.close()  # A finished (or died)
        assert b_done.wait(5.0)
        started = time.monotonic()
        for _ in range(3):  # alone now: every ask is granted at once
            b.take()
        assert time.monotonic() - started < 1.0
        assert b.joined
        b.close()
        time.sleep(0.1)
        assert [t.side for t in turnstile.turns()] == ["A", "B", "B", "B", "B"]


def test_a_side_that_never_asks_is_dropped_after_the_bound() -> None:
    with Turnstile(hold_s=0.5) as turnstile:
        a = TurnClient(turnstile.path, "A", 10.0)
        b = TurnClient(turnstile.path, "B", 10.0)  # joins, then hangs: never asks
        a.take()
        started = time.monotonic()
        a.take()  # B's move: B owes it and is dropped after 0.5 s, then A runs on
        waited = time.monotonic() - started
        assert 0.4 < waited < 5.0
        assert a.joined
        b.take()  # the dropped side finds the turnstile closed on it and runs free
        assert not b.joined
        a.close()


def test_a_side_without_a_turnstile_runs_free(tmp_path: Path) -> None:
    client = TurnClient(str(tmp_path / "absent.sock"), "A", 1.0)
    assert not client.joined
    client.take()  # no-op, no hang


def test_a_temporary_directory_too_long_for_a_socket_falls_back_to_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A unix socket's path holds at most 107 bytes: a CI runner's long $TMPDIR (a workspace
    path) made ``tfgrpc-ab --interleave rounds`` end in a traceback, 'AF_UNIX path too long'."""
    long = tmp_path / ("a directory name long enough " * 4).strip() / "for no unix socket to fit"
    long.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(long))
    with Turnstile(hold_s=10.0) as turnstile:
        assert len(turnstile.path.encode()) <= 107
        assert stat.S_IMODE(Path(turnstile.path).parent.stat().st_mode) == 0o700
        client = TurnClient(turnstile.path, "A", 20.0)
        client.take()
        client.close()
        time.sleep(0.1)
        assert [turn.side for turn in turnstile.turns()] == ["A"]
    assert not Path(turnstile.path).parent.exists()
    assert list(long.iterdir()) == []  # nothing left where the socket did not fit
