"""The async transport: HTTP/1.1 on an asyncio ``BufferedProtocol``, keep-alive pooled.

Written here rather than taken from a library, by measurement
(``bench/client_bench.py``): on 14 MB bodies asyncio streams
(``StreamReader.readexactly``, 0.25 GB/s) and ``httpx.AsyncClient`` (0.25-0.65
GB/s) ran far below ``http.client``'s ``readinto`` (2.6 GB/s), because they
gather a body from many small reads into growing buffers; this protocol ran
at 2.0 GB/s, and 5.5k tiny calls/s against httpx's 1.0k. A ``BufferedProtocol`` lets the
event loop ``recv_into`` the body's final buffer (the command's
:attr:`~tdreplay.client.commands.Request.alloc`) directly: the head is
parsed from a small scratch buffer, and once ``Content-Length`` is known,
every later byte lands where the decoder will read it. Chunked answers
(the stream and export routes) are gathered through the scratch buffer. A
request with a ``sink`` (an export streamed into a file) has its successful
body poured into it as it arrives, whatever its framing, a piece of at most
1 MiB at a time; its timeout bounds each wait for bytes, not the transfer.

One request at a time per connection (no pipelining); connections belong to
the event loop that opened them (:mod:`.aio_pool`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from ..codec.params import bounded
from . import errors, http1
from .aio_pool import LoopPools
from .commands import Request, Response
from .deprecation import warn_close_deprecated
from .http1 import MAX_HEAD, chunk_size, has_body, parse_head, request_head
from .http_values import Sink
from .settings import ClientSettings
from .transport import Endpoint, head_lines

_SCRATCH = 64 * 1024


class _Protocol(asyncio.BufferedProtocol):
    """One connection: receives one answer at a time, the body straight into its buffer."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._scratch = bytearray(_SCRATCH)
        self._n = 0  # bytes held in scratch
        self._state = "idle"  # head | body | pour | chunked | eof | idle
        self._req: Request | None = None
        self._fut: asyncio.Future[tuple[int, dict[str, str], memoryview, bool]] | None = None
        self._status = 0
        self._headers: dict[str, str] = {}
        self._keep = True
        self._body = memoryview(b"")
        self._got = 0
        self._chunks: list[bytes] = []
        self._chunk_left = -1  # -1: expecting a size line; -2: reading trailers
        self._sink: Sink | None = None  # where a successful body is poured (req.sink)
        self._left = 0  # pour: bytes still to come; -1: until the server closes
        self._piece: memoryview | None = None  # pour: the receive buffer, reused
        self.received = 0  # bytes received: progress, for a poured answer's timeout
        self._writable = asyncio.Event()
        self._writable.set()

    # ---------------------------------------------------------------- asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._writable.set()
        if self._state == "eof":
            self._finish(memoryview(bytes(self._scratch[: self._n])))
        elif self._state == "pour" and self._left < 0:  # its end is the connection's
            self._finish(memoryview(b""))
        else:
            self._fail(ConnectionResetError(f"connection closed by the server ({exc or 'EOF'})"))

    def eof_received(self) -> bool:
        return False  # close our side too; connection_lost follows

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._state == "body":
            return self._body[self._got :]
        if self._state == "pour":
            if self._piece is None:
                self._piece = memoryview(bytearray(http1.PIECE))
            return self._piece if self._left < 0 else self._piece[: min(http1.PIECE, self._left)]
        if self._n == len(self._scratch):  # grow (never resize: the loop may hold a view)
            bigger = bytearray(2 * len(self._scratch))
            bigger[: self._n] = self._scratch
            self._scratch = bigger
        return memoryview(self._scratch)[self._n :]

    def buffer_updated(self, nbytes: int) -> None:
        self.received += nbytes
        if self._state == "body":
            self._got += nbytes
            if self._got == len(self._body):
                self._finish(self._body)
            return
        try:
            if self._state == "pour":
                assert self._piece is not None and self._sink is not None
                http1.pour(self._sink, self._piece[:nbytes])
                self._poured(nbytes)
                return
            self._n += nbytes
            if self._state == "head":
                self._parse_head()
            if self._state == "chunked":
                self._parse_chunks()
        except Exception as err:  # a bad answer, or the sink's (a full disk): the call fails
            self._fail(err)
            if self.transport is not None:
                self.transport.abort()

    # ---------------------------------------------------------------- parsing
    def _consume(self, k: int) -> None:
        """Drop the first ``k`` scratch bytes (same-size slice moves: no resize)."""
        rest = self._n - k
        if rest:
            self._scratch[0:rest] = self._scratch[k : self._n]
        self._n = rest

    def _parse_head(self) -> None:
        while True:
            end = self._scratch.find(b"\r\n\r\n", 0, self._n)
            if end < 0:
                if self._n > MAX_HEAD:
                    raise ValueError("response head over 1 MiB")
                return
            head = parse_head(bytes(self._scratch[:end]))
            self._consume(end + 4)
            if head is not None:  # else informational: the real answer follows
                break
        status, headers = head.status, head.headers
        self._status, self._headers, self._keep = status, headers, head.keep_alive
        assert self._req is not None
        size = head.length
        self._sink = self._req.sink if status < 300 else None
        if not has_body(head, self._req.method):
            self._finish(memoryview(b""))
        elif head.chunked:
            self._state, self._chunks, self._chunk_left = "chunked", [], -1
        elif self._sink is not None:
            self._state, self._left = "pour", -1 if size is None else size
            self._keep = self._keep and size is not None
            have = self._n if size is None else min(self._n, size)
            if have:
                http1.pour(self._sink, memoryview(bytes(self._scratch[:have])))
                self._consume(have)
            self._poured(have)
        elif size is not None:
            target = self._req.alloc(size) if status < 300 and size else memoryview(bytearray(size))
            have = min(self._n, size)
            target[:have] = self._scratch[:have]
            self._consume(have)
            self._body, self._got = target, have
            if have == size:
                self._finish(target)
            else:
                self._state = "body"
        else:
            self._state, self._keep = "eof", False

    def _poured(self, nbytes: int) -> None:
        """``nbytes`` more of a poured body went into the sink; finish at its end."""
        if self._left >= 0:
            self._left -= nbytes
            if self._left == 0:
                self._finish(memoryview(b""))

    def _parse_chunks(self) -> None:
        buf = self._scratch
        pos = 0
        while True:
            if self._chunk_left >= 0:  # data, then CRLF
                if self._sink is not None and self._chunk_left:  # poured as it comes
                    k = min(self._n - pos, self._chunk_left)
                    if k:
                        http1.pour(self._sink, memoryview(bytes(buf[pos : pos + k])))
                    pos, self._chunk_left = pos + k, self._chunk_left - k
                    if self._chunk_left:
                        break
                if self._n - pos < self._chunk_left + 2:
                    break
                if self._sink is None:
                    self._chunks.append(bytes(buf[pos : pos + self._chunk_left]))
                pos += self._chunk_left + 2
                self._chunk_left = -1
                continue
            eol = buf.find(b"\r\n", pos, self._n)
            if eol < 0:
                break
            line = bytes(buf[pos:eol])
            pos = eol + 2
            if self._chunk_left == -2:  # trailers, up to an empty line
                if not line:
                    self._consume(pos)
                    self._finish(memoryview(b"".join(self._chunks)))
                    return
                continue
            size = chunk_size(line)
            self._chunk_left = size if size else -2
        self._consume(pos)

    # ---------------------------------------------------------------- results
    def _finish(self, body: memoryview) -> None:
        self._state = "idle"
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            fut.set_result((self._status, self._headers, body, self._keep))

    def _fail(self, err: BaseException) -> None:
        self._state = "idle"
        fut, self._fut = self._fut, None
        if fut is not None and not fut.done():
            fut.set_exception(err)

    async def roundtrip(
        self, head: bytes, req: Request
    ) -> tuple[int, dict[str, str], memoryview, bool]:
        assert self.transport is not None
        if self.closed:
            raise ConnectionResetError("connection already closed")
        self._req, self._state, self._n = req, "head", 0
        fut = self._fut = asyncio.get_running_loop().create_future()
        if req.nbytes <= _SCRATCH:  # a small body goes out with the head in one write
            self.transport.write(b"".join((head, *req.parts)))
        else:
            self.transport.write(head)
            for part in req.parts:
                if len(part):
                    self.transport.write(part)
        await self._writable.wait()
        if self.closed and not fut.done():
            raise ConnectionResetError("connection closed while sending")
        return await fut


