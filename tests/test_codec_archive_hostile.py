"""The archive reader (:class:`~tdreplay.codec.archive.Unpacker`) against hostile bytes: an
archive crafted or damaged by whoever sent it is refused with a :class:`CodecError`
naming what is wrong - never another exception, a hang, a file outside the destination
or a file left open - and a valid one unpacks to what :mod:`tarfile` extracts of it."""

from __future__ import annotations

import contextlib
import io
import os
import random
import tarfile
from pathlib import Path

import pytest
from test_codec_archive import _fed, _open_in

from tdreplay.codec.errors import CodecError

END = b"\0" * 1024


def _member(name: str, data: bytes = b"", kind: bytes = tarfile.REGTYPE) -> bytes:
    info = tarfile.TarInfo(name)
    info.size, info.type = len(data), kind
    header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
    return header + data + b"\0" * (-len(data) % 512)


def _record(key: bytes, value: bytes) -> bytes:
    """One extended-header record, ``"<length> <key>=<value>\\n"``."""
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def _extended(records: bytes, size: int | None = None) -> bytes:
    """An extended header holding ``records``; ``size`` written over its size field in
    base-256 (as GNU tar writes sizes past the octal field's range), if given."""
    info = tarfile.TarInfo("././@PaxHeader")
    info.type, info.size = tarfile.XHDTYPE, len(records)
    block = bytearray(info.tobuf(tarfile.USTAR_FORMAT))
    if size is not None:
        block[124:136] = b"\x80" + (size % (1 << 88)).to_bytes(11, "big")
        if size < 0:
            block[124] = 0xFF
        block[148:156] = b" " * 8
        block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block) + records + b"\0" * (-len(records) % 512)


HOSTILE = {
    "negative-extended-size": (_extended(b"", size=-600) + _member("f", b"x") + END, "size"),
    "superscript-size": (_extended(_record(b"size", "²".encode())) + _member("f", b"x"), "no size"),
    "arabic-digit-size": (
        _extended(_record(b"size", "٣".encode())) + _member("f", b"x"),
        "no size",
    ),
    "nul-in-name": (_extended(_record(b"path", b"a\0b")) + _member("f", b"x") + END, "a\\x00b"),
    "under-a-file": (_member("a", b"x") + _member("a/b/c", b"y") + END, "'a/b/c'"),
    "folder-under-a-file": (_member("a", b"x") + _member("a/b", b"", tarfile.DIRTYPE), "'a/b'"),
    "named-twice": (_member("a", b"x") + _member("a", b"y") + END, "'a'"),
    "folder-over-a-file": (_member("a", b"x") + _member("a", b"", tarfile.DIRTYPE), "'a'"),
    "file-over-a-folder": (_member("a", b"", tarfile.DIRTYPE) + _member("a", b"y"), "'a'"),
    "the-destination": (_member(".", b"x") + END, "'.'"),
    "name-too-long": (_member("x" * 300, b"x") + END, "xxxx"),
    "path-too-long": (_member("a/" * 3000 + "f", b"x") + END, "a/a/a"),
    "no-end-blocks": (_member("f", b"x"), "ends early"),
}


