"""tdreplay.storage: replay tables on tensordict storages.

    >>> from tdreplay.storage import Table, TableSpec

See :class:`Table` for the API and :class:`TableSpec` for the schema format.
This package knows nothing of HTTP; the service and the client build on it
and on :mod:`tdreplay.codec`.
"""

from .errors import (
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
    TableNotFound,
    TDReplayError,
)
from .rate_limiter import RateLimiter
from .spec import DTYPES, FieldSpec, TableSpec, json_schema
from .table import Table

__all__ = [
    "DTYPES",
    "BackendError",
    "CheckpointError",
    "EmptyTableError",
    "InsufficientStorage",
    "InvalidCheckpoint",
    "FieldSpec",
    "InvalidRequest",
    "PathExists",
    "RateLimitTimeout",
    "RateLimiter",
    "SchemaError",
    "TDReplayError",
    "Table",
    "TableClosed",
    "TableExists",
    "TableNotFound",
    "TableSpec",
    "json_schema",
]
