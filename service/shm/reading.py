"""How a same-host connection reads its frames: whole or not at all, in time, counted.

:class:`Reading` is the half of a :class:`~.connection.Connection` that cuts
what the socket brings into frames (:mod:`tdreplay.codec.shm`) and hands each
whole one on: the hello first, then JSON requests (served in a task) and binary
ones (answered at once when they can be). A frame must come whole within
``--body-timeout`` of its first bytes (the deadline is armed once a frame, not
per read) and counts whole in ``--max-receiving-bytes`` while it is held
incomplete, as an HTTP body does; nothing of a frame is used before it is
whole. Before the hello, a frame is at most :data:`MAX_HELLO` bytes.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from tdreplay.codec.shm import (
    HEADER,
    JSON_FRAME,
    Request,
    ShmProtocolError,
    frame,
    frame_length,
    parse_frame,
    read_request,
)
from tdreplay.storage import TDReplayError

from ..core import Core
from .requests import FRAME, bad, error_frame

if TYPE_CHECKING:
    from .deadline import Deadline

#: largest frame before the hello went through (a hello is small; nothing big is parsed
#: for a client that has not shown the token)
MAX_HELLO = 4096


class Reading:
    """The frames of one connection: the one being read, and what it holds of the budget."""

    core: Core
    limit: int
    frame_timeout: float
    authed: bool
    task: asyncio.Task[None] | None
    _loop: asyncio.AbstractEventLoop
    _deadline: Deadline[str]

    def _start_reading(self) -> None:
        self._buf = bytearray()
        self._need = 0  # body bytes of the frame being read (0: reading a header)
        self._held = 0  # bytes of the frame under way counted in --max-receiving-bytes
        self._began = False  # the frame under way has its deadline (armed once, not per read)

    def _feed(self, data: bytes) -> None:
        self._buf += data
        limit = self.limit if self.authed else MAX_HELLO
        try:
            while True:
                if self._need == 0:
                    if len(self._buf) < HEADER.size:
                        break
                    self._need = frame_length(bytes(self._buf[: HEADER.size]), limit)
                    del self._buf[: HEADER.size]
                    if self._need == 0:
                        raise ShmProtocolError("an empty control frame")
                if len(self._buf) < self._need:
                    if not self._held:  # held incomplete: it counts whole, as a body does
                        self.core.receiving.take(self._need)
                        self._held = self._need
                    break
                body = bytes(self._buf[: self._need])
                del self._buf[: self._need]
                self._need, self._began = 0, False
                if self._held:
                    self._received()
                if self.task is not None and not self.task.done():
                    raise ShmProtocolError("a request sent before the answer to the last one")
                received = HEADER.size + len(body)
                if not self.authed:
                    self._hello(parse_frame(body))
                    limit = self.limit
                elif body[0] == JSON_FRAME:
                    self._deadline.disarm()
                    message = parse_frame(body)
                    self.task = self._loop.create_task(self._serve(message, received))
                else:
                    self._hot(read_request(body), received)
        except ShmProtocolError as err:
            self._send_now(frame(bad(str(err))))
            self._end()
            return
        except TDReplayError as err:  # past --max-receiving-bytes
            self._send_now(error_frame(err, self.core.root))
            self._end()
            return
        if self.authed and (self._buf or self._need) and not self._began:
            self._began = True  # a frame under way: it must complete --body-timeout from now
            self._deadline.arm(self.frame_timeout, FRAME)

    def _partial(self) -> tuple[int, int]:
        """Bytes of the frame under way received so far, and of the whole frame (header
        included; ``0`` while its header is incomplete)."""
        if self._need:
            return HEADER.size + len(self._buf), HEADER.size + self._need
        return len(self._buf), 0

    def _received(self) -> None:
        """The frame under way is complete (or abandoned): it leaves the server's budget."""
        self.core.receiving.give(self._held)
        self._held = 0

    # -- what a connection does with a whole frame ------------------------------
    def _hello(self, message: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _serve(self, message: dict[str, Any], received: int) -> None:
        raise NotImplementedError

    def _hot(self, request: Request, received: int) -> None:
        raise NotImplementedError

    def _send_now(self, data: bytes) -> None:
        raise NotImplementedError

    def _end(self) -> None:
        raise NotImplementedError
