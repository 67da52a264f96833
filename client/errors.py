"""The client's exceptions: one tree, shared by :class:`ReplayClient` and its async twin.

A server that answers with a JSON error (``{"type", "detail", "field", ...}``,
see :mod:`tdreplay.codec.protocol`) raises the :class:`ServerError` subclass of
the same name as the server's ``type`` - the very class the server's storage
raised (:mod:`tdreplay.codec.errors`, the one hierarchy); a call that never got
an answer raises a :class:`TransportError`. The tree::

    ReplayError
    ├── ServerError              the server answered with an error (.status, .detail, .field, ...)
    │   ├── Unprocessable        content the call cannot take                 422  (ValueError)
    │   │   └── SchemaError      data or schema does not match the table      422
    │   ├── InvalidRequest       a bad argument: batch size, index, path, ...  400  (ValueError)
    │   ├── CodecError           the server could not decode the Arrow body    400  (ValueError)
    │   ├── NotFound             what the call names does not exist            404  (KeyError)
    │   │   └── TableNotFound    no table of that name                         404
    │   ├── TableExists          a table of that name already exists           409
    │   ├── TableClosed          the table was closed (deleted, replaced, ...) 409
    │   ├── PathExists           a checkpoint/export path is taken             409
    │   ├── RateLimitTimeout     the rate limiter held the call past timeout   429  (TimeoutError)
    │   │   └── EmptyTableError  ... a sample, and the table held no item      429
    │   ├── CheckpointError      a checkpoint could not be written or read     500
    │   │   └── InvalidCheckpoint  damaged, unsupported or unsafe checkpoint   422
    │   ├── InsufficientStorage  disk full, or over the server's byte limits   507
    │   ├── BackendError         the storage backend failed                    503
    │   │   └── TableLost        the backend lost the table's data (Redis)     503
    │   ├── Unauthorized         missing or wrong bearer token                 401  (PermissionError)
    │   ├── Forbidden            the token may not do this                     403  (PermissionError)
    │   ├── PayloadTooLarge      the request body is over the server's limit   413
    │   ├── UnsupportedMediaType the body is not the media type the route takes 415
    │   └── InternalError        anything else that went wrong in the server   500
    └── TransportError           no usable answer came back
        ├── ConnectionFailed     could not connect, or the connection dropped  (ConnectionError)
        │   └── ShmUnavailable   the same-host socket cannot be used (nothing was sent)
        ├── Timeout              connect or read took longer than the timeout  (TimeoutError)
        └── ProtocolError        the answer was not the HTTP/Arrow/JSON expected

An error ``type`` the client does not know (a newer server's) comes back as the
class its status stands for (429:
:class:`RateLimitTimeout`, 400: :class:`InvalidRequest`, 503: :class:`BackendError`,
404: :class:`NotFound`, not :class:`TableNotFound`, 422: :class:`Unprocessable`, not
:class:`SchemaError`, ...; a status with none, as 409, a plain :class:`ServerError`), its
``type`` the server's name. Retries (see
:class:`~tdreplay.client.retry.RetryPolicy`) apply to :class:`ConnectionFailed`
only; every other error is raised at once. Of the errors a call raises, those of
:func:`refused_for_good` (400, 413, 415, 422) refuse the request for what it holds: a
writer drops such a chunk, and keeps any other failed one to send it again.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..codec.errors import (
    ANSWERS,
    BY_STATUS,
    BackendError,
    CheckpointError,
    CodecError,
    EmptyTableError,
    Forbidden,
    InsufficientStorage,
    InternalError,
    InvalidCheckpoint,
    InvalidRequest,
    NotFound,
    PathExists,
    PayloadTooLarge,
    RateLimitTimeout,
    ReplayError,
    SchemaError,
    ServerError,
    TableClosed,
    TableExists,
    TableLost,
    TableNotFound,
    Unauthorized,
    Unprocessable,
    UnsupportedMediaType,
    from_body,
    refused_for_good,
)
from ..codec.text import printable

__all__ = [
    "BackendError",
    "CheckpointError",
    "CodecError",
    "ConnectionFailed",
    "EmptyTableError",
    "Forbidden",
    "InsufficientStorage",
    "InternalError",
    "InvalidCheckpoint",
    "InvalidRequest",
    "NotFound",
    "PathExists",
    "PayloadTooLarge",
    "ProtocolError",
    "RateLimitTimeout",
    "ReplayError",
    "SERVER_ERRORS",
    "SchemaError",
    "ServerError",
    "TableClosed",
    "TableExists",
    "TableLost",
    "TableNotFound",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unprocessable",
    "UnsupportedMediaType",
    "from_response",
    "in_doubt",
    "may_have_arrived",
    "refused_for_good",
]

#: server error ``type`` -> class: the classes the storage raises and the server answers with
SERVER_ERRORS = ANSWERS


def from_response(status: int, body: bytes | bytearray | memoryview) -> ServerError:
    """The exception for an error response: by the body's ``type``, else by status.

    A body that is not the protocol's JSON (a proxy's HTML page, a framework's
    ``{"detail": [...]}``) still gives an error of the status' class, quoting it.
    """
    data: Any = None
    with contextlib.suppress(ValueError):
        data = json.loads(bytes(body) or b"null")
    if not isinstance(data, dict):
        text = printable(bytes(body[:500]).decode("utf-8", "replace")) if body else ""
        cls = BY_STATUS.get(status, ServerError)
        return cls(f"HTTP {status}: {text}".rstrip(": "), status=status, body={})
    return from_body(status, data)


# ------------------------------------------------------------------ transport errors
class TransportError(ReplayError):
    """No usable answer came back from the server.

    Attributes:
        url: the server's base URL.
    """

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class ConnectionFailed(TransportError, ConnectionError):
    """The client could not connect, or the connection dropped before the answer was read.

    Attributes:
        sent: whether the request may have reached the server (a retry of a
            non-idempotent call could then repeat it).
    """

    def __init__(self, message: str, *, url: str | None = None, sent: bool = False) -> None:
        super().__init__(message, url=url)
        self.sent = sent


def may_have_arrived(err: TransportError | None) -> bool:
    """Whether the request of a try that failed with ``err`` may have reached the server: a
    connection that dropped once it was sent (``sent``), or any failure but a connection's
    (a timeout, an answer that could not be read). ``None`` (no try failed): no."""
    if err is None:
        return False
    return not isinstance(err, ConnectionFailed) or err.sent


def in_doubt(err: TransportError, first: TransportError | None) -> TransportError:
    """The error of a call whose later try failed with ``err`` after an earlier try failed
    with ``first`` (a pooled connection that broke, the shared-memory socket, a retry): if
    the first may have carried the request to the server (:func:`may_have_arrived`), so
    may the call have (``sent``), whatever the later one says - a sharded extend must then
    not go to another server: it may be stored already."""
    if may_have_arrived(first) and isinstance(err, ConnectionFailed) and not err.sent:
        return ConnectionFailed(
            f"{err} (after a first try broke mid-call: {first})", url=err.url, sent=True
        )
    return err


class Timeout(TransportError, TimeoutError):
    """Connecting, sending or reading took longer than the client's timeout."""


class ProtocolError(TransportError):
    """The answer was not what the protocol says (bad HTTP, bad JSON, bad Arrow)."""
