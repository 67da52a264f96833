"""What a checkpoint may replace at its path: a checkpoint (the swap puts the new one in its
place), or an empty folder - never a file, a link or a folder of someone's files, which the
swap would move aside and delete."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import make_spec, rows

from tdreplay.storage import CheckpointError, PathExists, Table


@pytest.mark.parametrize("what", ["folder of files", "file", "link"])
def test_a_checkpoint_never_replaces_what_is_not_one(tables, tmp_path: Path, what: str) -> None:
    table = tables.create(make_spec(capacity=8))
    table.extend(rows(0, 4))
    target, mine = tmp_path / "results", tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    if what == "folder of files":
        target.mkdir()
        (target / "notes.txt").write_text("keep me")
    elif what == "file":
        target.write_text("keep me")
    else:
        target.symlink_to(mine, target_is_directory=True)
    with pytest.raises(PathExists, match="not a checkpoint"):
        table.checkpoint(target)
    kept = target / "notes.txt" if what != "file" else target
    assert kept.read_text() == "keep me" and (mine / "notes.txt").read_text() == "keep me"
    assert table.checkpoints["failed"] == 1


def test_a_checkpoint_replaces_a_checkpoint_or_an_empty_folder(tables, tmp_path: Path) -> None:
    a = tables.create(make_spec("a", capacity=8))
    b = tables.create(make_spec("b", capacity=8))
    a.extend(rows(0, 4))
    b.extend(rows(10, 2))
    empty = tmp_path / "empty"
    empty.mkdir()
    a.checkpoint(empty)
    b.checkpoint(empty)  # the library may replace another table's checkpoint (the server may not)
    restored = Table.restore(empty, root=tmp_path / "restored")
    assert restored.name == "b" and len(restored) == 2
    restored.close()
    with pytest.raises(PathExists, match="of this table"):
        a.checkpoint(empty, own_only=True)


@pytest.mark.parametrize("name", ["[ab]", "*", "?"])
def test_a_name_is_never_a_pattern_for_the_copy_a_crash_set_aside(
    tables, tmp_path: Path, name: str
) -> None:
    """With no checkpoint at a path, the copy an interrupted swap set aside
    (``<path>.old-<hex>``) is read; it was looked up by glob, so a checkpoint named ``[ab]``,
    ``*`` or ``?`` found ``a``'s aside copy and restored it in its place."""
    table = tables.create(make_spec("t", capacity=8))
    table.extend(rows(0, 4))
    folder = tmp_path / "runs"
    table.checkpoint(folder / "a")
    (folder / "a").rename(folder / "a.old-12345678")  # a crash between the swap's renames
    with pytest.raises(CheckpointError, match="no checkpoint at"):
        Table.restore(folder / name, tmp_path / "elsewhere")
    restored = Table.restore(folder / "a", tmp_path / "elsewhere")  # its own aside copy
    assert len(restored) == 4
    restored.destroy()
