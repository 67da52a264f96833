"""Import a Parquet dataset into a table (see :mod:`tdreplay.storage.export` for the layout).

Import takes Parquet only: a file, or a folder of ``*.parquet`` / ``*.pq``
files (names starting with ``_`` or ``.`` are skipped). Which columns a file
must and may have, and which dtype casts are allowed, is the import policy of
:mod:`tdreplay.codec.parquet_import`, which the client's import follows too;
the files are read by :mod:`tdreplay.codec.parquet_read`, the client's reader
as well. This module only extends the table with the rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from tdreplay.codec.parquet_import import refused_values
from tdreplay.codec.parquet_read import parquet_files, read_parquet
from tdreplay.codec.protocol import (
    IMPORT_CHUNK,
    MAX_BATCH_BYTES,
    import_rows,
    note_written,
    rows_written,
)

from .export import progress_bar
from .spec import join_key

if TYPE_CHECKING:
    from .consumers import Importable as Table


def import_parquet(
    table: Table,
    path: str | Path,
    *,
    columns: Mapping[str, str] | None = None,
    ignore_extra: bool = False,
    chunk: int = IMPORT_CHUNK,
    progress: bool | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> int:
    """Extend ``table`` with the rows of a Parquet file, or of a folder of Parquet files.

    Every file's schema is checked first, and every file's columns are read through
    once to check their values (nulls, list lengths, floats rounded into a narrower
    field, and what an extend checks: categories, the max-value key; the file's
    statistics are not trusted to spare any of it); a mismatch anywhere raises before
    any row is written. Rows are then read
    ``chunk`` at a time and extended like :meth:`Table.extend` (waiting on the
    rate limiter as it does), files in name order.

    Args:
        table: the table to extend.
        path: a ``.parquet`` file, or a folder searched recursively for
            ``*.parquet`` / ``*.pq`` (names starting with ``_`` or ``.`` skipped).
        columns: ``{field: column}`` for fields not read from the column of their own
            dotted name (a struct column's child is named by its dotted path).
        ignore_extra: skip the columns no field reads (refused by default).
        chunk: rows per extend (at most the table's capacity).
        progress: show a progress bar; ``None`` shows one for large imports when
            stderr is a terminal.
        max_batch_bytes: the most bytes a row group's largest pages, one per column read,
            may decompress to together (pyarrow decompresses a page whole; default 32 MiB);
            a file holding a larger row group is refused before any page is decompressed.

    Returns:
        The number of items written (fewer than the rows read only with the
        max-value writer, which drops items below the table's minimum).

    Raises:
        SchemaError: a field's column is missing, a column is extra (unless
            ``ignore_extra``), of another shape, of a dtype the policy does not cast to
            the field's, holds nulls, a list of the wrong length, a value beyond a
            narrower float field's range (:mod:`tdreplay.codec.parquet_import`), or a
            value an extend refuses (outside a field's ``n`` categories, NaN in the
            max-value key); the error names the column, the field and the file.
            Nothing is written (also where the file's statistics hide the value).
        InvalidRequest: ``chunk`` or ``max_batch_bytes`` < 1, ``path`` holds no readable
            Parquet file, or a row group's pages decompress past ``max_batch_bytes``
            (:mod:`tdreplay.codec.parquet_pages`).
        RateLimitTimeout, BackendError: as :meth:`Table.extend` (rows of earlier
            chunks stay written; the note says how many).
    """
    fields = {join_key(k): v for k, v in table.spec.torch_schema().items()}
    total, batches = read_parquet(
        table.name,
        fields,
        parquet_files(table.name, path),
        columns,
        ignore_extra=ignore_extra,
        chunk=import_rows(chunk, table.capacity, table.name),
        refused=refused_values(
            {k: f.model_dump() for k, f in table.spec.fields.items()},
            table.spec.writer.model_dump(),
        ),
        max_batch_bytes=max_batch_bytes,
    )
    written = 0
    try:
        with progress_bar(progress, total, table.spec.item_nbytes, f"import {table.name}") as bar:
            for batch in batches:
                written += rows_written(table.extend(batch))
                bar.update(len(batch))
    except Exception as err:
        note_written(err, written, table.name)
        raise
    return written
