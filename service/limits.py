"""The limits of one server: the :class:`LimitSettings` part of :class:`~.settings.Settings`.

What a client may make the server hold or wait for: body and header sizes,
the time a request may take to arrive and its answer to be taken, open
connections, tables, and the requests remembered for idempotency. Each is a
field of :class:`~.settings.Settings` like any other (a flag of ``tdreplay
serve`` and a ``TDREPLAY_*`` variable); the HTTP layer
(:mod:`tdreplay.service.server`) holds most of them before a request reaches
the app.

    >>> from tdreplay.service import Settings
    >>> Settings(max_body_bytes=1024).max_body_bytes
    1024
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from pydantic import BaseModel, Field

from tdreplay.codec.errors import TIMED_OUT
from tdreplay.storage import MAX_TABLE_BYTES, BackendError, InvalidRequest

from .errors import PayloadTooLarge

MiB = 1 << 20
GiB = 1 << 30


def timed_out(message: str, *, field: str, expected: str, got: str | None = None) -> InvalidRequest:
    """The error of a time limit that ended a request or its connection (``message`` names the
    limit's flag): an :class:`InvalidRequest` answered with :data:`TIMED_OUT`.

        >>> err = timed_out("no hello within 1 s (--shm-hello-timeout)", field="hello",
        ...                 expected="a hello within 1 s")
        >>> type(err).__name__, err.status
        ('InvalidRequest', 408)
    """
    return InvalidRequest(message, field=field, expected=expected, got=got, status=TIMED_OUT)


class LimitSettings(BaseModel):
    """The limits group of :class:`~.settings.Settings` (not used on its own)."""

    max_body_bytes: int = Field(
        default=256 * MiB, ge=1, description="Largest request or sample body, in bytes (413)."
    )
    max_load_bytes: int = Field(
        default=32 * GiB,
        ge=1,
        description="Largest archive a load in parts may send (413 at its begin); each part "
        "is one request within --max-body-bytes.",
    )
    load_timeout: float = Field(
        default=300.0,
        gt=0,
        description="Seconds a load in parts may idle between requests before it is abandoned "
        "and its staged bytes deleted.",
    )
    max_tables: int = Field(
        default=1024,
        ge=1,
        description="Most tables served at once (each costs memory maps, a request-id memory and "
        "metrics); a create or restore past it answers 507.",
    )
    max_total_bytes: int = Field(
        default=64 * GiB,
        ge=1,
        description="Largest sum over all tables of what they allocate (rows and bookkeeping); "
        "a create or restore past it answers 507.",
    )
    max_fields: int = Field(
        default=1024,
        ge=1,
        description="Most fields one table may declare; a schema with more is refused with 422.",
    )
    max_table_bytes: int = Field(
        default=MAX_TABLE_BYTES,
        ge=1,
        description="Largest table (capacity x (item + per-slot bookkeeping)); a schema "
        "past it is refused with 422.",
    )
    default_timeout: float = Field(
        default=30.0,
        ge=0,
        description="Seconds an extend or sample waits for the rate limiter when the client "
        "gives no timeout.",
    )
    max_timeout: float = Field(
        default=600.0, ge=0, description="Upper bound on a client's timeout, in seconds."
    )
    idempotency_size: int = Field(
        default=10_000, ge=0, description="X-Request-Id values remembered per table."
    )
    idempotency_ttl: float = Field(
        default=300.0, ge=0, description="Seconds an X-Request-Id is remembered."
    )
    idempotency_bytes: int = Field(
        default=64 * MiB,
        ge=0,
        description="Bytes of remembered extend answers (ids, indices) per table; the oldest "
        "are forgotten first.",
    )
    max_header_bytes: int = Field(
        default=64 * 1024,
        ge=1,
        description="Largest request line plus headers, in bytes, counted as they arrive (431).",
    )
    header_timeout: float = Field(
        default=10.0,
        gt=0,
        description="Seconds a request's headers may take from its first byte (or from the "
        "connection's opening) (408, connection closed).",
    )
    keep_alive_timeout: float = Field(
        default=5.0,
        gt=0,
        description="Seconds a kept-alive connection may idle between an answer and the next "
        "request's first byte; the server then closes it.",
    )
    body_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds a request's whole body may take after its headers; time the "
        "server is busy and not reading does not count (408, connection closed).",
    )
    send_timeout: float = Field(
        default=60.0,
        gt=0,
        description="Seconds an answer may go without its client taking any of it (a client "
        "that stopped reading); the connection is then closed and what the answer held freed. "
        "A slow reader that keeps taking bytes is not cut.",
    )
    max_receiving_bytes: int = Field(
        default=2 * GiB,
        ge=1,
        description="Bytes of request bodies held at once, all connections together: being "
        "received (a Content-Length counts whole from the headers on), or kept by an extend or "
        "insert the rate limiter holds back; a request past it answers 503 (413 if its body "
        "alone is larger).",
    )
    max_exports: int = Field(
        default=4,
        ge=1,
        description="Exports under way at once, all tables together (each writes a table-size "
        "file; a streamed one keeps its scratch copy until its client has taken it); one more "
        "answers 503 with Retry-After before it copies anything.",
    )
    max_connections: int = Field(
        default=1000,
        ge=1,
        description="Open connections at most; one more is answered 503 and closed.",
    )
    max_pipelined: int = Field(
        default=64,
        ge=1,
        description="Requests one connection may send ahead of their answers (pipelined; "
        "each held costs about 1 KB); one more is refused with 400 once those before it are "
        "answered, and the connection closed.",
    )


@dataclass(frozen=True)
class Limits:
    """What the HTTP layer (:mod:`tdreplay.service.server`) holds each connection to."""

    max_body_bytes: int
    max_header_bytes: int
    header_timeout: float
    body_timeout: float
    max_connections: int
    max_pipelined: int
    send_timeout: float
    max_receiving_bytes: int

    @classmethod
    def from_settings(cls, settings: LimitSettings) -> Limits:
        return cls(
            max_body_bytes=settings.max_body_bytes,
            max_header_bytes=settings.max_header_bytes,
            header_timeout=settings.header_timeout,
            body_timeout=settings.body_timeout,
            max_connections=settings.max_connections,
            max_pipelined=settings.max_pipelined,
            send_timeout=settings.send_timeout,
            max_receiving_bytes=settings.max_receiving_bytes,
        )


class Receiving:
    """Bytes of request bodies the server holds, all connections of one server together
    (``--max-receiving-bytes``): the bodies being received, and the rows of the calls a
    rate limiter holds back (:class:`Hold`), which keep their bodies while they wait.
    Counted on the event loop only.

        >>> receiving = Receiving(100)
        >>> with receiving.hold(60):
        ...     receiving.held
        60
        >>> receiving.held
        0
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: bytes counted now (each body or waiting call gives back what it took when done)
        self.held = 0

    def take(self, n: int, mine: int = 0) -> None:
        """Count ``n`` more bytes of a body of which ``mine`` are counted already.

        Raises:
            PayloadTooLarge: that body alone would pass the limit.
            BackendError: it would, with the bodies held now (503: retry later).
        """
        cap = self.limit
        if self.held + n <= cap:
            self.held += n
            return
        if mine + n > cap:
            raise PayloadTooLarge(
                f"request body of {mine + n}+ bytes exceeds the {cap} bytes all bodies the "
                "server holds may take together (--max-receiving-bytes)",
                field="body",
                expected=f"<= {cap} bytes",
                got=mine + n,
            )
        raise BackendError(
            f"the server holds {self.held} bytes of request bodies (being received, or waiting "
            f"for a rate limiter); {n} more would pass its limit of {cap} "
            "(--max-receiving-bytes); retry later",
            field="body",
            expected=f"<= {cap - self.held} bytes",
            got=n,
        )

    def give(self, n: int) -> None:
        """Give back ``n`` bytes taken by :meth:`take` (the body is done with)."""
        self.held -= n

    def hold(self, nbytes: int) -> Hold:
        """The count of one call's ``nbytes`` of rows, for each of its waits to enter."""
        return Hold(self, nbytes)


class Hold:
    """One call's rows, counted in :class:`Receiving` while the call waits for a rate limiter.

    Each wait enters it; the rows count from the first wait's start to the last one's end,
    once: an insert that waits in several tables at once holds one body.

    Raises:
        PayloadTooLarge, BackendError: on entering, as :meth:`Receiving.take` (the call
            does not wait).
    """

    def __init__(self, receiving: Receiving, nbytes: int) -> None:
        self.receiving = receiving
        self.nbytes = nbytes
        self._waits = 0

    def __enter__(self) -> None:
        if not self._waits:
            self.receiving.take(self.nbytes)
        self._waits += 1

    def __exit__(self, *exc: object) -> None:
        self._waits -= 1
        if not self._waits:
            self.receiving.give(self.nbytes)


#: the ``Retry-After`` of an export refused by ``--max-exports``, in seconds
EXPORT_RETRY_AFTER = 5


class Exports:
    """Exports under way, all tables of one server together (``--max-exports``): each
    writes a table-size file, and a streamed one keeps its scratch copy until its answer
    has been sent, so the count is what bounds those copies. Thread-safe: the answer's
    cleanup gives its slot back from a worker thread.

        >>> exports = Exports(1)
        >>> slot = exports.take("t")
        >>> exports.take("u")
        Traceback (most recent call last):
        ...
        tdreplay.codec.errors.BackendError: table 'u': 1 exports are under way, the server's limit (--max-exports); retry later
        >>> slot.give(); slot.give()  # once only, however often called
        >>> exports.running
        0
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        #: exports counted now (each gives its slot back when its file is done with)
        self.running = 0
        self._lock = threading.Lock()

    def take(self, table: str) -> ExportSlot:
        """Count one more export of ``table``; give the slot back once its file is gone
        or kept (:meth:`ExportSlot.give`).

        Raises:
            BackendError: ``--max-exports`` are under way (503 with ``Retry-After``: retry
                later); nothing was copied.
        """
        with self._lock:
            if self.running >= self.limit:
                err = BackendError(
                    f"table {table!r}: {self.running} exports are under way, the server's "
                    "limit (--max-exports); retry later",
                    table=table,
                    field="exports",
                    expected=f"<= {self.limit} exports at once",
                )
                err.retry_after = EXPORT_RETRY_AFTER
                raise err
            self.running += 1
        return ExportSlot(self)

    def _give(self) -> None:
        with self._lock:
            self.running -= 1


class ExportSlot:
    """One export counted in :class:`Exports`, given back once (:meth:`give`)."""

    def __init__(self, exports: Exports) -> None:
        self._exports: Exports | None = exports

    def give(self) -> None:
        """Give the slot back; a second call does nothing."""
        exports, self._exports = self._exports, None
        if exports is not None:
            exports._give()
