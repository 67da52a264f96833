"""The client/server contract in one place: routes, media types, headers, errors.

Bulk data travels as Arrow IPC streams (:mod:`tdreplay.codec.arrow`); control
messages and errors as JSON. An error body is
``{"type": <error class>, "detail": <message>, "field": <key or null>, ...}``
and ``type`` names one of :data:`ERROR_STATUS`'s classes, which the client
raises under the same name. (A path that is no route at all, or a method a
route does not take, answers 404 / 405 with ``type`` ``InvalidRequest``.)

Routes (``{name}``: a table; every data route is named like the storage API)::

    GET    /healthz                               liveness (never needs the token)
    GET    /readyz                                readiness: tables loaded (never needs the token)
    GET    /metrics                               Prometheus text format
    GET    /v1/info                               {"version": ..., "shm": {"socket": path, "host": id} | null}
                                                  the same-host transport (tdreplay.codec.shm), if it runs
    GET    /v1/tables                             {"tables": [info, ...]}
    POST   /v1/tables                             JSON TableSpec -> 201 info
    GET    /v1/tables/{name}                      info: size, capacity, backend, sampler, counters, limiter
    DELETE /v1/tables/{name}                      204
    POST   /v1/tables/{name}/extend               Arrow IPC body (one record batch); ?timeout=SECONDS
                                                  header X-Request-Id makes a retry idempotent
                                                  -> JSON {"index": [...], "rows": K}: each row's
                                                  slot (-1: dropped by a max_value table), K written
    POST   /v1/tables/{name}/sample               ?batch_size=N&timeout=SECONDS
                                                  -> Arrow IPC: fields + index + sample_info.*
    POST   /v1/tables/{name}/stream               ?batch_size=N&count=M&timeout=SECONDS
                                                  -> chunked Arrow IPC stream, one record batch per sample;
                                                  count omitted: until the client hangs up. A stream
                                                  ends early (fewer batches, clean end of stream) when
                                                  a later sample times out or the table goes away
    POST   /v1/tables/{name}/update_priority      JSON {"index": [...], "priority": [...], "key": [...]}
                                                  key optional (sample_info.key, one per index): only
                                                  slots still holding that item are updated
                                                  -> JSON {"updated": K} (priorities applied)
    POST   /v1/tables/{name}/checkpoint           JSON {"path": "relative/to/root"} -> {"path": ...}
                                                  path omitted: checkpoints/{name}
    POST   /v1/tables/{name}/restore              JSON {"path": "relative/to/root"} -> info
                                                  (the checkpoint must be of table {name}; it replaces
                                                  the table, or creates it)
    POST   /v1/tables/{name}/export               JSON {"format": "parquet"|"csv", "path": optional}
                                                  path given: written under the data root -> {"path": ...}
                                                  no path: the file streamed back

The docs: ``GET /docs`` (Swagger UI) and ``GET /openapi.json``.

Sampled batches carry, beside the table's fields, ``index`` (int64),
``sample_info.priority`` (float32), ``sample_info.weight`` (float32),
``sample_info.times_sampled`` (int64) and ``sample_info.key`` (int64: the
item's ordinal, 1 for the table's first item, unique for the table's life; sent back with the index to
update_priority, it makes the update skip slots overwritten since the sample).
A prioritized table's batches carry ``sample_info.max_weight`` (float64) too
(:data:`MAX_WEIGHT`): the largest weight the table could give when the item was
drawn, ``(N * P_min)^-beta``, which ``weight`` (``(N * P(i))^-beta``) was divided
by. A client sharding a table over several servers needs it to normalise every
server's weights by the largest of all (TorchRL's weights over the union).

With a token configured, every route but ``/healthz`` and ``/readyz`` needs
``Authorization: Bearer <token>``. Paths in checkpoint, restore and export
bodies are relative to the server's data root and may not leave it (400).
"""

from __future__ import annotations

import operator
from typing import Any

from .errors import ANSWERS, InvalidRequest, TableNotFound

ARROW_STREAM = "application/vnd.apache.arrow.stream"
JSON = "application/json"
PARQUET = "application/vnd.apache.parquet"
CSV = "text/csv"
#: samplers that hand out each item once (a table of one is a queue: a sample takes items)
CONSUMING = frozenset({"fifo", "lifo"})
#: export format -> media type of the streamed file
EXPORT_MEDIA = {"parquet": PARQUET, "csv": CSV}
#: response headers of a streamed export (a written one answers them as JSON fields
#: ``rows`` / ``skipped``): the rows in the file, and the rows live when it began but
#: overwritten or removed before they were read (left out)
EXPORT_ROWS = "X-Export-Rows"
EXPORT_SKIPPED = "X-Export-Skipped"
#: a table's checkpoint as one archive (dump / load; :mod:`tdreplay.codec.archive`)
TAR = "application/x-tar"

API = "/v1"
TABLES = f"{API}/tables"
#: characters of a table's name at most: a spec's name, a route's ``{name}``, a parameter
#: naming a table (the storage's name rule, :mod:`tdreplay.storage.names`, is built on it)
MAX_TABLE_NAME = 64


def table_path(name: str, action: str = "") -> str:
    """``/v1/tables/{name}`` or ``/v1/tables/{name}/{action}``."""
    return f"{TABLES}/{name}" + (f"/{action}" if action else "")


