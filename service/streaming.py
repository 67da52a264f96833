"""Streamed answers that end with their client and leave nothing to the garbage collector.

Starlette's ``StreamingResponse``, under a server that speaks ASGI 2.3 (uvicorn),
watches for the client's disconnect in an anyio task group and cancels the
task writing the answer when it comes. anyio keeps that ``CancelledError`` in
a local of one of the frames of its own traceback: a reference cycle, which
holds every frame the cancel went through, and the sample bodies and layouts
they referred to, until the next cyclic garbage collection (measured: 100
MiB of RSS held after two streams of 16 MiB batches were cut; a busy server
can push such a cycle into the oldest generation, collected rarely).

:class:`ClosingStream` watches for the disconnect in a plain task and stops
asking its body for chunks once it came, then closes the body (``aclose``: its
``finally`` blocks run, nothing is cancelled). A body blocked when its client
goes ends on its own: a send waiting for room returns once the connection is
gone, and a sample waiting for the rate limiter watches the disconnect itself
(the ``left`` of :func:`~tdreplay.service.core.waiting.admitted`, :func:`client_gone`).
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["CLIENT_ENDED", "ClosingStream", "client_gone"]

#: the key of a request's scope that the HTTP layer (:mod:`.server`) sets once the client
#: ended its sending side (its FIN) after the request: the request is still answered
CLIENT_ENDED = "tdreplay.client_ended"


async def client_gone(scope: Scope, receive: Receive) -> None:
    """Return once the client of ``scope`` is gone or has ended its sending side (what it
    still sends is dropped). A ``close()`` and a ``shutdown(SHUT_WR)`` send the same FIN,
    so a wait on the rate limiter takes either as its caller leaving: a learner that hung
    up takes no item (its half-closing twin is answered 429)."""
    while not scope.get(CLIENT_ENDED) and (await receive())["type"] != "http.disconnect":
        pass


class ClosingStream(StreamingResponse):
    """A ``StreamingResponse`` over an async iterator, closed, never cancelled, when its
    client disconnects (see the module docstring). Its background task runs after a
    complete answer and after a client gone midway, as Starlette's does."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = aiter(self.body_iterator)
        gone = asyncio.ensure_future(self.listen_for_disconnect(receive))
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": self.status_code,
                    "headers": self.raw_headers,
                }
            )
            while not gone.done():
                try:
                    chunk = await anext(body)
                except StopAsyncIteration:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    break
                if not isinstance(chunk, bytes | memoryview):
                    chunk = chunk.encode(self.charset)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except OSError:  # an ASGI 2.4 server's word for a client gone
            raise ClientDisconnect() from None
        finally:
            gone.cancel()
            aclose = getattr(body, "aclose", None)
            if aclose is not None:
                await aclose()
        if self.background is not None:
            await self.background()
