"""The same-host door's listener: the Unix socket beside the HTTP port.

:class:`ShmServer` binds the socket (in a folder only the server's user may
enter), serves each connection with a :class:`~.connection.Connection` on
the event loop, bounds them (``--shm-max-connections``, ``--shm-total-bytes``
across all of them), and removes the socket when it stops - only the one it
made.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import socket
import stat
from pathlib import Path

from tdreplay.storage import InvalidRequest
from tdreplay.system import host_id

from ..core import Core
from ..metrics import RequestHook
from ..settings import Settings
from .buffers import Budget
from .connection import Connection

log = logging.getLogger("tdreplay.service")


class ShmServer:
    """Serves the core over a Unix socket at ``path``.

    Args:
        core: the server's core.
        settings: limits (``shm_connection_bytes``, ``shm_max_connections``,
            ``max_body_bytes`` for control frames) and the token.
        path: the socket's path.
        on_request: told of every request (metrics, with ``transport="shm"``).
    """

    def __init__(
        self, core: Core, settings: Settings, path: Path, on_request: RequestHook | None = None
    ) -> None:
        self.core = core
        self.on_request = on_request
        self.settings = settings
        self.path = path
        self.host = host_id()
        #: this server process's identity: a client checks that the socket it reached is the
        #: one the server it asked over HTTP named (two servers may publish one path)
        self.instance = secrets.token_hex(16)
        # a slot let go of lingers (still counted) for as long as an idle connection may stay
        self.budget = Budget(settings.shm_total_bytes, linger=settings.shm_idle_timeout)
        self.connections: set[Connection] = set()
        self.served_by: Connection | None = None
        self.served_at = -math.inf
        #: polls of a connection for its next request: the ones that found one, the ones
        #: that did not, and the seconds they took (``tdreplay_shm_polls_total``)
        self.polls_found = 0
        self.polls_missed = 0
        self.poll_seconds = 0.0
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._made: tuple[int, int] | None = None  # (st_dev, st_ino) of the socket it bound

    async def start(self) -> None:
        """Bind and listen.

        The socket's folder is created with mode 0700 when missing; one that
        exists must be a real folder of the server's user that no one else may
        enter (the server changes no folder it did not create: ``/tmp`` stays
        ``/tmp``). A socket already at the path is replaced only if it is
        stale (nothing answers on it: a crashed server's); anything else there
        is left alone and the transport does not start.

        Raises:
            InvalidRequest: the folder or the path cannot be used.
        """
        folder = self.path.parent
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
            os.chmod(folder, 0o700)  # what the umask took off mkdir's mode
        except FileExistsError:
            pass
        info = os.lstat(folder)
        if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
            raise _unusable(self.path, f"{folder} is not a folder of this user")
        if info.st_mode & 0o077:
            raise _unusable(
                self.path,
                f"other users may enter {folder} (mode {stat.S_IMODE(info.st_mode):o}) and the "
                "server changes no folder it did not create: name a socket in a folder of its "
                "own (a missing one is created with mode 0700), or chmod 700 that folder",
            )
        if os.path.lexists(self.path):
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                raise _unusable(self.path, "it exists and is not a socket; it is left as it is")
            if _answers(self.path):
                raise _unusable(self.path, "another process listens on it; it is left as it is")
            os.unlink(self.path)  # a stale socket: nobody listens on it
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(str(self.path))
            os.chmod(self.path, 0o600)
        except OSError as err:
            sock.close()
            raise _unusable(self.path, err.strerror or str(err)) from None
        made = os.lstat(self.path)
        self._made = (made.st_dev, made.st_ino)
        sock.listen(128)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_unix_server(lambda: Connection(self), sock=sock)
        self._sweeper = loop.create_task(self._sweep())
        log.info("same-host transport on %s", self.path)

    async def _sweep(self) -> None:
        """Reclaim lingering slots once their time is up, even when no new slot asks."""
        every = max(0.05, min(30.0, self.budget.linger / 4))
        while True:
            await asyncio.sleep(every)
            self.budget.sweep()

    async def stop(self) -> None:
        """Stop listening, end every connection (their calls cancelled), remove the socket
        (if it is still the one this server made)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            await conn.close()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(OSError):
                now = os.lstat(self.path)
                if (now.st_dev, now.st_ino) == self._made:
                    os.unlink(self.path)


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        return True


def _unusable(path: Path, why: str) -> InvalidRequest:
    return InvalidRequest(f"cannot listen on {path}: {why} (--shm-socket)", field="shm_socket")
