"""The HTTP server: uvicorn, with limits that hold before a request reaches the app.

``tdreplay serve`` runs the app under uvicorn with :class:`LimitedHttpProtocol`,
uvicorn's httptools protocol plus these limits (each a field of
:class:`~tdreplay.service.settings.Settings`, so a flag and a ``TDREPLAY_*``
variable):

==========================  ======  =====================================================
limit (flag)                status  when
==========================  ======  =====================================================
``--max-body-bytes``        413     a Content-Length over it (answered before any of the
                                    body is read), or a chunked body once it passes it
``--max-header-bytes``      431     request line and headers over it (a chunked body's trailer
                                    fields too), counted as they arrive
``--header-timeout``        408     a request's headers not complete this many seconds after
                                    its first byte (or after the connection opened)
``--body-timeout``          408     a request's body not complete this many seconds after its
                                    headers (time the server itself is not reading, while
                                    the app is busy, does not count)
``--max-receiving-bytes``   503     request bodies held at once past it, all connections:
                                    being received (a Content-Length counts whole from the
                                    headers on, a chunked one as it comes) or kept by a call
                                    the rate limiter holds back; 413: one body is larger
``--max-connections``       503     a connection beyond this many open ones
``--max-pipelined``         400     a request sent ahead of this many others not yet answered
                                    on its connection (answered once they are)
``--keep-alive-timeout``    --      a kept-alive connection idle this many seconds between
                                    an answer and the next request: closed
``--send-timeout``          --      an answer its client takes none of for this many
                                    seconds (it stopped reading): the connection is closed
                                    and the answer's buffers freed; a client that keeps
                                    taking bytes, however slowly, is not cut
==========================  ======  =====================================================

So is a request the parser refuses (400, ``field`` ``request``, the detail saying
why: a malformed chunk size, two Content-Lengths, a NUL in a header), one with two
``Host`` headers (400: the Host check and the app would read different ones), an
HTTP/1.1 one with none (400, RFC 9112 3.2), one with ``Connection: Upgrade`` and a
body (400: the server upgrades to nothing, and the parser skips the body of such a
request, which would then be read as the next one), and one whose ``Expect`` is not
``100-continue`` (417). An ``Upgrade`` without a body is served as any request.

A refused request gets the protocol's JSON error body (``{"type", "detail",
"field"}``; the detail names the limit and its flag) and ``Connection:
close``. The connection then stops parsing: what the client still sends is
read and dropped for at most :data:`LINGER` seconds, so that the client reads
the answer instead of a reset, and the connection is closed. A request the app
was already serving sees a disconnect, so whatever it buffered is freed; one it
had not begun never runs. Requests pipelined before a refused one are answered
first, in order. A client that ends its side (``shutdown(SHUT_WR)``) gets the
answers to the requests it sent whole, then the connection is closed; a wait on
the rate limiter takes that end as its caller leaving, as it takes a close (both
send the same FIN: :func:`~.streaming.client_gone`).

The cost on the hot path is a counter per body chunk, a flag test per read, and
a sum per request with a body. The send timeout is the base class's,
:class:`~.sending.SendTimeoutProtocol` (what goes out, where these limits hold
what comes in).

The protocol needs httptools, which ``uvicorn[standard]`` (a dependency of
tdreplay) installs; uvicorn's h11 protocol is not used, because it offers none
of these hooks.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import httptools

from tdreplay.storage import BackendError, TDReplayError

from . import framing
from .bodies import BodyChunks, body_too_large
from .errors import status_of
from .limits import Receiving, timed_out
from .sending import SendTimeoutProtocol
from .streaming import CLIENT_ENDED

log = logging.getLogger("tdreplay.service")

#: seconds a refused connection keeps draining what its client sends before it is closed
LINGER = 1.0


class _Refused(Exception):
    """Raised from a parser callback to stop parsing once a request is refused."""


class LimitedHttpProtocol(SendTimeoutProtocol):
    """uvicorn's httptools protocol with :class:`~.limits.Limits` (see the module docstring).

    A subclass made by :func:`~.runner.protocol_class` sets :attr:`limits` and :attr:`receiving`.
    """

    receiving: ClassVar[Receiving]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._refused = False
        self._header_pending = False  # a request has begun, its headers are not complete
        self._in_body = False  # a request's headers are complete, its body is not
        self._header_bytes = 0  # bytes received outside bodies since the last request ended
        self._body_bytes = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._receiving = 0  # bytes of the body being received counted in ``receiving``
        self._whole = False  # the body's Content-Length was counted whole at its headers
        self._chunk_empty = False  # a chunk header came last, none of its body yet
        #: a refusal waiting for the answers to the requests before it (pipelined)
        self._deferred: tuple[TDReplayError, int | None] | None = None
        self._refused_cycle: Any = None  # the request refused in its body, if any
        self._running: Any = None  # the request whose app was started last

    # -- connection ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        cap = self.limits.max_connections
        if len(self.connections) >= cap:
            self.transport = transport  # type: ignore[assignment]
            err = BackendError(
                f"the server holds {cap} connections, its limit (--max-connections); retry later",
                field="connection",
                expected=f"<= {cap} connections",
            )
            self._refuse(err)
            return
        super().connection_made(transport)  # type: ignore[arg-type]
        self._arm_header_timer()  # a connection that never sends a byte

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._received()
        super().connection_lost(exc)

    def eof_received(self) -> bool:  # type: ignore[override]  # asyncio: keep the transport open
        # The client ended its sending side (a FIN: shutdown(SHUT_WR), or a close) and may still
        # read: the requests it sent whole are answered (a refusal after them too), then the
        # connection is closed, as nginx does; uvicorn closed it at once, their answers lost.
        # A wait on the rate limiter takes the FIN as its caller leaving (client_gone). A
        # request cut short by the FIN never completes: it is dropped, as before.
        cycle = self.cycle
        if self._deferred is None and (
            self._refused or self._in_body or cycle is None or cycle.response_complete
        ):
            return False  # nothing left to answer (or the refusal is out): close
        for ended in (self._running, *(queued for queued, _ in self.pipeline)):
            ended.scope[CLIENT_ENDED] = True
        self._running.message_event.set()  # wakes a wait watching its client
        if self._deferred is None:
            cycle.keep_alive = False  # the last request sent whole: its answer closes
        return True

    def data_received(self, data: bytes) -> None:
        # uvicorn's, plus the header count and the timers. A request that arrives
        # whole in one read (the usual case) arms no timer.
        if self._refused:
            return  # drained
        self._unset_keepalive_if_required()
        if not self._in_body:
            self._header_bytes += len(data)
        # after a chunk header and no body: the last chunk's, whose trailer fields the parser
        # keeps as headers - unless body comes now
        trailing = self._in_body and self._chunk_empty
        body_before = self._body_bytes
        while True:
            try:
                self.parser.feed_data(data)
            except httptools.HttpParserUpgrade as upgrade:
                # This server upgrades to nothing (ws="none"): the request was served as
                # HTTP/1.1 (one with a body was refused at its headers), and what follows
                # it is the next request, which the parser stopped short of.
                data = data[upgrade.args[0] :]
                if data and not self._refused:
                    self._header_bytes += len(data)
                    continue
                return
            except httptools.HttpParserError as exc:
                if not self._refused:  # else a callback refused the request and stopped it
                    self._refuse(framing.malformed(str(exc)), status=400, in_body=self._in_body)
                return
            break
        if self._in_body:
            if trailing and self._body_bytes == body_before:
                self._header_bytes += len(data)
                if self._header_bytes > self.limits.max_header_bytes:
                    cap = self.limits.max_header_bytes
                    self._refuse(
                        framing.headers_too_large(self._header_bytes, cap), 431, in_body=True
                    )
                    return
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(
                    self.limits.body_timeout, self._body_timed_out
                )
        elif self._header_pending or self._header_bytes:
            if self._header_bytes > self.limits.max_header_bytes:
                self._refuse(
                    framing.headers_too_large(self._header_bytes, self.limits.max_header_bytes),
                    status=431,
                )
            elif self._header_timer is None:
                self._arm_header_timer()

    # -- parser callbacks ---------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_pending = True
        self._body_bytes = 0
        self._chunk_empty = False

    def on_chunk_header(self) -> None:
        self._chunk_empty = True  # until its body comes (the last chunk has none)

    def on_headers_complete(self) -> None:
        self._header_pending = False
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        limits = self.limits
        try:
            length = framing.check_head(
                self.url,
                self.headers,
                self.parser.should_upgrade(),
                len(self.pipeline),
                limits,
                self.parser.get_http_version,
            )
        except framing.Refusal as refused:
            self._refuse(refused.error, refused.status)
            raise _Refused from None
        if length:
            n = int(length)  # the parser checked its digits
            if n > limits.max_body_bytes:
                self._refuse(body_too_large(n, limits.max_body_bytes, "its Content-Length says"))
                raise _Refused
            if n and not self._receive(n):
                raise _Refused
        self._whole = bool(length)
        self._in_body = True
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        self._chunk_empty = False
        if self._body_bytes > self.limits.max_body_bytes:
            self._refuse(
                body_too_large(self._body_bytes, self.limits.max_body_bytes, "so far"), in_body=True
            )
            raise _Refused
        if not self._whole and not self._receive(len(body)):  # chunked: counted as it comes
            raise _Refused
        cycle = self.cycle
        if cycle is not None and not isinstance(cycle.body, BodyChunks):
            cycle.body = BodyChunks(bytes(cycle.body))  # type: ignore[assignment]
        super().on_body(body)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._deferred is not None and self.cycle is not None and self.cycle.response_complete:
            error, status = self._deferred  # the answers due before the refusal are out
            self._deferred = None
            self._unset_keepalive_if_required()
            self._answer_refusal(error, status, in_body=False)

    def on_message_complete(self) -> None:
        self._in_body = False
        if self._receiving:
            self._received()
        self._header_bytes = 0
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        self._running = cycle

        async def unless_refused(scope: Any, receive: Any, send: Any) -> None:
            # a request refused before its task began runs nothing (its body, in the same
            # read as its headers, was malformed or too large): its client reads the refusal
            if cycle is not self._refused_cycle:
                await app(scope, receive, send)

        super()._start_asgi_task(cycle, unless_refused)

    # -- timers -------------------------------------------------------------
    def _arm_header_timer(self) -> None:
        self._header_timer = self.loop.call_later(
            self.limits.header_timeout, self._headers_timed_out
        )

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def _headers_timed_out(self) -> None:
        self._header_timer = None
        if self.cycle is not None and not self.cycle.response_complete:
            self._arm_header_timer()  # a pipelined request waits on the answer to the one before
            return
        t = self.limits.header_timeout
        self._refuse(
            timed_out(
                f"request headers not complete within {t:g} s (--header-timeout)",
                field="headers",
                expected=f"complete headers within {t:g} s",
            )
        )

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.flow.read_paused:  # the app has not asked for more yet: the wait is ours
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timed_out)
            return
        t = self.limits.body_timeout
        self._refuse(
            timed_out(
                f"request body not complete within {t:g} s of its headers "
                f"({self._body_bytes} bytes received; --body-timeout)",
                field="body",
                expected=f"the whole body within {t:g} s",
                got=f"{self._body_bytes} bytes",
            ),
            in_body=True,
        )

    # -- bodies being received -----------------------------------------------
    def _receive(self, n: int) -> bool:
        """Count ``n`` more body bytes in the server's budget; else refuse (and ``False``)."""
        try:
            self.receiving.take(n, self._receiving)
        except TDReplayError as err:
            self._refuse(err, in_body=self._in_body)
            return False
        self._receiving += n
        return True

    def _received(self) -> None:
        """The body is complete (or abandoned): its bytes leave the server's budget."""
        self.receiving.give(self._receiving)
        self._receiving = 0

    # -- refusing -----------------------------------------------------------
    def _refuse(
        self, error: TDReplayError, status: int | None = None, *, in_body: bool = False
    ) -> None:
        """Answer ``error``, then drain and close the connection.

        ``in_body``: refused while reading the body of ``self.cycle``'s request,
        which the app may have answered already (then nothing more is written); if
        its task has not begun, it never runs. Otherwise the refused request comes
        after ``self.cycle``'s (pipelined): the answers due before it go out first.
        """
        if self._refused:
            return
        self._refused = True
        self._cancel_timers()
        self._received()
        self._unset_keepalive_if_required()
        cycle = self.cycle
        if not in_body and cycle is not None and not cycle.response_complete:
            # a later request refused while an earlier one's answer is due (pipelined): that
            # answer, and those of the requests queued behind it, go out first
            self._deferred = (error, status)
            return
        self._answer_refusal(error, status, in_body)

    def _answer_refusal(self, error: TDReplayError, status: int | None, in_body: bool) -> None:
        write = True
        cycle = self.cycle
        if cycle is not None:
            if cycle.response_started and (in_body or not cycle.response_complete):
                write = False  # answered already, or an answer under way would be cut into
            if not cycle.response_complete:
                # the app sees a disconnect: it stops reading and frees what it buffered
                self._refused_cycle = cycle
                cycle.disconnected = True
                cycle.message_event.set()
        transport = self.transport
        if transport.is_closing():
            return
        log.debug("refused a request from %s: %s", self.client, error)
        if write:
            status = status or status_of(error)
            transport.write(framing.refusal(status, error, self.server_state.default_headers))
        if transport.can_write_eof():
            transport.write_eof()
        if self.flow is not None:
            self.flow.resume_reading()  # drain instead of leaving the client blocked
        self.loop.call_later(LINGER, transport.close)
