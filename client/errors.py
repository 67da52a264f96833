"""The client's exceptions: one tree, shared by :class:`ReplayClient` and its async twin.

A server that answers with a JSON error (``{"type", "detail", "field", ...}``,
see :mod:`tdreplay.codec.protocol`) raises the :class:`ServerError` subclass of
the same name as the server's ``type``; a call that never got an answer
raises a :class:`TransportError`. The tree::

    ReplayError
    ├── ServerError              the server answered with an error (.status, .detail, .field, ...)
    │   ├── SchemaError          data or schema does not match the table      422  (ValueError)
    │   ├── InvalidRequest       a bad argument: batch size, index, path, ...  400  (ValueError)
    │   ├── CodecError           the server could not decode the Arrow body    400  (ValueError)
    │   ├── TableNotFound        no table of that name                         404  (KeyError)
    │   ├── TableExists          a table of that name already exists           409
    │   ├── TableClosed          the table was closed (deleted, replaced, ...) 409
    │   ├── PathExists           a checkpoint/export path is taken             409
    │   ├── RateLimitTimeout     the rate limiter held the call past timeout   429  (TimeoutError)
    │   ├── EmptyTableError      nothing to sample                             409
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

An error ``type`` the client does not know (a newer server) comes back as a
plain :class:`ServerError` with that ``type``. Retries (see
:class:`~tdreplay.client.retry.RetryPolicy`) apply to :class:`ConnectionFailed`
only; every other error is raised at once.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..codec.protocol import ERROR_STATUS


class ReplayError(Exception):
    """Base class of every error the client raises."""


# ------------------------------------------------------------------ server errors
class ServerError(ReplayError):
    """The server answered with an error.

    Attributes:
        status: the HTTP status.
        type: the server's error class name (``"SchemaError"``, ...).
        detail: the server's message (quotes the bad value).
        field: the dotted key or argument at fault, if any.
        table: the table involved, if the server said.
        expected: what was expected, if the server said.
        got: what came instead, if the server said.
        body: the whole decoded error body.
    """

    def __init__(
        self,
        detail: str,
        *,
        status: int = 0,
        type: str | None = None,
        field: str | None = None,
        table: str | None = None,
        expected: Any = None,
        got: Any = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.status = status
        self.type = type or self.__class__.__name__
        self.field = field
        self.table = table
        self.expected = expected
        self.got = got
        self.body = body or {}

    @property
    def message(self) -> str:
        return self.detail

    def __str__(self) -> str:  # KeyError subclasses would repr() the message
        where = f" [field {self.field!r}]" if self.field else ""
        return f"{self.detail}{where}"

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only args: pickle by state
        return (_rebuild, (type(self), self.detail, self.__dict__))


def _rebuild(cls: type[ServerError], detail: str, state: dict[str, Any]) -> ServerError:
    err = cls.__new__(cls)
    Exception.__init__(err, detail)
    err.__dict__.update(state)
    return err


class SchemaError(ServerError, ValueError):
    """The data (or a schema) does not match the table: wrong key, shape, dtype, batch dims."""


class InvalidRequest(ServerError, ValueError):
    """An argument is out of range or malformed (batch size, index, path, ...)."""


class CodecError(ServerError, ValueError):
    """The server could not decode the request body as an Arrow IPC stream."""


class TableNotFound(ServerError, KeyError):
    """No table of that name exists on the server."""


class TableExists(ServerError):
    """A table of that name already exists."""


class TableClosed(ServerError):
    """The table was closed under the call (deleted, replaced by a restore, or the server is
    stopping); a call to a table of that name made afterwards reaches whatever holds it then."""


class PathExists(ServerError):
    """A checkpoint or export path holds something the server will not replace; nothing changed."""


class RateLimitTimeout(ServerError, TimeoutError):
    """The rate limiter held the call back past its timeout."""


class EmptyTableError(ServerError):
    """The table holds nothing a sampler may return."""


class CheckpointError(ServerError):
    """A checkpoint could not be written or read."""


class InvalidCheckpoint(CheckpointError):
    """The checkpoint is damaged, of an unsupported format, or unsafe to load; nothing changed."""


class InsufficientStorage(ServerError):
    """No room on the server: its disk is full, or a table would exceed its byte limits."""


class BackendError(ServerError):
    """The table's storage backend failed (disk, Redis, ...)."""