@pytest.mark.timeout(20)
@pytest.mark.parametrize(("archive", "match"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_archive_is_refused_with_a_codec_error(
    tmp_path: Path, archive: bytes, match: str
) -> None:
    """Only :class:`CodecError` (a server answers it 400; any other error is its 500),
    quoting the member or the fault; no file left open, nothing outside the folder."""
    for i, sizes in enumerate([[1, 700], [512], [len(archive) + 1]]):
        with pytest.raises(CodecError) as err:
            _fed(archive, tmp_path / f"d{i}", sizes, max_bytes=1 << 20)
        assert match in str(err.value), err.value
        assert _open_in(tmp_path) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d0", "d1", "d2"]


# ----------------------------------------------------------------- random archives
_ALPHABET = "abcXYZ09_-. é漢"


def _name(rng: random.Random) -> str:
    name = "".join(rng.choice(_ALPHABET) for _ in range(rng.choice([1, 5, 60, 99]))).strip()
    return name if name not in ("", ".", "..") else f"n{rng.randrange(10**6)}"


def _random_archive(rng: random.Random, src: Path) -> bytes:
    """tarfile's PAX archive of a random folder: folders, long and non-ASCII names, empty
    files, sizes on and off a block's edge."""
    folders = [src]
    src.mkdir(parents=True)
    for _ in range(rng.randint(0, 12)):
        path = rng.choice(folders) / _name(rng)
        if path.exists():
            continue
        if rng.random() < 0.3:
            path.mkdir()
            folders.append(path)
        else:
            path.write_bytes(os.urandom(rng.choice([0, 1, 511, 512, 513, 1024, 5000, 70_000])))
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(src.rglob("*")):
            tar.add(path, arcname=path.relative_to(src).as_posix(), recursive=False)
    return out.getvalue()


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() else None
        for p in folder.rglob("*")
    }


def _pieces(rng: random.Random) -> list[int]:
    return [rng.choice([1, 7, 511, 512, 513, 4096, 100_000]) for _ in range(5)]


def test_random_archives_unpack_as_tarfile_extracts_them(tmp_path: Path) -> None:
    for seed in range(25):
        rng, work = random.Random(seed), tmp_path / str(seed)
        archive = _random_archive(rng, work / "src")
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(work / "want", filter="data")
        got = _fed(archive, work / "got", _pieces(rng), max_bytes=1 << 30)
        assert _tree(got.dest) == _tree(work / "want"), seed


def _mutated(rng: random.Random, archive: bytes) -> bytes:
    """``archive`` damaged: bytes changed, cut, inserted or deleted, or a header's size,
    type, prefix or name field rewritten (its checksum made right again)."""
    out, at = bytearray(archive), rng.randrange(len(archive))
    heads = [b for b in range(0, len(out) - 511, 512) if out[b + 257 : b + 262] == b"ustar"]
    kind = rng.randrange(5 if heads else 4)
    if kind == 0:
        out[at] = rng.randrange(256)
    elif kind == 1:
        del out[at:]
    elif kind == 2:
        out[at:at] = os.urandom(rng.randint(1, 600))
    elif kind == 3:
        del out[at : at + rng.randint(1, 600)]
    else:
        head = rng.choice(heads)
        start, n = rng.choice([(124, 12), (156, 1), (345, 155), (0, 100)])
        out[head + start : head + start + n] = bytes(
            rng.choice(b"\x80\xff07./\0 A") for _ in range(n)
        )
        out[head + 148 : head + 156] = b" " * 8
        out[head + 148 : head + 156] = b"%06o\0 " % sum(out[head : head + 512])
    return bytes(out)


@pytest.mark.timeout(60)
def test_damaged_archives_give_a_codec_error_or_files_never_anything_else(
    tmp_path: Path,
) -> None:
    for seed in range(40):
        rng, work = random.Random(seed), tmp_path / str(seed)
        archive = _random_archive(rng, work / "src")
        for i in range(10):
            sandbox = work / f"m{i}"
            sandbox.mkdir()
            with contextlib.suppress(CodecError):  # refused, or unpacked: either is fine
                _fed(
                    _mutated(rng, archive), sandbox / "dest", _pieces(rng),
                    max_bytes=1 << 20, max_members=50,
                )  # fmt: skip
            assert _open_in(sandbox) == [], (seed, i)
            assert os.listdir(sandbox) == ["dest"], (seed, i)


def test_the_folders_deep_names_make_count_against_the_members_limit(tmp_path: Path) -> None:
    """A member named ``a/a/.../f`` makes a folder per level (a block of disk and an inode
    each), none of them a member: a few kilobytes of archive made thousands of folders,
    past any limit on its bytes or members. Each folder a name makes counts as a member."""
    deep = "/".join(["d"] * 30)
    archive = b"".join(_member(f"{i}/{deep}/f", b"x") for i in range(3)) + END
    with pytest.raises(CodecError, match="more than 50 members"):
        _fed(archive, tmp_path / "deep", [10_000], max_bytes=1 << 20, max_members=50)
    assert sum(len(dirs) for _, dirs, _ in os.walk(tmp_path / "deep")) <= 50
    shallow = b"".join(_member(f"{i}/d/f", b"x") for i in range(3)) + END  # 3 + 6 in all
    assert _fed(shallow, tmp_path / "shallow", [10_000], max_members=9).members == 3
