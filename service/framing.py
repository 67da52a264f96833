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
from collections.abc import Callable

from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from tdreplay.storage import InvalidRequest, TDReplayError

from .limits import Limits

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


def unknown_coding(coding: bytes) -> InvalidRequest:
    """The error of a request whose body is sent in a transfer coding this server does not
    decode (RFC 9112 6.1: 501): it decodes ``chunked`` only, and a ``gzip`` body would reach
    the routes as it came."""
    return InvalidRequest(
        f"Transfer-Encoding {coding.decode('latin-1')!r}: this server decodes 'chunked' only; "
        "send the body as it is (Content-Length) or chunked",
        field="Transfer-Encoding",
        expected="chunked",
        got=coding.decode("latin-1"),
    )


def unmet_expectation(expect: bytes) -> InvalidRequest:
    """The error of a request whose ``Expect`` asks for what this server does not do (RFC 9110
    10.1.1: 417): ``100-continue`` is the only expectation HTTP/1.1 defines.

        >>> unmet_expectation(b"200-ok").field
        'Expect'
    """
    got = expect.decode("latin-1")
    return InvalidRequest(
        f"Expect {got!r}: this server meets '100-continue' only; send the request without "
        "that Expect",
        field="Expect",
        expected="100-continue",
        got=got,
    )


#: an HTTP/1.1 request without ``Host`` (RFC 9112 3.2: a client MUST send it, the server
#: MUST answer 400); HTTP/1.0 may lack it
NO_HOST = "an HTTP/1.1 request without a Host header (RFC 9112 3.2); send Host: host[:port]"


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


def pipelined_too_deep(n: int, cap: int) -> InvalidRequest:
    """The error of the ``n``-th request a client sent ahead of the answers to those before
    it, past ``--max-pipelined``."""
    return InvalidRequest(
        f"{n} requests sent on one connection ahead of their answers, past the server's limit "
        f"of {cap} (--max-pipelined); read the answers before sending more",
        field="connection",
        expected=f"<= {cap} requests waiting",
        got=n,
    )


class Refusal(Exception):
    """A request refused at its head: ``error``, answered with ``status``."""

    def __init__(self, error: TDReplayError, status: int) -> None:
        super().__init__(error)
        self.error = error
        self.status = status


def check_head(
    url: bytes,
    headers: list[tuple[bytes, bytes]],
    upgrade: bool,
    pipelined: int,
    limits: Limits,
    http_version: Callable[[], str],
) -> bytes:
    """The Content-Length of a request whose head (``url``, ``headers``; ``upgrade``: the parser
    expects it to upgrade; ``pipelined``: requests before it waiting on its connection;
    ``http_version``: its version, ``"1.1"``, asked only of a request without ``Host``) passes
    the checks of its framing, ``b""`` if it has none.

    Raises:
        Refusal: 431 past ``--max-header-bytes``; 400 past ``--max-pipelined`` (each waiting
            request holds ~1 KB), with two ``Host`` headers (RFC 9112 3.2: the Host check and
            the app would read different ones), with none in HTTP/1.1 (RFC 9112 3.2), or an
            Upgrade with a body; 501 for a transfer coding but ``chunked``; 417 for an
            ``Expect`` but ``100-continue`` (RFC 9110 10.1.1).
    """
    size = len(url)
    length = b""
    hosts = 0
    codings: list[bytes] = []
    expect = b""
    for name, value in headers:
        size += len(name) + len(value)
        if name == b"content-length":
            length = value
        elif name == b"host":
            hosts += 1
        elif name == b"transfer-encoding":
            codings.append(value)
        elif name == b"expect" and value and value.lower() != b"100-continue":
            expect = value  # uvicorn meets 100-continue (any case); an empty one asks nothing
    if size > limits.max_header_bytes:
        raise Refusal(headers_too_large(size, limits.max_header_bytes), 431)
    if pipelined >= limits.max_pipelined:
        raise Refusal(pipelined_too_deep(pipelined + 1, limits.max_pipelined), 400)
    if hosts != 1:
        if hosts:
            raise Refusal(malformed(f"{hosts} Host headers, where it takes one", "Host"), 400)
        if http_version() not in ("1.0", "0.9"):
            raise Refusal(malformed(NO_HOST, "Host"), 400)
    if codings and b", ".join(codings).strip().lower() != b"chunked":
        raise Refusal(unknown_coding(b", ".join(codings)), 501)
    if upgrade and (codings or length.strip(b"0")):
        raise Refusal(UPGRADE_WITH_BODY, 400)
    if expect:
        raise Refusal(unmet_expectation(expect), 417)
    return length