#: the sample-info column of a prioritized table's batches: what each item's ``weight``
#: was divided by, the largest weight the table could give when the item was drawn
MAX_WEIGHT = ("sample_info", "max_weight")

#: header carrying a client-chosen id that makes an extend idempotent
REQUEST_ID = "X-Request-Id"
#: response header: the rows an extend wrote (comma-free count)
ROWS_WRITTEN = "X-Rows-Written"


def rows_written(index: Any) -> int:
    """The rows an extend's answer (the slot of each row, -1 for a row a ``max_value``
    table dropped) says were written."""
    return int((index >= 0).sum())


def note_written(err: BaseException, written: int, table: str) -> None:
    """Note on ``err`` how many rows an import wrote before it (they stay written): the
    one wording of every door, which the CLI prints."""
    err.add_note(f"{written} rows were written into table {table!r} before it")


#: rows per extend of an import (Parquet or Minari, every door) unless the caller gives another
IMPORT_CHUNK = 4096


def import_chunk(chunk: Any, table: str | None = None) -> int:
    """``chunk`` (rows per extend of an import) if it is an integer >= 1: the one check of
    every door (``Table.import_parquet``, the clients' imports, ``tdreplay import --chunk``).

        >>> import_chunk(64)
        64
        >>> import_chunk(0, "t")
        Traceback (most recent call last):
        ...
        tdreplay.codec.errors.InvalidRequest: table 't': chunk must be an integer >= 1, got 0

    Raises:
        InvalidRequest: ``chunk`` is not an integer (a bool neither), or is below 1.
    """
    return _at_least_one(chunk, "chunk", table)


#: bytes of a file's values an import reads at a time (fewer rows than the chunk for wide ones)
READ_BYTES = 32 << 20

#: the most bytes one compressed unit of an imported file (a Parquet row group's largest
#: pages, one per column read; a Minari dataset's Arrow record batch: each decompressed whole)
#: may decompress to, unless the import gives another
MAX_BATCH_BYTES = 32 << 20


def import_batch_bytes(value: Any, table: str | None = None) -> int:
    """``max_batch_bytes`` (an import's bound on a compressed unit of a file) if it is an
    integer >= 1: the one check of every door (``Table.import_parquet``, the clients'
    ``import_parquet`` and ``import_dataset``, ``tdreplay import --max-batch-bytes``).

        >>> import_batch_bytes(1 << 20)
        1048576
        >>> import_batch_bytes(0)
        Traceback (most recent call last):
        ...
        tdreplay.codec.errors.InvalidRequest: max_batch_bytes must be an integer >= 1, got 0

    Raises:
        InvalidRequest: ``value`` is not an integer (a bool neither), or is below 1.
    """
    return _at_least_one(value, "max_batch_bytes", table)


def _at_least_one(value: Any, field: str, table: str | None) -> int:
    """``value`` as an integer >= 1 (a bool is none), else the import setting ``field``'s
    :class:`InvalidRequest`."""
    n = _index(value)
    if n is None or n < 1:
        raise InvalidRequest(
            f"{f'table {table!r}: ' if table else ''}{field} must be an integer >= 1, "
            f"got {value!r:.40}",
            table=table,
            field=field,
            expected=">= 1",
            got=value,
        )
    return n


def over_batch_bytes(limit: int) -> str:
    """The one wording of a compressed unit refused for decompressing past ``limit``.

    >>> over_batch_bytes(1024)
    'more than max_batch_bytes=1024 (tdreplay import --max-batch-bytes) allows'
    """
    return f"more than max_batch_bytes={limit} (tdreplay import --max-batch-bytes) allows"


def _index(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)  # numpy's ints too
    except TypeError:
        return None


def import_rows(chunk: Any, capacity: int, table: str | None = None) -> int:
    """Rows per extend of an import (Parquet or Minari, either door): ``chunk``
    (:func:`import_chunk`), at most the table's capacity, which is the most one extend
    holds (a larger chunk failed the import of any file longer than a small table, where a
    table keeps the newest rows).

    >>> import_rows(4096, 100), import_rows(64, 100)
    (100, 64)

    Raises:
        InvalidRequest: ``chunk`` is not an integer >= 1.
    """
    return min(import_chunk(chunk, table), capacity)


#: response header on an extend answered from the X-Request-Id memory ("true"): nothing was inserted
IDEMPOTENT_REPLAY = "X-Idempotent-Replay"

#: folder under the data root where checkpoints go by default (``checkpoints/{name}``)
CHECKPOINTS = "checkpoints"

#: error ``type`` -> HTTP status; the service answers with these, the client maps back
#: (each class of :mod:`tdreplay.codec.errors` carries its own: this is a view of them)
ERROR_STATUS: dict[str, int] = {name: cls.status for name, cls in ANSWERS.items()}


def not_found(name: str) -> TableNotFound:
    """The error for ``name``; one longer than any table's name is quoted cut short, once
    (a same-host frame may name a table in megabytes)."""
    if len(name) > MAX_TABLE_NAME:
        return TableNotFound(
            f"no table {name[:MAX_TABLE_NAME]!r}... ({len(name)} characters; a table's name has "
            f"at most {MAX_TABLE_NAME})",
            field="name",
        )
    return TableNotFound(f"no table {name!r}", table=name, field="name", got=name)
