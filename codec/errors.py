"""Every error an operation answers with, defined once for the storage, the server and the client.

The storage raises these, the server answers each with its class's HTTP
``status`` and the JSON body of :meth:`TDReplayError.to_dict` (the shared-memory
socket sends the same body), and the client raises the same class again
(:func:`from_body`): ``tdreplay.storage.TableNotFound``,
``tdreplay.client.TableNotFound`` and this module's are one class. The client
adds its transport errors (:mod:`tdreplay.client.errors`) beside them, under
the same root::

    ReplayError                       every error tdreplay raises
    ├── TDReplayError (ServerError)   an operation refused or failed           status
    │   ├── Unprocessable              content the call cannot take             422  (ValueError)
    │   │   └── SchemaError            malformed schema, data not matching it   422
    │   ├── InvalidRequest             bad argument (batch size, path, ...)     400  (ValueError)
    │   ├── CodecError                 a body that is not the Arrow expected    400  (ValueError)
    │   ├── NotFound                   what the call names does not exist       404  (KeyError)
    │   │   └── TableNotFound          no such table                            404
    │   ├── TableExists                name taken                               409
    │   ├── TableClosed                the table closed under the call          409
    │   ├── PathExists                 a path tdreplay will not overwrite       409
    │   ├── RateLimitTimeout           the rate limiter held the call too long  429  (TimeoutError)
    │   │   └── EmptyTableError        ... a sample, and the table held no item 429
    │   ├── CheckpointError            a checkpoint failed or is unreadable     500
    │   │   └── InvalidCheckpoint      damaged, unsupported or unsafe           422
    │   ├── InsufficientStorage        disk full, or over a byte limit          507
    │   ├── BackendError               the storage backend failed               503
    │   │   └── TableLost              the backend lost the table's data        503
    │   ├── Unauthorized               missing or wrong bearer token            401  (PermissionError)
    │   ├── Forbidden                  the token may not do this                403  (PermissionError)
    │   ├── PayloadTooLarge            the body is over the server's limit      413
    │   ├── UnsupportedMediaType       the body is not the route's media type   415
    │   └── InternalError              anything else (details in the log)       500
    └── TransportError                 (the client's: no usable answer came back)

An error carries the offending ``table``, ``field``, ``expected`` and ``got``
where they apply, and quotes them in its message.

    >>> err = from_body(404, {"type": "TableNotFound", "detail": "no table 'x'", "table": "x"})
    >>> type(err) is TableNotFound, err.status, err.table
    (True, 404, 'x')
    >>> TableNotFound("no table 'x'", table="x").to_dict()
    {'type': 'TableNotFound', 'detail': "no table 'x'", 'field': None, 'table': 'x'}
"""

from __future__ import annotations

import json
from typing import Any

from .text import printable


class ReplayError(Exception):
    """Base class of every error tdreplay raises."""

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only arguments: pickle by state
        return (_rebuild, (type(self), str(self.args[0]) if self.args else "", self.__dict__))


def _rebuild(cls: type[ReplayError], message: str, state: dict[str, Any]) -> ReplayError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(state)
    return err


