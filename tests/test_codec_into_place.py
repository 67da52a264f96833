"""Moving a finished export into place without replacing a file: with hard links (the atomic
check), and on a filesystem without them (vfat, exFAT, some SMB and FUSE mounts: ``link``
fails with EPERM or ENOTSUP), where the name is claimed by an exclusive create instead. This
kernel has no such filesystem, so ``link`` is made to fail as theirs does."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tdreplay.codec.errors import PathExists
from tdreplay.codec.exports import into_place


def finished(folder: Path) -> Path:
    tmp = folder / ".x.csv.tmp"
    tmp.write_text("ours")
    return tmp


@pytest.fixture(params=["links", "no links"])
def links(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "no links":

        def refused(*args: object, **kwargs: object) -> None:
            raise OSError(errno.EPERM, "Operation not permitted")

        monkeypatch.setattr(os, "link", refused)
    return str(request.param)


def test_an_export_lands_on_a_free_name(tmp_path: Path, links: str) -> None:
    tmp = finished(tmp_path)
    into_place(tmp, tmp_path / "x.csv", replace=False, table="t")
    assert (tmp_path / "x.csv").read_text() == "ours"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.csv"]


def test_a_taken_name_is_refused_and_kept(tmp_path: Path, links: str) -> None:
    (tmp_path / "x.csv").write_text("theirs")
    tmp = finished(tmp_path)
    with pytest.raises(PathExists, match=r"'x\.csv' exists"):
        into_place(tmp, tmp_path / "x.csv", replace=False, table="t")
    assert (tmp_path / "x.csv").read_text() == "theirs"
    assert tmp.read_text() == "ours"  # the caller's to delete


def test_another_link_failure_is_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "link", full)
    tmp = finished(tmp_path)
    with pytest.raises(OSError, match="No space"):
        into_place(tmp, tmp_path / "x.csv", replace=False, table="t")
    assert not (tmp_path / "x.csv").exists()
