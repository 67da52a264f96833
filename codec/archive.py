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
    >>> import shutil; shutil.rmtree(src); shutil.rmtree(dest.parent)
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from .errors import CodecError

#: members an archive may hold, with the folders their names make (a checkpoint: a few dozen)
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
        >>> import shutil; shutil.rmtree(src)

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
    if "\0" in member.name:
        raise CodecError(f"archive member {member.name!r:.200} is no file name", field="archive")
    if member.type not in (tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.DIRTYPE):
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
    the new folder ``dest`` (its parent must exist), through an :class:`Unpacker`.

    Raises:
        CodecError: not a whole tar archive (its end blocks included); a member that is
            not a regular file or folder, whose name leaves ``dest`` or is no file name
            there (a NUL, too long, under a file of the archive, named twice); more than
            ``max_members`` members or ``max_bytes`` bytes of files. ``dest`` may then
            hold part of the archive: the caller deletes it.
        FileExistsError: ``dest`` exists.
    """
    unpacker = Unpacker(dest, max_bytes=max_bytes, max_members=max_members)
    with open(data, "rb") if isinstance(data, Path) else io.BytesIO(data) as source:
        while piece := source.read(CHUNK):
            unpacker.feed(piece)
    unpacker.finish()


#: what an Unpacker reads next
_HEADER, _PAX, _DATA, _PAD, _END = range(5)
#: bytes of extended (pax) header records a member may carry
MAX_PAX = 64 << 10


class Unpacker:
    """An archive unpacked into the new folder ``dest`` as it arrives, piece by piece
    (:meth:`feed`, then :meth:`finish`): each member's bytes go straight into its file,
    so the archive is never held whole, in memory or on disk. The one reader of archives
    (:func:`unpack` feeds it too), under the module's rules; tar's blocks are read with
    :meth:`tarfile.TarInfo.frombuf`, and POSIX extended headers may give a member's
    ``path`` and ``size``.

        >>> import tempfile
        >>> src = Path(tempfile.mkdtemp()); _ = (src / "x.bin").write_bytes(b"abc")
        >>> archive = pack(src)
        >>> unpacker = Unpacker(Path(tempfile.mkdtemp()) / "copy", max_bytes=1 << 20)
        >>> for at in range(0, len(archive), 100):   # pieces of any size
        ...     unpacker.feed(archive[at : at + 100])
        >>> unpacker.finish(); (unpacker.dest / "x.bin").read_bytes()
        b'abc'
        >>> import shutil; shutil.rmtree(src); shutil.rmtree(unpacker.dest.parent)

    Raises (from :meth:`feed` and :meth:`finish`): as :func:`unpack`; ``dest`` may then
    hold part of the archive: the caller deletes it.
    """

    def __init__(self, dest: Path, *, max_bytes: int, max_members: int = MAX_MEMBERS) -> None:
        dest.mkdir(mode=0o700)
        self.dest = dest
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.members = self.folders = 0  # folders: made for members' names (not members)
        self.nbytes = 0  # of files
        self._state = _HEADER
        self._block = bytearray()  # a header (or extended header) gathered so far
        self._need = tarfile.BLOCKSIZE  # bytes it takes
        self._extended: dict[str, str] = {}  # what an extended header said of the next member
        self._file: BinaryIO | None = None
        self._left = 0  # bytes of the member's file still to come, then of its padding
        self._padding = 0  # after the member's file: to its next 512-byte block
        self._pax_size = 0  # bytes of the extended header being gathered

    def feed(self, piece: bytes | bytearray | memoryview) -> None:
        """Unpack the archive's next ``piece``."""
        view = memoryview(piece).cast("B")
        try:
            while view:
                if self._state == _END:
                    return  # the end blocks' padding: nothing more is read
                if self._state in (_DATA, _PAD):
                    n = min(self._left, len(view))
                    if self._state == _DATA:
                        assert self._file is not None
                        self._file.write(view[:n])
                    view, self._left = view[n:], self._left - n
                    if not self._left:
                        self._next_block()
                    continue
                n = min(self._need - len(self._block), len(view))
                self._block += view[:n]
                view = view[n:]
                if len(self._block) == self._need:
                    block, self._block = bytes(self._block), bytearray()
                    if self._state == _HEADER:
                        self._header(block)
                    else:
                        self._pax(block)
        except BaseException:
            with contextlib.suppress(OSError):  # the error says what went wrong, not this
                self.close()
            raise

    def finish(self) -> None:
        """The archive ended here.

        Raises:
            CodecError: it was cut short (anywhere before its end blocks: a cut on a
                member's edge leaves out the members after it just as well).
        """
        self.close()
        if self._state != _END:
            raise CodecError("not a whole tar archive: it ends early", field="archive")

    def close(self) -> None:
        """Close the member's file being written, if any (on an error, or at the end): it is
        closed even where writing its last bytes fails (a full disk), then that raises."""
        file, self._file = self._file, None
        if file is not None:
            file.close()

    # -- the blocks --------------------------------------------------------------
    def _next_block(self) -> None:
        """The member's bytes are done: its padding, then the next header."""
        if self._state == _DATA:
            self.close()
            self._state, self._left = _PAD, self._padding
            if self._left:
                return
        self._state, self._need = _HEADER, tarfile.BLOCKSIZE

    def _header(self, block: bytes) -> None:
        if not any(block):
            self._state = _END  # tar ends with empty blocks
            return
        try:
            info = tarfile.TarInfo.frombuf(block, tarfile.ENCODING, "surrogateescape")
        except tarfile.HeaderError as err:
            raise CodecError(f"not a whole tar archive: {err}", field="archive") from None
        if info.type == tarfile.XHDTYPE:
            if not 0 <= info.size <= MAX_PAX:  # a negative one would never be read
                raise CodecError(
                    f"an extended header's size, {info.size}, is not 0 to {MAX_PAX} bytes",
                    field="archive",
                )
            self._state, self._need, self._pax_size = _PAX, _blocks(info.size), info.size
            return
        self._member(info)

    def _pax(self, block: bytes) -> None:
        self._extended = _pax_records(block[: self._pax_size])
        self._state, self._need = _HEADER, tarfile.BLOCKSIZE

    def _member(self, info: tarfile.TarInfo) -> None:
        """A member's header: its folder made, or its file opened for the bytes to come."""
        extended, self._extended = self._extended, {}
        info.name = extended.get("path", info.name)
        if "size" in extended:
            info.size = _pax_int(extended["size"])
        self.members += 1
        path = folder = _member_path(self.dest, info)
        while (folder := folder.parent) != self.dest and not os.path.lexists(folder):
            self.folders += 1  # the folders its name makes count too: one per level
        if self.members + self.folders > self.max_members:
            raise CodecError(
                f"the archive holds more than {self.max_members} members (the folders their "
                f"names make counted) at {info.name!r:.200}",
                field="archive",
            )
        if info.size < 0:
            raise CodecError(
                f"archive member {info.name!r:.200} has a negative size", field="archive"
            )
        if info.isdir():
            with _refused(info.name):
                path.mkdir(mode=0o700, parents=True, exist_ok=True)
            return
        self.nbytes += info.size
        if self.nbytes > self.max_bytes:
            raise CodecError(
                f"the archive's files exceed {self.max_bytes} bytes",
                field="archive",
                got=self.nbytes,
            )
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with _refused(info.name):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._file = os.fdopen(os.open(path, flags, 0o600), "wb")
        self._state, self._left = _DATA, info.size
        self._padding = _blocks(info.size) - info.size
        if not self._left:
            self._next_block()


