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
    │   ├── SchemaError                malformed schema, data not matching it   422  (ValueError)
    │   ├── InvalidRequest             bad argument (batch size, path, ...)     400  (ValueError)
    │   ├── CodecError                 a body that is not the Arrow expected    400  (ValueError)
    │   ├── TableNotFound              no such table                            404  (KeyError)
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
import unicodedata
from typing import Any


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
        body: the whole error body it was read from, if it came from a server.
    """

    #: the HTTP status the server answers this error with
    status = 500

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


class SchemaError(TDReplayError, ValueError):
    """A schema is malformed, or data does not match a table's schema."""

    status = 422


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


class TableNotFound(TDReplayError, KeyError):
    """No table of that name exists."""

    status = 404


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

#: the class of an answer whose body names no type (a proxy's page), by status
BY_STATUS: dict[int, type[TDReplayError]] = {
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


def json_failure(err: Exception) -> str:
    """Why a JSON text failed to decode, in words: one wording for every door (the HTTP
    routes' JSON bodies, the shared-memory socket's control frames).

        >>> try:
        ...     json.loads("[" * 100_000)
        ... except RecursionError as err:
        ...     json_failure(err)
        'nested too deeply (arrays or objects inside one another past the depth the decoder allows)'
    """
    if isinstance(err, RecursionError):
        return "nested too deeply (arrays or objects inside one another past the depth the decoder allows)"
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 ({err.reason} at byte {err.start})"
    return str(err)[:200]  # a JSONDecodeError's position, a huge integer's digit limit


#: Unicode categories a terminal or a log does not show as themselves: control characters
#: (Cc: a newline, an escape) and format characters (Cf: a bidi override such as U+202E, which
#: reorders what follows it; a zero-width space or joiner, which hides)
HIDDEN_CATEGORIES = frozenset({"Cc", "Cf"})
#: what :func:`printable` escapes: those, and lone surrogates (Cs: a ``str`` may hold one,
#: e.g. from JSON's ``"\ud800"``, but no UTF-8 does: writing one to a terminal, a log or a
#: file fails with ``UnicodeEncodeError``)
ESCAPED_CATEGORIES = HIDDEN_CATEGORIES | {"Cs"}


def is_hidden(char: str) -> bool:
    """Whether ``char`` is a control or format character (:data:`HIDDEN_CATEGORIES`)."""
    return unicodedata.category(char) in HIDDEN_CATEGORIES


def printable(text: str) -> str:
    r"""``text`` with each control or format character, and each lone surrogate, written as
    its escape (``\x1b``, ``\n``, ``\u202e``, ``\ud800``): what a server sent, safe to show on
    a terminal or in a log (an escape sequence there could retitle the window, recolour or
    erase lines, or forge a line; a bidi override could make ``gnp.exe`` read ``exe.png``; a
    lone surrogate fails to encode). Letters outside ASCII stay as they are.

        >>> printable("no table \x1b]0;owned\x07 'x'")
        "no table \\x1b]0;owned\\x07 'x'"
        >>> printable("café \u202egnp.exe")
        'café \\u202egnp.exe'
        >>> printable("a\ud800b")
        'a\\ud800b'
    """
    if text.isprintable():
        return text
    return "".join(
        repr(c)[1:-1] if unicodedata.category(c) in ESCAPED_CATEGORIES else c for c in text
    )


def from_body(status: int, data: dict[str, Any]) -> TDReplayError:
    """The error an error body (``{"type", "detail", ...}``) stands for: its ``type``'s class,
    else the status's (a body without a type), else :class:`TDReplayError` itself."""
    type_name = data.get("type")
    detail = data.get("detail")
    if not isinstance(detail, str):  # a framework's {"detail": [...]}: quoted as it came
        detail = json.dumps(detail) if detail is not None else f"HTTP {status}"
    detail = printable(detail)
    known = ANSWERS.get(type_name) if isinstance(type_name, str) else None
    if known is not None:
        cls = known
    else:
        cls = BY_STATUS.get(status, TDReplayError) if type_name is None else TDReplayError
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