class TDReplayError(ReplayError):
    """An operation refused or failed: what the server answers with, and the client raises.

    Args:
        message: what went wrong, quoting the bad value.
        table: the table involved, if any.
        field: the field (dotted nested key) or argument at fault, if any.
        expected: what was expected, if it applies.
        got: what came instead, if it applies.
        status: the HTTP status it was answered with (default: the class's).
        type: the error's name as the server gave it (default: the class's; differs
            for a ``type`` this client does not know).
        body: the whole error body it was read from, if it came from a server (``{}`` for
            an answer that was not JSON); given, the error is :attr:`answered`.

    Attributes:
        answered: whether a server answered with it (it was read from an answer); ``False``
            for one raised on this side (a check the client or the storage made here, no
            request sent for it), whose ``status`` is only what its class would be
            answered with.

        >>> InvalidRequest("bad path").answered, from_body(400, {"detail": "bad"}).answered
        (False, True)
    """

    #: the HTTP status the server answers this error with
    status = 500
    #: seconds after which the same call may pass (a server at a limit of the work it holds
    #: at once, ``--max-exports``), answered as the ``Retry-After`` header; ``None``: not a
    #: matter of waiting, or no time said
    retry_after: int | None = None

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        field: str | None = None,
        expected: Any = None,
        got: Any = None,
        status: int | None = None,
        type: str | None = None,
        body: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.table = table
        self.field = field
        self.expected = expected
        self.got = got
        if status is not None:
            self.status = status
        self.type = type or self.__class__.__name__
        self.answered = body is not None
        self.body = body or {}

    @property
    def detail(self) -> str:
        """The message (the name the error body gives it)."""
        return self.message

    def __str__(self) -> str:  # KeyError would repr() the message
        named = not self.field or self.field in self.message
        return self.message if named else f"{self.message} [field {self.field!r}]"

    def to_dict(self) -> dict[str, Any]:
        """The JSON body the server answers with: ``{"type", "detail", "field", ...}``."""
        out: dict[str, Any] = {"type": self.type, "detail": self.message, "field": self.field}
        if self.table is not None:
            out["table"] = self.table
        if self.expected is not None:
            out["expected"] = str(self.expected)
        if self.got is not None:
            out["got"] = str(self.got)
        return out


#: the client's name for it: an error the server answered with
ServerError = TDReplayError


class Unprocessable(TDReplayError, ValueError):
    """The call's content cannot be taken (the base of this side's 422s but
    :class:`InvalidCheckpoint`): what a 422 of a ``type`` this side does not know (a newer
    server's) is raised as, since it need not be about a schema."""

    status = 422


class SchemaError(Unprocessable):
    """A schema is malformed, or data does not match a table's schema."""


class InvalidRequest(TDReplayError, ValueError):
    """An argument is out of range or malformed (batch size, index, path, ...)."""

    status = 400


class CodecError(TDReplayError, ValueError):
    """The bytes are not a tdreplay-compatible Arrow IPC stream, or a column cannot be decoded.

    Attributes:
        field: the column (dotted key) at fault, when one is.
    """

    status = 400

    def __init__(self, message: str, field: str | None = None, **kwargs: Any) -> None:
        super().__init__(message, field=field, **kwargs)


class NotFound(TDReplayError, KeyError):
    """What the call names does not exist: the base of :class:`TableNotFound`, and what a 404
    of a ``type`` this side does not know (a newer server's: a checkpoint, a route, ...) or
    without one (a proxy's page) is raised as, since it need not be about a table."""

    status = 404


class TableNotFound(NotFound):
    """No table of that name exists."""


class TableExists(TDReplayError):
    """A table of that name already exists."""

    status = 409


class TableClosed(TDReplayError):
    """The table was closed (deleted, replaced by a restore, or the server is stopping): its
    storage handles are gone, so a call fails instead of reading or writing garbage. A call
    that was waiting when the table closed raises this too."""

    status = 409


class PathExists(TDReplayError):
    """A path to write (checkpoint, export) holds something tdreplay will not replace."""

    status = 409


class RateLimitTimeout(TDReplayError, TimeoutError):
    """A call held back by the rate limiter waited past its timeout."""

    status = 429


class EmptyTableError(RateLimitTimeout):
    """A sample waited past its timeout and the table held no item when it ran out (a
    ``timeout=0`` sample of an empty table raises it at once): nothing to sample, rather than
    too few items or too few inserts for ``samples_per_insert``. A :class:`RateLimitTimeout`
    answered with the same 429, so ``except RateLimitTimeout`` catches it too: the same wait
    may pass once a collector inserts."""


class CheckpointError(TDReplayError):
    """A checkpoint could not be written, or a checkpoint folder is unreadable."""

    status = 500


class InvalidCheckpoint(CheckpointError):
    """A checkpoint folder is damaged, of an unsupported format, or holds something unsafe to load."""

    status = 422


class InsufficientStorage(TDReplayError):
    """No room: the disk is full, or a table would exceed the server's byte limits."""

    status = 507


class BackendError(TDReplayError):
    """The storage backend (disk, HDF5, Redis, ...) failed."""

    status = 503


