"""The hot path's memory on the way in: request bodies read into reused buffers and decoded fast.

* :func:`read_body` copies the body's chunks, as the HTTP server hands them
  over, into a reused buffer of its size class: no large allocation per
  request (8 MiB bodies otherwise flip between fresh ``mmap`` and heap
  allocations and between 0.8 and 2.9 GB/s).
* :class:`BodyDecoder` (the codec's :class:`~tdreplay.codec.ipc.LayoutDecoder`)
  decodes an Arrow IPC body into tensors viewing that buffer. A client sends
  the same layout again and again (same columns, same row count): the first
  body of a layout is parsed by the codec and its column offsets remembered;
  the next ones are sliced at the same offsets, without parsing anything
  (:mod:`tdreplay.codec.ipc` says which checks make that safe).
"""

from __future__ import annotations

import sys

import numpy as np
from starlette.requests import ClientDisconnect, Request

from tdreplay.codec.ipc import LayoutDecoder, metadata_len
from tdreplay.storage import InvalidRequest

from .errors import PayloadTooLarge
from .wire import BufferBudget, Pool

#: the decoder of request bodies (the name the service has always imported)
BodyDecoder = LayoutDecoder

__all__ = [
    "BodyBuffer",
    "BodyChunks",
    "BodyBuffers",
    "BodyDecoder",
    "body_too_large",
    "metadata_len",
    "read_body",
]


class BodyBuffer:
    """A reusable byte buffer for request bodies."""

    def __init__(self, nbytes: int) -> None:
        self.array = np.empty(nbytes, dtype=np.uint8)
        self._free_refs = sys.getrefcount(self.array)

    def is_free(self) -> bool:
        return sys.getrefcount(self.array) <= self._free_refs


MIN_BODY_CLASS = 1 << 16


def _size_class(n: int) -> int:
    return max(MIN_BODY_CLASS, 1 << (max(n, 1) - 1).bit_length())


class BodyBuffers:
    """Request-body buffers by power-of-two size class, shared by every table."""

    def __init__(self, *, per_class: int = 8, budget: BufferBudget | None = None) -> None:
        self.pool: Pool[int, BodyBuffer] = Pool(
            BodyBuffer.is_free, per_key=per_class, max_keys=64, budget=budget
        )

    def view(self, nbytes: int) -> memoryview:
        """A writable ``nbytes`` view of a free buffer; the buffer is free again once the view is gone.

        A new buffer is left uninitialized (``np.empty``): no page is touched
        before the body is copied in.
        """
        size = _size_class(nbytes)
        buf = self.pool.take(size)
        if buf is None:
            buf = BodyBuffer(size)
            self.pool.keep(size, buf)
        return memoryview(buf.array.data)[:nbytes]


async def read_body(request: Request, buffers: BodyBuffers, limit: int) -> memoryview:
    """The request body, read into a reused buffer.

    Raises:
        PayloadTooLarge: the body is (or announces itself as) over ``limit`` bytes.
        InvalidRequest: the Content-Length header is malformed, the body is
            shorter than it says, or the connection ended before the body did
            (the client left, or the server cut it off at one of its limits).
    """
    try:
        return await _read_body(request, buffers, limit)
    except ClientDisconnect:  # a 4xx nobody reads, rather than a traceback in the log
        raise InvalidRequest(
            "the connection closed before the body was complete", field="body"
        ) from None


async def _read_body(request: Request, buffers: BodyBuffers, limit: int) -> memoryview:
    header = request.headers.get("content-length")
    if header is None:  # chunked upload: size unknown up front
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise body_too_large(total, limit, "so far")
            chunks.append(chunk)
        return memoryview(b"".join(chunks))
    try:
        length = int(header)
    except ValueError:
        raise InvalidRequest(
            f"malformed Content-Length {header!r}", field="Content-Length"
        ) from None
    if length > limit:
        raise body_too_large(length, limit, "its Content-Length says")
    view = buffers.view(length)
    pos = 0
    async for chunk in request.stream():
        end = pos + len(chunk)
        if end > length:  # the HTTP server frames bodies by Content-Length; be safe anyway
            raise InvalidRequest(f"body longer than its Content-Length {length}")
        view[pos:end] = chunk
        pos = end
    if pos != length:
        raise InvalidRequest(f"body of {pos} bytes, Content-Length said {length}")
    return view


class BodyChunks:
    """What uvicorn accumulates a request's body chunks in, without its two copies.

    uvicorn appends each chunk to a ``bytearray`` and hands the app
    ``bytes(bytearray)``: two copies of every body byte (28 MB for an atari
    extend of 256 steps), on top of the parser's own. This keeps the chunks as
    they came and joins them only when the app takes them; a single chunk (the
    usual case: reading pauses past 64 KiB until the app takes it) is handed
    over as is. uvicorn puts a fresh ``bytearray`` back after each hand-over,
    and :meth:`~.server.LimitedHttpProtocol.on_body` swaps it for one of these again.
    """

    __slots__ = ("chunks", "nbytes")

    def __init__(self, first: bytes = b"") -> None:
        self.chunks = [first] if first else []
        self.nbytes = len(first)

    def __iadd__(self, chunk: bytes) -> BodyChunks:
        self.chunks.append(chunk)
        self.nbytes += len(chunk)
        return self

    def __len__(self) -> int:
        return self.nbytes

    def __bytes__(self) -> bytes:
        return b"".join(self.chunks)


def body_too_large(got: int, limit: int, how: str = "") -> PayloadTooLarge:
    """The error of a request body over the server's limit (``--max-body-bytes``): one
    wording for the HTTP layer, which refuses it as it arrives, and for the routes, which
    check again (an app served by another ASGI server has only them).

        >>> body_too_large(10, 4, "its Content-Length says").args[0]
        "request body of 10 bytes (its Content-Length says) exceeds the server's limit of 4 bytes (--max-body-bytes)"
    """
    return PayloadTooLarge(
        f"request body of {got} bytes{f' ({how})' if how else ''} exceeds the server's limit "
        f"of {limit} bytes (--max-body-bytes)",
        field="body",
        expected=f"<= {limit} bytes",
        got=got,
    )