class AsyncTransport:
    """Executes :class:`Request` objects against one server from asyncio.

    Args: as :class:`~tdreplay.client.transport.Transport`.
    """

    def __init__(self, url: str, settings: ClientSettings | None = None) -> None:
        self.endpoint = Endpoint.parse(url)
        settings = settings or ClientSettings((url,))
        self.token = settings.token
        self.timeout = settings.timeout
        self.connect_timeout = settings.connect_timeout
        self.max_idle = settings.max_connections
        self._idle: LoopPools[_Protocol] = LoopPools(self.max_idle)  # by loop (see .aio_pool)

    async def _new(self) -> _Protocol:
        e = self.endpoint
        loop = asyncio.get_running_loop()
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(_Protocol, e.host, e.port, ssl=e.tls or None),
                bounded(self.connect_timeout),
            )
        except TimeoutError:
            raise errors.Timeout(
                f"connecting to {e.url} took over {self.connect_timeout}s", url=e.url
            ) from None
        except OSError as err:
            raise errors.ConnectionFailed(
                f"cannot connect to {e.url}: {err}", url=e.url, sent=False
            ) from None
        return proto

    async def _take(self) -> tuple[_Protocol, bool]:
        proto = self._idle.take()
        return (proto, True) if proto is not None else (await self._new(), False)

    async def aclose(self) -> None:
        """Close every idle connection (see :meth:`LoopPools.close <.aio_pool.LoopPools.close>`)."""
        self._idle.close()

    async def close(self) -> None:
        """Deprecated alias of :meth:`aclose`, removed in the next release."""
        warn_close_deprecated(self)
        await self.aclose()

    async def execute(self, req: Request) -> Response:
        """Send ``req`` and read the whole answer (see :meth:`Transport.execute`)."""
        proto, reused = await self._take()
        try:
            return await self._roundtrip(proto, req)
        except errors.ConnectionFailed as err:
            if not reused or not req.idempotent:  # a call that must not be repeated goes once
                raise
            first = err  # a pooled connection: maybe closed while idle, maybe mid-call
        try:
            return await self._roundtrip(await self._new(), req)
        except errors.TransportError as err:
            raise errors.in_doubt(err, first) from None

    async def _roundtrip(self, proto: _Protocol, req: Request) -> Response:
        url, what = self.endpoint.url, f"{req.method} {req.target}"
        head = request_head(
            req.method,
            self.endpoint.prefix + req.target,
            head_lines(req, self.endpoint, self.token),
        )
        limit = bounded(self.timeout + req.wait)
        result: Any
        try:
            if req.sink is None:
                result = await asyncio.wait_for(proto.roundtrip(head, req), limit)
            else:
                result = await _while_progress(proto, proto.roundtrip(head, req), limit)
        except http1.SinkFailed as err:
            _close(proto)
            raise err.err from None
        except TimeoutError:
            _close(proto)
            raise errors.Timeout(
                f"{what}: no answer from {url} within {limit:g}s", url=url
            ) from None
        except ConnectionError as err:
            _close(proto)
            raise errors.ConnectionFailed(
                f"{what}: connection to {url} lost: {err}", url=url, sent=True
            ) from None
        except ValueError as err:
            _close(proto)
            raise errors.ProtocolError(f"{what}: bad answer from {url}: {err}", url=url) from None
        except BaseException:
            _close(proto)
            raise
        status, headers, body, keep = result
        if keep:
            self._idle.give(proto)
        else:
            _close(proto)
        return Response(status, headers, body)


async def _while_progress(proto: _Protocol, call: Any, limit: float) -> Any:
    """Await ``call`` while ``proto`` receives bytes at least every ``limit`` seconds (a
    poured body may take any time); else raise ``TimeoutError`` (within 2 x ``limit``)."""
    task = asyncio.ensure_future(call)
    try:
        seen = proto.received
        while True:
            done, _ = await asyncio.wait({task}, timeout=limit)
            if done:
                return task.result()
            if proto.received == seen:
                raise TimeoutError
            seen = proto.received
    finally:
        task.cancel()


def _close(proto: _Protocol) -> None:
    """Drop ``proto``: aborted, not closed, so that no queued part of a request goes out later.

    A body's parts view the caller's tensors, and from Python 3.12 asyncio
    queues them uncopied; ``close()`` would go on sending them after the call
    failed, while the caller may already be changing those tensors.
    """
    proto.closed = True
    if proto.transport is not None:
        proto.transport.abort()
