"""Errors raised by tdreplay tables.

Every error a table raises derives from :class:`TDReplayError`; the service maps
each class to one HTTP status in a single place, and the client maps the status
back to the same-named class. The tree::

    TDReplayError
    ├── SchemaError            bad schema file, or data that does not match the schema
    ├── InvalidRequest         a bad argument (batch size, index, path, ...)
    ├── TableNotFound          no table of that name
    ├── TableExists            a table of that name already exists
    ├── TableClosed            the table was closed (deleted, replaced, server stopping)
    ├── PathExists             a checkpoint/export path holds something that is not ours to replace
    ├── RateLimitTimeout       a rate-limited call waited past its timeout
    ├── EmptyTableError        nothing to sample (reserved: no table raises it yet)
    ├── CheckpointError        a checkpoint could not be written or read
    │   └── InvalidCheckpoint  damaged, unsupported, or unsafe to load (refused, nothing ran)
    ├── InsufficientStorage    disk full, or a table over the byte limits
    ├── RootLocked             the data root is in use by another process
    └── BackendError           the storage backend failed (disk, redis, ...)
        └── TableLost          the backend lost the table's data (Redis restarted empty, flushed)

Errors carry the offending ``table``, ``field``, ``expected`` and ``got``
values where they apply, and quote them in their message.
"""

from __future__ import annotations

from typing import Any


class TDReplayError(Exception):
    """Base class of every tdreplay error.

    Args:
        message: what went wrong, quoting the bad value.
        table: the table involved, if any.
        field: the field (dotted nested key) involved, if any.
        expected: what was expected, if it applies.
        got: what came instead, if it applies.
    """

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        field: str | None = None,
        expected: Any = None,
        got: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.table = table
        self.field = field
        self.expected = expected
        self.got = got

    def to_dict(self) -> dict[str, Any]:
        """The JSON form used on the wire: ``{"type", "detail", "field", ...}``."""
        out: dict[str, Any] = {
            "type": type(self).__name__,
            "detail": self.message,
            "field": self.field,
        }
        if self.table is not None:
            out["table"] = self.table
        if self.expected is not None:
            out["expected"] = str(self.expected)
        if self.got is not None:
            out["got"] = str(self.got)
        return out


class SchemaError(TDReplayError, ValueError):
    """A schema is malformed, or data does not match a table's schema."""


class InvalidRequest(TDReplayError, ValueError):
    """An argument is out of range or malformed (batch size, index, path, ...)."""


class TableNotFound(TDReplayError, KeyError):
    """No table of that name exists."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class TableExists(TDReplayError):
    """A table of that name already exists."""


class TableClosed(TDReplayError):
    """The table was closed (deleted, replaced by a restore, or the server is stopping): its
    storage handles are gone, so a call fails instead of reading or writing garbage. A call
    that was waiting when the table closed raises this too."""


class PathExists(TDReplayError):
    """A path to write (checkpoint, export) holds something tdreplay will not replace."""


class RateLimitTimeout(TDReplayError, TimeoutError):
    """A call held back by the rate limiter waited past its timeout."""


class EmptyTableError(TDReplayError):
    """The table holds no item a sampler may return."""


class CheckpointError(TDReplayError):
    """A checkpoint could not be written, or a checkpoint folder is unreadable."""


class InvalidCheckpoint(CheckpointError):
    """A checkpoint folder is damaged, of an unsupported format, or holds something unsafe to load."""


class InsufficientStorage(TDReplayError):
    """No room: the disk is full, or a table would exceed the server's byte limits."""


class RootLocked(TDReplayError):
    """The data root is locked by another process (see :func:`~tdreplay.storage.rootlock.lock_root`).

    Attributes:
        root: the data root.
        pid: the holder's process id, or ``None`` when it could not be read.
    """

    def __init__(self, message: str, *, root: str, pid: int | None) -> None:
        super().__init__(message, field="root", got=root)
        self.root = root
        self.pid = pid


class BackendError(TDReplayError):
    """The storage backend (disk, HDF5, Redis, ...) failed."""


class TableLost(BackendError):
    """The backend no longer holds the table's data (a Redis restarted without persistence, or
    flushed): every extend and sample fails with this, never with zeros, until the table is
    restored from a checkpoint or deleted and created again."""
