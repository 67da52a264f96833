"""Errors raised by tdreplay tables: the one hierarchy of :mod:`tdreplay.codec.errors`.

A table raises the same classes the server answers with (each carries its
HTTP status) and the client raises again; only :class:`RootLocked`, which no
request can meet, is the storage's own. See :mod:`tdreplay.codec.errors` for
the tree.
"""

from __future__ import annotations

from tdreplay.codec.errors import (
    BackendError,
    CheckpointError,
    EmptyTableError,
    InsufficientStorage,
    InvalidCheckpoint,
    InvalidRequest,
    PathExists,
    RateLimitTimeout,
    SchemaError,
    TableClosed,
    TableExists,
    TableLost,
    TableNotFound,
    TDReplayError,
)

__all__ = [
    "BackendError",
    "CheckpointError",
    "EmptyTableError",
    "InsufficientStorage",
    "InvalidCheckpoint",
    "InvalidRequest",
    "PathExists",
    "RateLimitTimeout",
    "RootLocked",
    "SchemaError",
    "TDReplayError",
    "TableClosed",
    "TableExists",
    "TableLost",
    "TableNotFound",
]


class RootLocked(TDReplayError):
    """The data root is locked by another process (see :func:`~tdreplay.storage.rootlock.lock_root`).

    Attributes:
        root: the data root.
        pid: the holder's process id, or ``None`` when it could not be read.
    """

    status = 409

    def __init__(self, message: str, *, root: str, pid: int | None) -> None:
        super().__init__(message, field="root", got=root)
        self.root = root
        self.pid = pid
