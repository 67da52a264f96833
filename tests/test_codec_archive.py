"""A dump's archive made piece by piece (:class:`~tdreplay.codec.archive.Packed`) is the tar
archive :mod:`tarfile` writes of the same folder, byte for byte, read at any offset."""

from __future__ import annotations

import contextlib
import io
import os
import random
import tarfile
from pathlib import Path

import pytest

from tdreplay.codec.archive import Packed, Unpacker, pack, unpack
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


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def _fed(archive: bytes, dest: Path, sizes: list[int], **limits: int) -> Unpacker:
    """``archive`` fed to an Unpacker into ``dest`` in pieces of ``sizes`` (in turn), finished."""
    unpacker = Unpacker(dest, max_bytes=limits.get("max_bytes", 1 << 30),
                        max_members=limits.get("max_members", 1000))  # fmt: skip
    at, turn = 0, 0
    while at < len(archive):
        n = sizes[turn % len(sizes)]
        unpacker.feed(memoryview(archive)[at : at + n])
        at, turn = at + n, turn + 1
    unpacker.finish()
    return unpacker


def _open_in(folder: Path) -> list[str]:
    """The files under ``folder`` this process holds open (other threads' descriptors,
    which come and go, aside)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(f"{folder}/"):
                out.append(target)
    return out


def test_an_archive_fed_in_pieces_of_any_size_unpacks_as_tarfile_extracts_it(
    tmp_path: Path,
) -> None:
    """Long and non-ASCII names (extended headers), empty files, files ending on and off a
    block's edge, pieces from one byte to more than the archive: each time the files
    tarfile extracts, bit for bit."""
    src = tmp_path / "src"
    (src / "a" / "b").mkdir(parents=True)
    (src / "a" / "empty").write_bytes(b"")
    (src / "a" / "b" / ("long" * 40)).write_bytes(os.urandom(5000))
    (src / "a" / "é.json").write_bytes(b"{}")
    (src / "edge").write_bytes(os.urandom(1024))
    (src / "big").write_bytes(os.urandom(300_007))
    archive = _tarfile_pack(src)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tmp_path / "want", filter="data")
    want = _tree(tmp_path / "want")
    for i, sizes in enumerate(
        [[1], [7, 511], [512], [513], [4096, 1, 100_000], [len(archive) + 1]]
    ):
        got = _fed(archive, tmp_path / f"got{i}", sizes)
        assert _tree(got.dest) == want, sizes
        assert got.members == len(want) and got.nbytes == sum(map(len, want.values()))
        assert _open_in(tmp_path) == []  # every file closed


def _header(name: str, data: bytes, kind: bytes = tarfile.REGTYPE, **pax: str) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.pax_headers = len(data), kind, pax
    body = data + b"\0" * (-len(data) % 512)
    return info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape") + body


def test_an_extended_header_names_and_sizes_the_next_member_only(tmp_path: Path) -> None:
    archive = (_header("short", b"abc", path="renamed/by/pax") + _header("plain", b"xy")
               + b"\0" * 1024)  # fmt: skip
    got = _fed(archive, tmp_path / "got", [100])
    assert _tree(got.dest) == {"renamed/by/pax": b"abc", "plain": b"xy"}


@pytest.mark.parametrize(
    ("archive", "match"),
    [
        (b"", "ends early"),
        (b"\0" * 100, "ends early"),
        (_header("f", b"x" * 2000)[:1500], "ends early"),  # in a member's bytes
        (_header("long" * 40, b"x")[:700], "ends early"),  # in its extended header
        (b"\xff" * 512, "bad checksum"),
        (_header("f", b"x") + b"\x01" * 512, "invalid header"),  # a later header damaged
        (_header("../up", b"x"), "leaves the destination"),
        (_header("/abs", b"x"), "leaves the destination"),
        (_header("l", b"", tarfile.SYMTYPE), "not a regular file or folder"),
        (_header("l", b"", tarfile.LNKTYPE), "not a regular file or folder"),
        (_header("s", b"", tarfile.GNUTYPE_SPARSE), "not a regular file or folder"),
        (_header("n", b"", tarfile.GNUTYPE_LONGNAME), "not a regular file or folder"),
        (_header("f", b"x", size="12x"), "is no size"),
        (_header("f", b"x", path="a") + _header("a", b"y"), "File exists"),
    ],
    ids=["empty", "zeros", "cut-in-data", "cut-in-pax", "garbage", "damaged-later", "dotdot",
         "absolute", "symlink", "hardlink", "sparse", "gnu-longname", "bad-pax-size", "twice"],
)  # fmt: skip
def test_a_bad_archive_is_refused_whatever_the_pieces(
    tmp_path: Path, archive: bytes, match: str
) -> None:
    for i, sizes in enumerate([[1], [512], [len(archive) + 1]]):
        with pytest.raises((CodecError, FileExistsError), match=match):
            _fed(archive, tmp_path / f"d{i}", sizes)
        assert _open_in(tmp_path) == []  # the member's file closed on the error
        assert not (tmp_path / "up").exists()


def test_an_archive_over_its_limits_is_refused_before_its_bytes_are_written(
    tmp_path: Path,
) -> None:
    archive = _header("a", b"x" * 600) + _header("b", b"y" * 600) + b"\0" * 1024
    with pytest.raises(CodecError, match="exceed 1000 bytes"):
        _fed(archive, tmp_path / "bytes", [10_000], max_bytes=1000)
    assert _tree(tmp_path / "bytes") == {"a": b"x" * 600}  # b refused at its header
    with pytest.raises(CodecError, match="more than 1 members"):
        _fed(archive, tmp_path / "members", [10_000], max_members=1)
