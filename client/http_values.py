"""One HTTP request and its response, as the commands build and read them (no I/O).

The transports (``http.client`` and asyncio streams) only move these bytes; see
:mod:`.commands`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..codec import protocol
from . import errors

#: ``alloc(n)`` returns a writable buffer of exactly ``n`` bytes to receive a body into
Alloc = Callable[[int], memoryview]
#: ``sink(piece)`` takes a successful response's body piece by piece, as it arrives (a
#: piece is valid only during the call: the buffer is reused)
Sink = Callable[[memoryview], None]


def fresh(n: int) -> memoryview:
    """The default allocator: a new, uninitialized buffer per response.

    (``bytearray(n)`` would zero it first: a wasted pass over a large body.)
    """
    return memoryview(np.empty(n, dtype=np.uint8))  # type: ignore[arg-type]


@dataclass
class Request:
    """One HTTP request, as a command built it.

    Attributes:
        method: ``GET``, ``POST`` or ``DELETE``.
        target: path and query string.
        headers: extra headers (the transport adds Host, Content-Length, Authorization).
        body: the body, if any: bytes, or buffers sent one after the other
            (an extend's columns, uncopied: :func:`tdreplay.codec.encode_parts`).
        wait: seconds the server may hold the call (rate limiter); the
            transport's read timeout is this plus its own.
        idempotent: whether sending it twice is harmless (retries after the
            request may have reached the server are allowed only then).
        alloc: where a successful response's body goes.
        sink: instead, where a successful response's body is poured, piece by piece
            (bounded memory for bodies of any size: an export streamed to a file);
            the response's ``body`` is then empty.
    """

    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | memoryview | tuple[memoryview, ...] | None = None
    wait: float = 0.0
    idempotent: bool = True
    alloc: Alloc = fresh
    sink: Sink | None = None

    @property
    def parts(self) -> tuple[bytes | memoryview, ...]:
        """The body as buffers to send in order (none for no body)."""
        body = self.body
        if body is None:
            return ()
        return body if isinstance(body, tuple) else (body,)

    @property
    def nbytes(self) -> int:
        """The body's length in bytes (its Content-Length)."""
        return sum(len(part) for part in self.parts)


@dataclass
class Response:
    """One HTTP response: status, headers (lower-case names) and the whole body."""

    status: int
    headers: dict[str, str]
    body: memoryview

    def json(self) -> Any:
        try:
            return json.loads(bytes(self.body)) if len(self.body) else None
        except ValueError as err:
            raise errors.ProtocolError(f"response is not JSON: {err}") from None

    def check(self) -> Response:
        """Raise the server's error for a status >= 400; return self otherwise."""
        if self.status >= 400:
            raise errors.from_response(self.status, self.body)
        return self


def json_body(data: Any) -> tuple[dict[str, str], bytes]:
    return {"Content-Type": protocol.JSON}, json.dumps(data).encode()
