"""host/files.py: where a name from elsewhere (an object key's tail, a manifest path) lands under a folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from host.files import inside, merge_dir


@pytest.mark.parametrize(
    ("name", "lands"),
    [
        ("a.txt", "a.txt"),
        ("sub/a.txt", "sub/a.txt"),
        ("sub//a.txt", "sub/a.txt"),
        ("sub/../a.txt", "a.txt"),
        ("./a.txt", "a.txt"),
        ("in/a.txt", "real/a.txt"),  # a link that stays inside is followed
    ],
)
def test_a_name_inside_the_folder_lands_there(tmp_path: Path, name: str, lands: str) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "in").symlink_to(tmp_path / "real", target_is_directory=True)
    assert inside(tmp_path, name) == tmp_path.resolve() / lands


@pytest.mark.parametrize(
    "name", ["../a.txt", "sub/../../a.txt", "/etc/passwd", "out/a.txt", "", ".", "sub/", "a\0b", "loop/a"]
)
def test_a_name_that_would_leave_the_folder_lands_nowhere(tmp_path: Path, name: str) -> None:
    (tmp_path / "out").symlink_to(tmp_path.parent, target_is_directory=True)
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    assert inside(tmp_path, name) is None


def test_a_merge_keeps_what_the_folder_has_and_leaves_behind_what_would_leave_it(tmp_path: Path) -> None:
    source, target, outside = tmp_path / "src", tmp_path / "dst", tmp_path / "outside"
    for folder in (source / "out", target, outside):
        folder.mkdir(parents=True)
    (source / "new.txt").write_text("new")
    (source / "same.txt").write_text("theirs")
    (source / "out" / "escape.txt").write_text("planted")
    (target / "same.txt").write_text("mine")
    (target / "kept.txt").write_text("kept")
    (target / "out").symlink_to(outside, target_is_directory=True)
    assert merge_dir(source, target) == ["out/escape.txt"]
    assert {p.name: p.read_text() for p in target.iterdir() if p.is_file() and not p.is_symlink()} == {
        "new.txt": "new",
        "same.txt": "theirs",
        "kept.txt": "kept",
    }
    assert list(outside.iterdir()) == []
