"""A dump's archive made piece by piece (:class:`~tdreplay.codec.archive.Packed`) is the tar
archive :mod:`tarfile` writes of the same folder, byte for byte, read at any offset."""

from __future__ import annotations

import io
import os
import random
import tarfile
from pathlib import Path

import pytest

from tdreplay.codec.archive import Packed, pack, unpack
from tdreplay.codec.errors import CodecError


def _tarfile_pack(folder: Path) -> bytes:
    """What tarfile writes of ``folder``: regular files, sorted, mode 0600 (as a dump)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                info = tarfile.TarInfo(path.relative_to(folder).as_posix())
                info.size, info.mode = path.stat().st_size, 0o600
                with path.open("rb") as f:
                    tar.addfile(info, f)
    return out.getvalue()


def test_a_packed_folder_is_tarfiles_archive_at_any_offset(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "x.bin").write_bytes(os.urandom(1000))
    (src / "a" / "empty").write_bytes(b"")
    (src / "a" / "b" / ("long" * 40)).write_bytes(os.urandom(5000))  # a PAX header
    (src / "a" / "é.json").write_bytes(b"{}")  # not ASCII: a PAX header too
    (src / "big").write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    want = _tarfile_pack(src)
    packed = Packed(src)
    assert len(packed) == len(want) and pack(src) == want
    rng = random.Random(0)
    for _ in range(200):
        start, n = rng.randrange(len(want) + 10), rng.randrange(70_000)
        assert bytes(packed.read(start, n)) == want[start : start + n], (start, n)
    written = io.BytesIO()
    packed.write_to(written)
    assert written.getvalue() == want
    unpack(want, tmp_path / "copy", max_bytes=1 << 30)
    assert (tmp_path / "copy" / "big").read_bytes() == (src / "big").read_bytes()


def test_a_file_that_changes_while_it_is_sent_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 4096)
    packed = Packed(tmp_path)
    (tmp_path / "f").write_bytes(b"x" * 10)  # cut short after the layout was worked out
    with pytest.raises(CodecError, match="'f' changed while it was sent"):
        packed.read(0, len(packed))


def test_a_link_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    (tmp_path / "link").symlink_to(tmp_path / "f")
    with pytest.raises(CodecError, match="'link' is not a regular file"):
        Packed(tmp_path)
