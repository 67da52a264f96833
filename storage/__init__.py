"""tdreplay.storage: replay tables on tensordict storages.

    >>> from tdreplay.storage import Table, TableSpec

See :class:`Table` for the API and :class:`TableSpec` for the schema format.
This package knows nothing of HTTP; the service and the client build on it
and on :mod:`tdreplay.codec`. What is exported here (``__all__``) is the whole
of what the service may use (``tests/test_import_cycles.py`` holds it so):

* tables and their schema: :class:`Table`, :class:`TableSpec`,
  :class:`FieldSpec`, :data:`NestedKey`, :data:`DTYPES` (the dtype names a
  schema may use: :data:`tdreplay.codec.dtypes.TORCH`), :func:`table_nbytes`
  (what a table of a spec allocates), :func:`check_table_bytes` (that against a limit,
  :data:`MAX_TABLE_BYTES` by default), :data:`MAX_TABLE_NAME` (characters of a
  table's name at most);
* the data root: :func:`lock_root` / :class:`RootLock` (one process per
  root), :func:`stored_specs` (the tables a process left reopenable);
* checkpoints: :func:`find_checkpoint`, :func:`read_checkpoint_metadata`, :func:`checkpoint_table`,
  :func:`checkpoint_holds_other` (what a checkpoint of a table must not replace), :func:`export_checkpoint`
  (a checkpoint's items exported without a table), :func:`is_checkpoint`, :func:`is_complete_checkpoint`,
  :func:`is_checkpoint_debris`, :func:`is_reserved_checkpoint_name` and :func:`clean_checkpoints` (what
  interrupted checkpoints leave);
* Redis: :class:`RedisConnection`, :func:`resolve_redis_connection`,
  :func:`sweep_redis_keys` (the keys of redis tables a killed process left);
* disk space: :func:`free_bytes`, :func:`is_disk_full`, :func:`insufficient_storage` (the
  507 quoting the bytes free);
* sampled batches: :data:`SAMPLE_INFO_DTYPES` (the columns every sample
  carries besides the table's fields), :func:`tensordict_from_leaves`,
  :class:`SampleTarget` (buffers checked once, sampled into again and again);
* the error tree (:mod:`tdreplay.storage.errors`).
"""

from tdreplay.codec.dtypes import TORCH as DTYPES

from .backends import stored_specs
from .backends import sweep_keys as sweep_redis_keys
from .checkpoint import CheckpointPath, export_checkpoint, is_checkpoint
from .checkpoint import find as find_checkpoint
from .checkpoint import held_table as checkpoint_table
from .checkpoint import holds_other as checkpoint_holds_other
from .checkpoint import read_metadata as read_checkpoint_metadata
from .debris import clean_checkpoints
from .debris import is_complete as is_complete_checkpoint
from .debris import is_debris as is_checkpoint_debris
from .debris import is_reserved as is_reserved_checkpoint_name
from .diskspace import free_bytes, on_full_disk
from .diskspace import insufficient as insufficient_storage
from .diskspace import is_full as is_disk_full
from .errors import (
    BackendError,
    CheckpointError,
    EmptyTableError,
    InsufficientStorage,
    InvalidCheckpoint,
    InvalidRequest,
    PathExists,
    RateLimitTimeout,
    RootLocked,
    SchemaError,
    TableClosed,
    TableExists,
    TableLost,
    TableNotFound,
    TDReplayError,
)
from .names import TABLE_MAX as MAX_TABLE_NAME
from .rate_limiter import RateLimiter
from .redis_conn import RedisConnection
from .redis_conn import resolve as resolve_redis_connection
from .rootlock import RootLock, lock_root
from .sizing import MAX_TABLE_BYTES, check_table_bytes, table_nbytes
from .spec import SELF_DURABLE_BACKENDS, FieldSpec, NestedKey, TableSpec, json_schema
from .table import Table
from .tensordicts import nest as tensordict_from_leaves
from .validation import INFO_DTYPES as SAMPLE_INFO_DTYPES
from .validation import SampleTarget

__all__ = [
    "DTYPES",
    "MAX_TABLE_NAME",
    "SAMPLE_INFO_DTYPES",
    "SELF_DURABLE_BACKENDS",
    "SampleTarget",
    "BackendError",
    "CheckpointError",
    "EmptyTableError",
    "FieldSpec",
    "InsufficientStorage",
    "InvalidCheckpoint",
    "InvalidRequest",
    "NestedKey",
    "PathExists",
    "RateLimitTimeout",
    "RateLimiter",
    "RedisConnection",
    "RootLock",
    "RootLocked",
    "SchemaError",
    "TDReplayError",
    "Table",
    "TableClosed",
    "TableExists",
    "TableLost",
    "TableNotFound",
    "TableSpec",
    "clean_checkpoints",
    "CheckpointPath",
    "export_checkpoint",
    "find_checkpoint",
    "free_bytes",
    "insufficient_storage",
    "is_disk_full",
    "on_full_disk",
    "is_checkpoint",
    "is_checkpoint_debris",
    "is_reserved_checkpoint_name",
    "is_complete_checkpoint",
    "json_schema",
    "lock_root",
    "read_checkpoint_metadata",
    "checkpoint_table",
    "checkpoint_holds_other",
    "resolve_redis_connection",
    "stored_specs",
    "sweep_redis_keys",
    "table_nbytes",
    "check_table_bytes",
    "MAX_TABLE_BYTES",
    "tensordict_from_leaves",
]