class TableLost(BackendError):
    """The backend no longer holds the table's data (a Redis restarted without persistence, or
    flushed): every extend and sample fails with this, never with zeros, until the table is
    restored from a checkpoint or deleted and created again."""

    status = 503


class Unauthorized(TDReplayError, PermissionError):
    """Missing or wrong bearer token."""

    status = 401


class Forbidden(TDReplayError, PermissionError):
    """The token is valid but may not do this (e.g. a backend the server does not offer)."""

    status = 403


class PayloadTooLarge(TDReplayError):
    """The request body is over the server's limit."""

    status = 413


class UnsupportedMediaType(TDReplayError):
    """The request body has the wrong ``Content-Type``."""

    status = 415


class InternalError(TDReplayError):
    """The server failed; the details are in its log, not in the response."""

    status = 500


#: every error ``type`` the protocol has, by name
ANSWERS: dict[str, type[TDReplayError]] = {
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

#: the class of an answer whose body names no type (a proxy's page) or a type this side does
#: not know (a newer server's), by status: the class the status stands for, the base of its
#: subclasses where it has some (429: RateLimitTimeout, 503: BackendError, 404: NotFound, 422:
#: Unprocessable: a newer server's 404 need not be about a table, nor its 422 about a schema);
#: none for 409, whose types are siblings (TableExists, TableClosed, PathExists)
BY_STATUS: dict[int, type[TDReplayError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    422: Unprocessable,
    429: RateLimitTimeout,
    500: InternalError,
    503: BackendError,
    507: InsufficientStorage,
}


#: the status an error of a time limit (a request, or its connection, that took too long) is
#: answered with, on every door: HTTP's 408 Request Timeout, on an :class:`InvalidRequest`
TIMED_OUT = 408

#: the statuses that refuse a request for what it holds (its body or its arguments: malformed,
#: not the table's schema, over a size limit, not the route's media type): the same request
#: sent again is refused again, whatever becomes of the server. Every other error may pass
#: later: 404 and 409 (a table re-created or restored), 429, 503 and 507 (a server busy,
#: failing or full), 401 and 403 (a token), 500, and a request that got no answer.
REFUSED_FOR_GOOD = frozenset({400, 413, 415, 422})


def refused_for_good(exc: BaseException) -> bool:
    """Whether ``exc`` refuses its request for good (its status is in :data:`REFUSED_FOR_GOOD`;
    an error type this side does not know counts by its status): a collector's writer drops such
    a chunk, and keeps one that failed otherwise to send it again.

        >>> refused_for_good(SchemaError("x")), refused_for_good(BackendError("x"))
        (True, False)
    """
    return isinstance(exc, TDReplayError) and exc.status in REFUSED_FOR_GOOD


def status_of(exc: BaseException) -> int:
    """The HTTP status an error is answered with (500 for anything not tdreplay's)."""
    return exc.status if isinstance(exc, TDReplayError) else 500


def from_body(status: int, data: dict[str, Any]) -> TDReplayError:
    """The error an error body (``{"type", "detail", ...}``) stands for: its ``type``'s class;
    for a type this side does not know (a newer server's) or none, the status's
    (:data:`BY_STATUS`), so ``except RateLimitTimeout`` still catches a newer server's 429;
    else :class:`TDReplayError` itself. ``type`` keeps the name the server gave.

        >>> err = from_body(429, {"type": "QuotaExceeded", "detail": "over quota"})
        >>> type(err).__name__, err.type, err.status
        ('RateLimitTimeout', 'QuotaExceeded', 429)
    """
    type_name = data.get("type")
    detail = data.get("detail")
    if not isinstance(detail, str):  # a framework's {"detail": [...]}: quoted as it came
        detail = json.dumps(detail) if detail is not None else f"HTTP {status}"
    detail = printable(detail)
    known = ANSWERS.get(type_name) if isinstance(type_name, str) else None
    cls = known if known is not None else BY_STATUS.get(status, TDReplayError)
    field = data.get("field")
    return cls(
        detail,
        status=status,
        type=type_name if isinstance(type_name, str) else None,
        field=field if isinstance(field, str) else None,
        table=data.get("table") if isinstance(data.get("table"), str) else None,
        expected=data.get("expected"),
        got=data.get("got"),
        body=data,
    )
