"""Files in shared places: this user's private directory, opened without following links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pytest_tfgrpc import private_files
from pytest_tfgrpc.private_files import PrivatePathError, open_private, private_dir


@pytest.fixture
def base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(private_files, "_base", lambda: tmp_path)
    return tmp_path


def test_the_directory_is_made_private(base: Path) -> None:
    made = private_dir("x")
    assert made.parent == base and oct(made.stat().st_mode & 0o777) == oct(0o700)
    assert private_dir("x") == made  # and taken as it is the next time


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o701, 0o777])
def test_a_directory_open_to_others_is_refused(base: Path, mode: int) -> None:
    (base / "x").mkdir()
    (base / "x").chmod(mode)
    with pytest.raises(PrivatePathError, match=f"open to others.*chmod 700 {base / 'x'}"):
        private_dir("x")


def test_a_linked_or_foreign_directory_is_refused(base: Path, tmp_path: Path) -> None:
    (base / "elsewhere").mkdir(mode=0o700)
    (base / "x").symlink_to(base / "elsewhere")
    with pytest.raises(PrivatePathError, match="not a directory"):
        private_dir("x")
    (base / "y").write_text("")
    with pytest.raises(PrivatePathError, match="not a directory"):
        private_dir("y")
    if os.geteuid() == 0:
        (base / "z").mkdir(mode=0o700)
        os.chown(base / "z", 12345, 12345)
        with pytest.raises(PrivatePathError, match="belongs to uid 12345"):
            private_dir("z")


def test_a_file_is_opened_without_following_links_nor_truncating(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("keep")
    (tmp_path / "link").symlink_to(victim)
    with pytest.raises(PrivatePathError, match="symbolic link"):
        open_private(tmp_path / "link")
    assert victim.read_text() == "keep"
    fd = open_private(victim)
    os.close(fd)
    assert victim.read_text() == "keep"
    fd = open_private(tmp_path / "new")
    os.close(fd)
    assert oct((tmp_path / "new").stat().st_mode & 0o777) == oct(0o600)
