"""What goes out: a connection whose client takes none of its answer is closed (``--send-timeout``).

A client that stops reading leaves its answer in the transport's buffer, and
with it what the answer holds (a leased sample body); a close waits for those
bytes to go out, for ever. :class:`SendTimeoutProtocol` is uvicorn's httptools
protocol that aborts such a connection once its client took none of what the
transport holds for ``--send-timeout`` seconds: the app sees a disconnect and
the buffers are freed. A slow reader that keeps taking bytes, however slowly,
is not cut.

It costs nothing while answers go out: it is armed only when the transport
holds more than its high-water mark (or anything at all once the connection
idles or is closing). :class:`~.server.LimitedHttpProtocol` builds on it with
the limits on what comes in.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .limits import Limits

log = logging.getLogger("tdreplay.service")


class SendTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with ``limits.send_timeout`` (see the module docstring).

    A subclass sets :attr:`limits`.
    """

    limits: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._send_timer: asyncio.TimerHandle | None = None
        self._unsent = 0  # bytes the transport held unsent when the send timer last looked

    def connection_lost(self, exc: Exception | None) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        self._watch_sending()

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unsent = sys.maxsize  # the client took bytes: progress, whatever is written next

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.transport.is_closing() and self.transport.get_write_buffer_size():
            self._watch_sending()  # closing waits for the answer to go out: for how long?

    def timeout_keep_alive_handler(self) -> None:
        if self.transport.get_write_buffer_size():
            self._watch_sending()  # an answer still unsent: the close would wait on it
        super().timeout_keep_alive_handler()

    def _watch_sending(self) -> None:
        """Close the connection once its client takes none of what the transport holds for
        ``--send-timeout`` seconds (armed while something waits to be sent)."""
        if self._send_timer is None:
            self._unsent = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self.limits.send_timeout, self._send_check)

    def _send_check(self) -> None:
        self._send_timer = None
        unsent = self.transport.get_write_buffer_size()
        if unsent == 0 and not self.flow.write_paused:
            return  # all taken
        if unsent < self._unsent:  # the client took some: it may take the rest
            self._watch_sending()
            return
        log.info(
            "closed the connection of %s: its client took none of %d bytes in %g s "
            "(--send-timeout)",
            self.client,
            unsent,
            self.limits.send_timeout,
        )
        # abort, not close: a close waits for the unsent bytes. The app sees a disconnect
        # (connection_lost), and the buffers the transport held (leased sample bodies) are freed.
        self.transport.abort()