#: what the file system answers a name the archive chose badly (not a full disk)
_NAME_ERRORS = {errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ELOOP}


@contextlib.contextmanager
def _refused(name: str) -> Iterator[None]:
    """The file system refusing member ``name`` (named twice, under a file of the archive,
    too long) as the archive's fault: a :class:`CodecError` naming it."""
    try:
        yield
    except OSError as err:
        if err.errno not in _NAME_ERRORS:
            raise
        raise CodecError(
            f"archive member {name!r:.200} cannot be written: {err.strerror}", field="archive"
        ) from None


def _pax_records(data: bytes) -> dict[str, str]:
    """The ``key=value`` records of an extended header (``"<length> <key>=<value>\\n"``)."""
    out: dict[str, str] = {}
    at = 0
    try:
        while at < len(data):
            space = data.index(b" ", at)
            length = _pax_int(data[at:space].decode("ascii"))
            record = data[space + 1 : at + length]
            if at + length > len(data) or not record.endswith(b"\n") or b"=" not in record:
                raise ValueError("a damaged record")
            key, _, value = record[:-1].partition(b"=")
            out[key.decode("utf-8")] = value.decode("utf-8", "surrogateescape")
            at += length
    except (ValueError, UnicodeDecodeError) as err:
        raise CodecError(
            f"not a whole tar archive: extended header: {err}", field="archive"
        ) from None
    return out


def _pax_int(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 20:
        raise CodecError(f"not a whole tar archive: {text!r:.40} is no size", field="archive")
    return int(text)
