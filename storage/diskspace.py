"""Disk space: reserve a table's files up front, and tell a full disk from other failures.

A memory-mapped write past the free space of its file system ends the process
with SIGBUS, not an exception; ``TensorDict.from_schema(..., storage="memmap")``
creates sparse files, and HDF5 extends its file as it goes. So a file
backend's files are given their blocks at allocation (``posix_fallocate``):
a full disk then fails ``create`` with :class:`InsufficientStorage` (507),
quoting the bytes needed and free, instead of killing the server later.
Checkpoints and exports that run out of room are reported the same way
(:func:`is_full`, :func:`insufficient`).

    >>> import errno
    >>> is_full(OSError(errno.ENOSPC, "No space left on device"))
    True
    >>> is_full(RuntimeError("unexpected end of file"))
    False
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path
from typing import Protocol

from .errors import InsufficientStorage

log = logging.getLogger("tdreplay.storage")

_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("no space left on device", "disk quota exceeded", "errno = 28")
#: posix_fallocate failures that mean "not supported here", not "no room"
FALLOCATE_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


class _Backend(Protocol):
    @property
    def location(self) -> str | None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


def is_full(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) says the disk or the quota is full."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _FULL:
            return True
        if any(text in str(cur).lower() for text in _FULL_TEXT):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def fsync_path(path: str | Path) -> None:
    """fsync a file or a folder (its dirty pages, mapped ones included, go to disk)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def free_bytes(path: str | Path) -> int:
    """Free bytes (for an unprivileged user) on the file system of ``path`` or its nearest existing parent."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def insufficient(
    what: str, path: str | Path, err: BaseException | None = None, *, table: str | None = None
) -> InsufficientStorage:
    """The :class:`InsufficientStorage` for ``what`` (e.g. ``"checkpoint of table 't'"``) failing at ``path``."""
    cause = f": {err}" if err is not None else ""
    return InsufficientStorage(
        f"{what}: no space left at {path} ({free_bytes(path)} bytes free){cause}; free disk space "
        "(old checkpoints, exports) or use a larger volume",
        table=table,
        field="path",
        got=str(path),
    )


def _files(location: Path) -> list[Path]:
    if location.is_file():
        return [location]
    return sorted(p for p in location.rglob("*") if p.is_file() and not p.is_symlink())


def _missing(path: Path) -> int:
    """Bytes of ``path`` not backed by disk blocks yet (a sparse file's holes)."""
    st = path.stat()
    return max(0, st.st_size - st.st_blocks * 512)


def reserve(backend: _Backend, *, table: str) -> None:
    """Give every file of a file backend (memmap folder, h5 file) all its disk blocks now.

    Called once the files exist (after ``from_schema``); a backend with no
    path (memory, shared, redis) is left alone. A file system without
    ``fallocate`` support is logged and skipped (writes then behave as they
    always did there).

    Raises:
        InsufficientStorage: the files need more bytes than are free (checked
            first, quoting both figures), or the reservation ran out of room.
            The backend is closed; the caller deletes its files.
    """
    location = backend.location
    if location is None or not os.path.exists(location):
        return
    root = Path(location)
    try:
        # HDF5 writes what fits and reports nothing: its file reaches full size (sparse) on flush
        backend.flush()
    except OSError as err:
        backend.close()
        if is_full(err):
            raise insufficient(
                f"table {table!r}: allocating its storage", root, err, table=table
            ) from err
        raise
    files = _files(root)
    needed = sum(_missing(p) for p in files)
    if not needed:
        return
    free = free_bytes(root)
    if needed > free:
        backend.close()
        raise InsufficientStorage(
            f"table {table!r}: its storage needs {needed} more bytes at {root} but only {free} "
            "are free; free disk space, or create a smaller table (capacity) or put the data "
            "root on a larger volume",
            table=table,
            field="capacity",
            expected=f"<= {free} bytes",
            got=f"{needed} bytes",
        )
    for path in files:
        fd = os.open(path, os.O_RDWR)
        try:
            os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except OSError as err:
            if err.errno in FALLOCATE_UNSUPPORTED:
                log.warning("cannot preallocate %s (%s); a full disk may end in SIGBUS", path, err)
                return
            backend.close()
            if is_full(err):
                raise InsufficientStorage(
                    f"table {table!r}: its storage needs {needed} more bytes at {root} and the "
                    f"disk ran out while reserving them ({err}); free disk space, or create a "
                    "smaller table",
                    table=table,
                    field="capacity",
                    got=f"{needed} bytes",
                ) from err
            raise
        finally:
            os.close(fd)
