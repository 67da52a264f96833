"""One process per data root: an exclusive lock on ``<root>/.lock``.

Two processes on one data root would delete each other's live storage: each
treats the table folders it does not hold as dead data (see
:mod:`tdreplay.storage.backends.locations`). ``tdreplay serve`` and the storage demo
therefore lock the root for their lifetime; a second process on the same root
fails at once with :class:`~tdreplay.storage.errors.RootLocked`, naming the
holder's PID.

The lock is ``flock(LOCK_EX | LOCK_NB)`` on ``<root>/.lock``, which holds the
holder's PID (for the error message only: the lock itself is the kernel's).
The kernel releases it when the holder closes it or dies, however it dies, so
a lock file left by a killed process is simply locked again; the file is never
deleted (deleting it would let two processes lock two different files). A
child forked by the holder shares the lock until it exits or execs. ``flock``
is advisory and local: it does not guard a root on a network file system
shared by two hosts.

Code that calls :meth:`Table.create(spec, root) <tdreplay.storage.Table.create>`
in its own process is not forced to lock; it should when another tdreplay
process might use the same root:

    >>> import tempfile
    >>> from tdreplay.storage.rootlock import lock_root
    >>> from tdreplay.storage.errors import RootLocked
    >>> root = tempfile.mkdtemp()
    >>> with lock_root(root) as lock:
    ...     try:
    ...         lock_root(root)  # a second holder, even in this process, is refused
    ...     except RootLocked as err:
    ...         print(err.pid == lock.pid)
    True
    >>> lock_root(root).close()  # released: the root can be locked again
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from pathlib import Path
from types import TracebackType

from .errors import RootLocked

#: the lock file, inside the data root
LOCK_NAME = ".lock"
#: how long a refused process waits for the holder to have written its PID
_PID_WAIT = 0.2


class RootLock:
    """An exclusive lock on a data root, held until :meth:`close` (or the process's end).

    Made by :func:`lock_root`; a context manager.

    Attributes:
        root: the data root (absolute).
        path: the lock file, ``<root>/.lock``.
        pid: this process's id, as written into the lock file.
    """

    def __init__(self, root: Path, fd: int) -> None:
        self.root = root
        self.path = root / LOCK_NAME
        self.pid = os.getpid()
        self._fd: int | None = fd

    @property
    def held(self) -> bool:
        """Whether this lock is still held (not closed)."""
        return self._fd is not None

    def close(self) -> None:
        """Release the lock (the file stays, empty). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)  # no stale PID for the next reader
        os.close(fd)  # closing the last descriptor releases the flock

    def __enter__(self) -> RootLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "held" if self.held else "released"
        return f"RootLock({str(self.root)!r}, pid={self.pid}, {state})"


def lock_root(root: str | Path) -> RootLock:
    """Lock the data root ``root`` (created if missing) for this process.

    Args:
        root: the data root.

    Returns:
        The held :class:`RootLock`; release it with :meth:`RootLock.close`
        (or a ``with`` block). The process's end releases it too.

    Raises:
        RootLocked: another process (or another lock of this process) holds
            ``root``; the message names the root and the holder's PID.
        PermissionError: this process may not write the root; the message says
            whose it is and this process's user (a volume made by another user,
            such as a host folder Docker created as root for a container that runs
            as another).
        OSError: the root or its lock file cannot be created.
    """
    root = Path(root).absolute()
    path = root / LOCK_NAME
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except PermissionError as err:
        raise _not_writable(root, err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = _holder(fd)
        os.close(fd)
        who = f"process {pid}" if pid is not None else "another process"
        raise RootLocked(
            f"data root {str(root)!r} is in use by {who} (lock {path}); stop it or use "
            "another data root: two processes on one root delete each other's tables",
            root=str(root),
            pid=pid,
        ) from None
    except BaseException:
        os.close(fd)
        raise
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return RootLock(root, fd)


def _not_writable(root: Path, err: PermissionError) -> PermissionError:
    """``err`` again, saying whose the root (or its nearest existing parent) is and what to do."""
    uid, gid = os.geteuid(), os.getegid()
    folder = next((p for p in (root, *root.parents) if os.path.lexists(p)), root)
    try:
        info = os.stat(folder)
        whose = (
            f"{folder} is uid {info.st_uid}'s (gid {info.st_gid}, "
            f"mode {stat.S_IMODE(info.st_mode):o})"
        )
    except OSError as why:
        whose = f"{folder} cannot be looked at ({why.strerror or why})"
    return PermissionError(
        err.errno,
        f"the data root {str(root)!r} is not writable by this process (uid {uid}, gid {gid}): "
        f"{whose}; give it to this user (chown {uid}:{gid}, or a volume made for it) or run "
        "as its owner",
        err.filename,
    )


def _holder(fd: int) -> int | None:
    """The PID the holder wrote into the lock file (it writes it just after locking)."""
    deadline = time.monotonic() + _PID_WAIT
    while True:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        if text.isdigit():
            return int(text)
        if time.monotonic() > deadline:
            return None
        time.sleep(0.01)
