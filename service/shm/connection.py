"""One connection of the same-host door: control frames onto the core, rows in slots.

A :class:`Connection` serves one client on the event loop: it reads frames
(:mod:`tdreplay.codec.shm`), calls the same :class:`~tdreplay.service.core.Core`
operations as the HTTP routes, with the same parameter models (its
:mod:`.operations`), and answers. It
never touches a table: the core gives the :class:`~tdreplay.service.core.Shape`
a slot is laid out by, and the table is looked up once per request. The hot
operations come as binary frames and are answered at once, from
``data_received``, when they can be (a small sample the rate limiter lets
through, a release): no task, no JSON. A request that must wait (the rate
limiter, a gather or insert in a thread) and the JSON control requests run
as a task.
Samples are gathered straight into the connection's slots; extends are
inserted from the client's slot as flat columns (the one-element columns the
table checks values of are copied first, so a client writing into its slot
meanwhile cannot change a value after it was checked).

A client calling in a tight loop is polled: after an answer, the connection
reads its socket for the next request for up to ``--shm-poll-us`` when the
client asked again that soon the last time, so the server's CPU is not left
idle to be woken for each call (see :class:`tdreplay.system.Poller`, which also
pauses polling when it does not pay). It holds the event loop at most
``--shm-poll-hold-us`` (1 ms) at a time, and does not poll while another connection was
served within the window.

A connection is one client thread's: it sends a request and waits for the
answer. A client that dies, hangs up, sends garbage or stops taking its answers
(``--send-timeout``) ends only its connection: a call it left waiting is
cancelled (and a gather under way finishes first), its slots are unmapped,
nothing it sent half-way is used. A frame must come whole within ``--body-timeout``
and counts in ``--max-receiving-bytes`` meanwhile, as an HTTP body (:mod:`.reading`). The
first frame must be a hello, within ``--shm-hello-timeout`` of connecting, carrying the
server's token when one is configured (constant-time compare); the socket file is also
only reachable by the server's user (its folder is mode 0700) unless the operator says
otherwise. A connection a time limit ends is told which (HTTP's 408 naming the flag),
but for ``--send-timeout``, whose client reads nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import math
import time
from typing import TYPE_CHECKING, Any, Protocol

from tdreplay.codec.shm import VERSION, Request, frame
from tdreplay.storage import TDReplayError
from tdreplay.system import Poller

from ..core import Core
from ..errors import Unauthorized
from ..metrics import RequestHook
from ..settings import Settings
from .buffers import Budget, SlotBuffers
from .deadline import Deadline
from .direct import Direct
from .operations import Operations
from .reading import Reading
from .requests import HELLO, HOT_OPS, IDLE, SEND, Done, bad, error_frame, late, op_of, too_many

if TYPE_CHECKING:
    from collections.abc import Awaitable


log = logging.getLogger("tdreplay.service")


class Host(Protocol):
    """What a connection uses of the listener that accepted it
    (:class:`~tdreplay.service.shm.listener.ShmServer`)."""

    core: Core
    settings: Settings
    budget: Budget
    host: str
    instance: str
    connections: set[Connection]
    on_request: RequestHook | None
    #: the connection served last, and when (``time.perf_counter``): polling stops while
    #: others are served
    served_by: Connection | None
    served_at: float
    polls_found: int
    polls_missed: int
    poll_seconds: float


class Connection(Reading, Operations, asyncio.Protocol):
    """One client connection: its slots, its frames, its one request at a time.

    Reads arrive through the protocol (``data_received``): no future per
    request, and a hang-up is seen at once (``connection_lost``), which
    cancels a call the client left waiting. Replies go out through a
    duplicate of the socket (:class:`~.direct.Direct`), because a descriptor
    travels only with ``sendmsg``; the transport itself never writes.
    """

    def __init__(self, server: Host) -> None:
        self.server = server
        self.core = server.core
        settings = server.settings
        self.slots = SlotBuffers(
            settings.shm_connection_bytes, settings.shm_max_slots, server.budget
        )
        self.limit = settings.max_body_bytes
        self.frame_timeout = settings.body_timeout
        self.send_timeout = settings.send_timeout
        self.idle_timeout = settings.shm_idle_timeout
        self._poller = Poller(settings.shm_poll_us * 1e-6)
        self._hold = settings.shm_poll_hold_us * 1e-6  # the most one polling holds the loop
        self._answered_at = -math.inf  # time.perf_counter() of the last answer sent
        self.authed = False
        self.task: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._start_reading()
        self._out: Direct | None = None
        self._transport: asyncio.Transport | None = None
        #: ends the connection when no hello comes, a frame stays incomplete, nothing comes
        #: or an answer is not taken, too long (none while a request is served)
        self._deadline: Deadline[str] = Deadline(self._loop, self._expired)

    # -- the protocol ---------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # uvloop's is no asyncio.Transport
        raw = transport.get_extra_info("socket")
        self._out = Direct(raw.fileno(), self._loop)
        if len(self.server.connections) >= self.server.settings.shm_max_connections:
            self._send_now(
                error_frame(too_many(self.server.settings.shm_max_connections), self.core.root)
            )
            transport.close()
            return
        self.server.connections.add(self)
        self._deadline.arm(self.server.settings.shm_hello_timeout, HELLO)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        waited = now - self._answered_at  # since the last answer: read before this one's
        host = self.server
        alone = host.served_by is self or now - host.served_at >= self._poller.seconds
        host.served_by, host.served_at = self, now
        self._feed(data)
        if alone and self._poller.ready(waited):
            self._poll()

    def _poll(self) -> None:
        """Serve the requests coming within each answer's window, ``--shm-poll-hold-us`` at most."""
        out, host = self._out, self.server
        if out is None:
            return
        hold = time.perf_counter() + self._hold
        while self._serving() and self._poller.ready():
            if (began := time.perf_counter()) >= hold:
                return
            try:
                data = self._poller.read(out.recv_now, hold - began)
            except OSError:  # the end, which the transport sees too
                data = None
            host.served_at = now = time.perf_counter()
            host.poll_seconds += now - began
            if not data:  # none in time, or the end
                host.polls_missed += 1
                return
            host.polls_found += 1
            self._feed(data)

    def _serving(self) -> bool:
        """Open, the last request answered, and no frame under way."""
        t, task = self._transport, self.task
        idle = (task is None or task.done()) and not self._need and not self._buf
        return self._out is not None and t is not None and not t.is_closing() and idle

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()  # a gather under way in a thread finishes first (see _serve)
            self.task.add_done_callback(lambda _: self._release())
        else:
            self._release()

    # -- requests -------------------------------------------------------------
    def _hot(self, request: Request, received: int) -> None:
        """A binary request: answered now when it is done now, else by a task."""
        began = time.perf_counter()
        done = Done(HOT_OPS[request.op])
        try:
            pending = self._run_hot(request, done)
        except Exception as err:
            self._failed(done, err)
            pending = None
        if pending is None:
            self._answer_now(done, began, received)
        else:
            self._deadline.disarm()
            self.task = self._loop.create_task(self._finish(pending, done, began, received))

    async def _serve(self, message: dict[str, Any], received: int) -> None:
        """A JSON request, in a task."""
        began = time.perf_counter()
        done = Done(op_of(message))
        await self._finish(self._dispatch(message, done), done, began, received)

    async def _finish(
        self, pending: Awaitable[None], done: Done, began: float, received: int
    ) -> None:
        try:
            await pending
        except asyncio.CancelledError:
            raise
        except Exception as err:
            self._failed(done, err)
        await self._finish_send(done.frame(), 0, done, began, received)

    def _failed(self, done: Done, err: Exception) -> None:
        if not isinstance(err, TDReplayError):
            log.exception("shared-memory request %r failed", done.op)
        done.failed(err, self.core.root)

    def _answer_now(self, done: Done, began: float, received: int) -> None:
        """Send the answer from here if the socket takes it whole (it does, but for a
        client that stopped reading); else the rest goes in a task."""
        data, slot = done.frame(), done.slot
        fd = slot.fd if slot is not None else -1
        try:
            sent = self._sendmsg(data, fd)
        except BlockingIOError:
            sent = 0
        except OSError:
            if slot is not None:
                slot.sent()
            self._end()
            return
        if sent < len(data):
            self.task = self._loop.create_task(self._finish_send(data, sent, done, began, received))
            return
        if slot is not None:
            slot.sent()
        self._answered(done, began, received, len(data))

    async def _finish_send(
        self, data: bytes, sent: int, done: Done, began: float, received: int
    ) -> None:
        """Send ``data`` from byte ``sent`` on (the reply's descriptor with its first byte)."""
        slot = done.slot
        self._deadline.arm(self.send_timeout, SEND)  # a client that stopped reading ends there
        try:
            if self._out is None:
                raise ConnectionResetError("the connection is closed")
            await self._out.send(
                data[sent:] if sent else data, -1 if slot is None or sent else slot.fd
            )
        except OSError:
            self._end()
        finally:
            if slot is not None:
                slot.sent()
        self._answered(done, began, received, len(data))

    def _answered(self, done: Done, began: float, received: int, sent: int) -> None:
        self._answered_at = time.perf_counter()
        self._deadline.arm(self.idle_timeout, IDLE)
        if self.server.on_request is not None:
            done.report(self.server.on_request, time.perf_counter() - began, received, sent)

    def _hello(self, message: dict[str, Any]) -> None:
        """The first frame: protocol version and token, or the connection ends."""
        token = self.server.settings.token_bytes
        given = message.get("token")
        try:
            given_bytes = given.encode() if isinstance(given, str) else b""
        except UnicodeEncodeError:  # a lone surrogate: no token has one
            given_bytes = b"\x00"
        version = message.get("version")
        if message.get("op") != "hello" or type(version) is not int or version != VERSION:
            self._send_now(
                frame(bad(f"the first frame must be {{'op': 'hello', 'version': {VERSION}}}"))
            )
            self._end()
        elif token is not None and not hmac.compare_digest(given_bytes, token):
            err = Unauthorized("missing or wrong token on the shared-memory socket")
            self._send_now(frame({"ok": False, "error": err.to_dict()}))
            self._end()
        else:
            self.authed = True
            reply = {
                "ok": True,
                "host": self.server.host,
                "instance": self.server.instance,
                "max_bytes": self.slots.max_bytes,
                "max_slots": self.slots.max_slots,
            }
            self._send_now(frame(reply))
            self._deadline.arm(self.idle_timeout, IDLE)

    # -- writing ----------------------------------------------------------------
    def _send_now(self, data: bytes) -> None:
        if self._out is not None:
            self._out.send_small(data)

    def _sendmsg(self, data: bytes, fd: int) -> int:
        if self._out is None:
            raise ConnectionResetError("the connection is closed")
        return self._out.sendmsg(data, fd)

    # -- the end ----------------------------------------------------------------
    def _end(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def _expired(self, why: str) -> None:
        """A time limit passed (``why``: which): the client is told which, where it can still
        take a frame (no answer of its is under way), and the connection ends. Not for
        ``--send-timeout``: that client takes nothing (an answer of its lies part-sent), so an
        error frame would not reach it, nor could it be told from the answer's bytes; the
        connection is closed silently, as HTTP's is."""
        if why != SEND and (self.task is None or self.task.done()):
            received, whole = self._partial()
            err = late(why, self.server.settings, received, whole)
            self._send_now(error_frame(err, self.core.root))
        self._end()

    def _release(self) -> None:
        self._deadline.cancel()
        self._received()
        self.slots.close()
        if self._out is not None:
            self._out.close()
            self._out = None
        self.server.connections.discard(self)

    async def close(self) -> None:
        """End the connection (the server stops): its call is cancelled, its slots freed."""
        self._end()
        if self.task is not None and not self.task.done():
            self.task.cancel()
            with contextlib.suppress(BaseException):
                await self.task
