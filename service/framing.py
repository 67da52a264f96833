"""What the HTTP layer (:mod:`tdreplay.service.server`) answers a request it refuses with.

Each refusal is the protocol's JSON error (``{"type", "detail", "field"}``) in a whole
``Connection: close`` response, written by the protocol itself: the request never
reaches the app.

    >>> malformed("Invalid character in chunk size").detail
    'malformed HTTP/1.1 request: Invalid character in chunk size'
    >>> refusal(400, malformed("x"), []).split(b"\\r\\n")[0]
    b'HTTP/1.1 400 Bad Request'
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from tdreplay.storage import InvalidRequest, TDReplayError

#: a request with ``Connection: Upgrade`` and a body: the parser skips the body of a request
#: it expects to upgrade, and would read that body as the next request (smuggled)
UPGRADE_WITH_BODY = InvalidRequest(
    "a request with Connection: Upgrade carries a body: this server speaks HTTP/1.1 and "
    "upgrades to nothing; send it without Upgrade (curl: --http1.1)",
    field="Upgrade",
)


def refusal(status: int, error: TDReplayError, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """A whole ``Connection: close`` response carrying ``error``'s JSON body."""
    body = json.dumps(error.to_dict()).encode()
    head = [STATUS_LINE[status]]
    for name, value in default_headers:
        head += [name, b": ", value, b"\r\n"]
    head += [
        b"content-type: application/json\r\n",
        b"content-length: " + str(len(body)).encode() + b"\r\n",
        b"connection: close\r\n\r\n",
    ]
    return b"".join(head) + body


def malformed(reason: str, field: str = "request") -> InvalidRequest:
    """The error of a request the HTTP/1.1 parser (or its framing rules) refuses: ``reason``
    is the parser's (a malformed chunk size, two Content-Lengths, a NUL in a header)."""
    return InvalidRequest(f"malformed HTTP/1.1 request: {reason}", field=field)


def headers_too_large(size: int, cap: int) -> InvalidRequest:
    """The error of a request line and header fields (trailers included) of ``size`` bytes,
    past ``--max-header-bytes``."""
    return InvalidRequest(
        f"request line and header fields (a chunked body's trailers too) of {size}+ bytes "
        f"exceed the server's limit of {cap} "
        "bytes (--max-header-bytes)",
        field="headers",
        expected=f"<= {cap} bytes",
        got=size,
    )
