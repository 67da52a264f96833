"""Disk space: tell a full disk from other failures, and say so (507).

A memory-mapped write past the free space of its file system ends the process
with SIGBUS, not an exception, so file backends reserve the blocks under their
rows before writing there (:mod:`~tdreplay.storage.extents`). Those
reservations, checkpoints and exports that run out of room are reported as
:class:`InsufficientStorage` (507), quoting the bytes free
(:func:`is_full`, :func:`insufficient`).

    >>> import errno
    >>> is_full(OSError(errno.ENOSPC, "No space left on device"))
    True
    >>> is_full(RuntimeError("unexpected end of file"))
    False
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import InsufficientStorage, TDReplayError

_FULL = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("no space left on device", "disk quota exceeded", "errno = 28")
#: posix_fallocate failures that mean "not supported here", not "no room"
FALLOCATE_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


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
    try:
        free = f"{free_bytes(path)} bytes free"
    except OSError as why:  # the answer is still a 507: the figure is what is missing
        free = f"bytes free unknown: {why.strerror or why}"
    return InsufficientStorage(
        f"{what}: no space left at {path} ({free}){cause}; free disk space "
        "(old checkpoints, exports) or use a larger volume",
        table=table,
        field="path",
        got=str(path),
    )


@contextlib.contextmanager
def on_full_disk(
    what: str,
    path: str | Path,
    *,
    table: str | None = None,
    error: Callable[[Exception], InsufficientStorage] | None = None,
    cleanup: Callable[[], object] | None = None,
) -> Iterator[None]:
    """Doing ``what`` at ``path``: a full disk raised inside is :func:`insufficient` (507),
    any other error as it was. The one place that decides a failure is a full disk.

    Args:
        what: what is being done, for the message (``"export of table 't'"``).
        path: where; the bytes free are measured there.
        table: the table, for the error's ``table``.
        error: the 507 to raise instead of :func:`insufficient`'s, made from the system's
            error (a room other than a disk says so in its own words).
        cleanup: called first when anything is raised inside (the half-written file goes;
            an OSError of its own is dropped, the error raised inside goes on).

    A :class:`~tdreplay.storage.errors.TDReplayError` raised inside goes out as it is (it
    is an answer already).

    >>> import errno
    >>> try:
    ...     with on_full_disk("export of table 't'", "/", table="t"):
    ...         raise OSError(errno.ENOSPC, "No space left on device")
    ... except InsufficientStorage as err:
    ...     print(str(err)[:41])
    export of table 't': no space left at / (

    Raises:
        InsufficientStorage: the disk (or the quota) filled up.
    """
    try:
        yield
    except BaseException as err:
        if cleanup is not None:
            with contextlib.suppress(OSError):  # a cleanup that fails hides nothing
                cleanup()
        if isinstance(err, Exception) and not isinstance(err, TDReplayError) and is_full(err):
            full = error(err) if error is not None else insufficient(what, path, err, table=table)
            raise full from err
        raise