class TableLost(BackendError):
    """The server's backend lost the table's data (a Redis restarted empty, or flushed);
    restore the table from a checkpoint, or delete and create it again."""


class Unauthorized(ServerError, PermissionError):
    """The bearer token is missing or wrong."""


class Forbidden(ServerError, PermissionError):
    """The token is valid but may not make this call."""


class PayloadTooLarge(ServerError):
    """The request body is over the server's size limit; send smaller chunks."""


class UnsupportedMediaType(ServerError):
    """The request body is not of the media type the route takes."""


class InternalError(ServerError):
    """The server failed in a way it did not classify."""


#: server error ``type`` -> client class; every name of ``protocol.ERROR_STATUS``
SERVER_ERRORS: dict[str, type[ServerError]] = {
    cls.__name__: cls
    for cls in (
        SchemaError,
        InvalidRequest,
        CodecError,
        TableNotFound,
        TableExists,
        TableClosed,
        PathExists,
        RateLimitTimeout,
        EmptyTableError,
        CheckpointError,
        InvalidCheckpoint,
        InsufficientStorage,
        BackendError,
        TableLost,
        Unauthorized,
        Forbidden,
        PayloadTooLarge,
        UnsupportedMediaType,
        InternalError,
    )
}
assert set(SERVER_ERRORS) == set(ERROR_STATUS), "client errors out of step with the protocol"

_BY_STATUS: dict[int, type[ServerError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: TableNotFound,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: SchemaError,
    429: RateLimitTimeout,
    500: InternalError,
    503: BackendError,
}


def from_response(status: int, body: bytes | bytearray | memoryview) -> ServerError:
    """The exception for an error response: by the body's ``type``, else by status.

    A body that is not the protocol's JSON (a proxy's HTML page, a framework's
    ``{"detail": [...]}``) still gives an error of the status' class, quoting it.
    """
    data: Any = None
    with contextlib.suppress(ValueError):
        data = json.loads(bytes(body) or b"null")
    if not isinstance(data, dict):
        text = bytes(body[:500]).decode("utf-8", "replace") if body else ""
        cls = _BY_STATUS.get(status, ServerError)
        return cls(f"HTTP {status}: {text}".rstrip(": "), status=status, body={})
    type_name = data.get("type")
    detail = data.get("detail")
    if not isinstance(detail, str):
        detail = json.dumps(detail) if detail is not None else f"HTTP {status}"
    known = SERVER_ERRORS.get(type_name) if isinstance(type_name, str) else None
    if known is not None:
        cls = known
    else:
        cls = _BY_STATUS.get(status, ServerError) if type_name is None else ServerError
    field = data.get("field")
    return cls(
        detail,
        status=status,
        type=type_name if isinstance(type_name, str) else None,
        field=field if isinstance(field, str) else None,
        table=data.get("table"),
        expected=data.get("expected"),
        got=data.get("got"),
        body=data,
    )


# ------------------------------------------------------------------ transport errors
class TransportError(ReplayError):
    """No usable answer came back from the server.

    Attributes:
        url: the server's base URL.
    """

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_transport, (type(self), str(self), self.__dict__))


def _rebuild_transport(
    cls: type[TransportError], message: str, state: dict[str, Any]
) -> TransportError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class ConnectionFailed(TransportError, ConnectionError):
    """The client could not connect, or the connection dropped before the answer was read.

    Attributes:
        sent: whether the request may have reached the server (a retry of a
            non-idempotent call could then repeat it).
    """

    def __init__(self, message: str, *, url: str | None = None, sent: bool = False) -> None:
        super().__init__(message, url=url)
        self.sent = sent


class Timeout(TransportError, TimeoutError):
    """Connecting, sending or reading took longer than the client's timeout."""


class ProtocolError(TransportError):
    """The answer was not what the protocol says (bad HTTP, bad JSON, bad Arrow)."""
