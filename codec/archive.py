"""A table's checkpoint as one archive on the wire (``dump`` / ``load``), and the one way
either side unpacks an archive it received.

The archive is a plain tar stream (POSIX, uncompressed) of a checkpoint folder:
regular files under relative names, nothing else. Whoever receives one treats
it as untrusted: :func:`unpack` writes only regular files and folders, under
names that stay inside the destination (no absolute names, no ``..``, no
links, devices or other special members), never over an existing file, and
refuses an archive past its byte or member limits - with an error naming
the member, before anything of it is used. What the files hold is checked
by the checkpoint reader, which never runs code from them.

    >>> import tempfile
    >>> src = Path(tempfile.mkdtemp()); (src / "sub").mkdir()
    >>> _ = (src / "sub" / "x.bin").write_bytes(b"abc")
    >>> dest = Path(tempfile.mkdtemp()) / "copy"
    >>> unpack(pack(src), dest, max_bytes=1 << 20)
    >>> (dest / "sub" / "x.bin").read_bytes()
    b'abc'
"""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .errors import CodecError

#: members an archive may hold at most (a checkpoint has a few dozen files)
MAX_MEMBERS = 100_000
#: bytes copied at a time
CHUNK = 1 << 20


def pack(folder: Path) -> bytes:
    """The archive of every regular file under ``folder`` (sorted, relative names), in
    memory (:class:`Packed` makes it piece by piece).

    Raises:
        CodecError: ``folder`` holds a link or a special file (a checkpoint never does).
    """
    packed = Packed(folder)
    return bytes(packed.read(0, len(packed)))


class Packed:
    """The archive of a folder (:func:`pack`'s bytes), laid out up front and read piece by
    piece: a dump of any size goes out with one part in memory at a time.

    The layout is tar's (POSIX PAX, as :mod:`tarfile` writes it): each file's header
    block(s), its bytes padded to 512, two empty blocks, the whole padded to tar's
    record size. The files are read when their bytes are asked for, so they must not
    change meanwhile (a dump folder does not).

        >>> import tempfile
        >>> src = Path(tempfile.mkdtemp()); _ = (src / "x.bin").write_bytes(b"abc")
        >>> packed = Packed(src)
        >>> len(packed), bytes(packed.read(512, 3))
        (10240, b'abc')

    Raises:
        CodecError: ``folder`` holds a link or a special file.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        #: (start, header, file, file bytes) of each member, in archive order
        self._members: list[tuple[int, bytes, Path, int]] = []
        at = 0
        for path in sorted(folder.rglob("*")):
            name = path.relative_to(folder).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise CodecError(f"{name!r} is not a regular file or folder", field="archive")
            if path.is_file():
                info = tarfile.TarInfo(name)
                info.size = path.stat().st_size
                info.mode = 0o600
                header = info.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape")
                self._members.append((at, header, path, info.size))
                at += len(header) + _blocks(info.size)
        end = at + 2 * tarfile.BLOCKSIZE  # two empty blocks end the archive
        self._size = -(-end // tarfile.RECORDSIZE) * tarfile.RECORDSIZE

    def __len__(self) -> int:
        return self._size

    def read(self, start: int, n: int) -> bytearray:
        """Bytes ``start .. start + n`` of the archive (fewer past its end), in a new buffer.

        Raises:
            CodecError: a file changed size since the archive was laid out.
        """
        stop = min(start + n, self._size)
        out = bytearray(max(0, stop - start))  # zeros: padding and the end blocks
        for at, header, path, size in self._members:
            body = at + len(header)
            if at >= stop or body + size <= start:
                continue
            _place(out, start, at, header)
            lo, hi = max(start, body), min(stop, body + size)
            if lo < hi:
                with path.open("rb") as f:
                    got = os.pread(f.fileno(), hi - lo, lo - body)
                if len(got) != hi - lo:
                    raise CodecError(f"{path.name!r} changed while it was sent", field="archive")
                out[lo - start : hi - start] = got
        return out

    def write_to(self, file: BinaryIO) -> None:
        """Write the whole archive into ``file``, :data:`CHUNK` bytes at a time."""
        for at in range(0, self._size, CHUNK):
            file.write(self.read(at, CHUNK))


def _blocks(size: int) -> int:
    """Bytes ``size`` bytes take in a tar archive: whole 512-byte blocks."""
    return -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _place(out: bytearray, start: int, at: int, data: bytes) -> None:
    """The part of ``data`` (at archive offset ``at``) that falls in ``out`` (at ``start``)."""
    lo, hi = max(start, at), min(start + len(out), at + len(data))
    if lo < hi:
        out[lo - start : hi - start] = data[lo - at : hi - at]


def _member_path(dest: Path, member: tarfile.TarInfo) -> Path:
    name = PurePosixPath(member.name)
    if not member.name or name.is_absolute() or ".." in name.parts or "\\" in member.name:
        raise CodecError(
            f"archive member {member.name!r:.200} leaves the destination", field="archive"
        )
    if not (member.isreg() or member.isdir()):
        raise CodecError(
            f"archive member {member.name!r:.200} is not a regular file or folder (links and "
            "special files are refused)",
            field="archive",
        )
    return dest.joinpath(*name.parts)


def check_start(block: bytes) -> None:
    """Refuse ``block`` (an archive's first 512 bytes) unless it is a tar member's header:
    a load in parts checks it as soon as it has it, before the rest is sent.

        >>> check_start(b"not a tar header".ljust(512, b"?"))
        Traceback (most recent call last):
        ...
        tdreplay.codec.errors.CodecError: the archive does not begin with a tar header: invalid header

    Raises:
        CodecError: it is not (an empty header, a bad checksum).
    """
    try:
        tarfile.TarInfo.frombuf(block[: tarfile.BLOCKSIZE], tarfile.ENCODING, "surrogateescape")
    except tarfile.HeaderError as err:
        raise CodecError(
            f"the archive does not begin with a tar header: {err}", field="archive"
        ) from None


def unpack(
    data: bytes | Path, dest: Path, *, max_bytes: int, max_members: int = MAX_MEMBERS
) -> None:
    """Write the archive ``data`` (its bytes, or a file holding them, read as it goes) into
    the new folder ``dest`` (its parent must exist).

    Raises:
        CodecError: not a tar archive; a member that is not a regular file or folder,
            or whose name leaves ``dest``; more than ``max_members`` members or
            ``max_bytes`` bytes of files. ``dest`` may then hold part of the archive:
            the caller deletes it.
        FileExistsError: ``dest`` exists, or the archive names a file twice.
    """
    dest.mkdir(mode=0o700)
    try:
        source = {"name": data} if isinstance(data, Path) else {"fileobj": io.BytesIO(data)}
        with tarfile.open(mode="r:", **source) as tar:
            _unpack_members(tar, dest, max_bytes, max_members)
    except tarfile.TarError as err:  # not tar, cut short, or a damaged header
        raise CodecError(f"not a whole tar archive: {err}", field="archive") from None


def _unpack_members(tar: tarfile.TarFile, dest: Path, max_bytes: int, max_members: int) -> None:
    total = 0
    for count, member in enumerate(tar, start=1):
        if count > max_members:
            raise CodecError(f"the archive holds more than {max_members} members", field="archive")
        path = _member_path(dest, member)
        if member.isdir():
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            continue
        total += member.size
        if total > max_bytes:
            raise CodecError(
                f"the archive's files exceed {max_bytes} bytes", field="archive", got=total
            )
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        source = tar.extractfile(member)
        assert source is not None  # a regular member
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(path, flags, 0o600), "wb") as f:
            while chunk := source.read(CHUNK):
                f.write(chunk)
