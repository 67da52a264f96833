"""A connection's own duplicate of its socket (:class:`Direct`): its answers, and its reads
while it polls.

A descriptor travels only with ``sendmsg``, which the event loop's transport
does not offer, so a :class:`~.connection.Connection` writes its answers
through a duplicate of the socket; the transport only reads. While the
connection polls for the next request, it reads through the duplicate too
(the transport, told the socket is readable, then finds nothing: fine).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import socket

#: bytes one read while polling takes at most (a hot request is a few dozen)
POLL_READ = 65536


class Direct:
    """A non-blocking duplicate of the socket ``fileno`` on ``loop``."""

    def __init__(self, fileno: int, loop: asyncio.AbstractEventLoop) -> None:
        self.sock = socket.socket(fileno=os.dup(fileno))
        self.sock.setblocking(False)
        self._loop = loop

    def recv_now(self) -> bytes:
        """What the socket holds now (``b""``: the end); ``BlockingIOError`` when nothing."""
        return self.sock.recv(POLL_READ)

    def send_small(self, data: bytes) -> None:
        """A small frame, sent if the socket takes it now (else dropped: the end is near)."""
        with contextlib.suppress(OSError):
            self.sock.send(data)

    def sendmsg(self, data: bytes, fd: int) -> int:
        """Send what the socket takes of ``data`` now, ``fd`` with its first byte (``-1``:
        none); raises ``BlockingIOError`` when it takes nothing."""
        if fd < 0:
            return self.sock.send(data)
        rights = array.array("i", [fd])
        return self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])

    async def send(self, data: bytes, fd: int = -1) -> None:
        """Send all of ``data`` (``fd`` with its first byte), waiting while the socket is full."""
        while True:
            try:
                sent = self.sendmsg(data, fd)
                break
            except BlockingIOError:
                await self._writable()
        rest = memoryview(data)  # the unsent part, without copying it for each send
        while sent < len(rest):
            try:
                sent += self.sock.send(rest[sent:])
            except BlockingIOError:
                await self._writable()

    async def _writable(self) -> None:
        ready = self._loop.create_future()
        fileno = self.sock.fileno()

        def wake() -> None:
            if not ready.done():
                ready.set_result(None)

        self._loop.add_writer(fileno, wake)
        try:
            await ready
        finally:
            self._loop.remove_writer(fileno)

    def close(self) -> None:
        self.sock.close()
