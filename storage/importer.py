"""Import a Parquet dataset into a table (see :mod:`tdreplay.storage.export` for the layout).

Import takes Parquet only: a file, or a folder of ``*.parquet`` / ``*.pq``
files (names starting with ``_`` or ``.`` are skipped). Every file's schema is
checked against the table before any row is written; columns written by other
tools (plain or nested lists, fixed-size lists, struct columns for nested
keys, no tdreplay metadata) are accepted when their shapes match and their
dtype casts losslessly into the field's (``int32 -> int64``,
``float32 -> float64``; never ``float64 -> float32``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from tdreplay.codec import CodecError, from_column
from tdreplay.codec.arrow import META_DTYPE, META_SHAPE
from tdreplay.codec.parquet_columns import flatten_structs

from .component_specs import MaxValueWriterSpec
from .errors import InvalidRequest
from .export import progress_bar
from .import_columns import Column, plan_columns, schema_error, to_fixed_lists
from .spec import NestedKey, split_key
from .tensordicts import nest

if TYPE_CHECKING:
    from .consumers import Importable as Table


def import_parquet(
    table: Table, path: str | Path, *, chunk: int = 4096, progress: bool | None = None
) -> int:
    """Extend ``table`` with the rows of a Parquet file, or of a folder of Parquet files.

    Every file's schema is checked first, and files whose columns need it
    (variable-size lists, nullable columns not proven null-free by the file's
    statistics), and those whose values an extend checks (a field declaring ``n``
    categories, the max-value writer's key), are read through once more to check
    list lengths, nulls and those values; a mismatch anywhere raises before any row
    is written. Rows are then read
    ``chunk`` at a time and extended like :meth:`Table.extend` (waiting on the
    rate limiter as it does), files in name order.

    Args:
        table: the table to extend.
        path: a ``.parquet`` file, or a folder searched recursively for
            ``*.parquet`` / ``*.pq`` (names starting with ``_`` or ``.`` skipped).
        chunk: rows per extend (at most the table's capacity).
        progress: show a progress bar; ``None`` shows one for large imports when
            stderr is a terminal.

    Returns:
        The number of items written (fewer than the rows read only with the
        max-value writer, which drops items below the table's minimum).

    Raises:
        SchemaError: a column is missing, extra, of another shape, of a dtype that
            does not cast losslessly to the field's, holds nulls, a list of the wrong
            length, or a value an extend refuses (outside a field's ``n`` categories,
            NaN in the max-value writer's key); the error names the column and the
            file. Nothing is written.
        InvalidRequest: ``chunk`` < 1, or ``path`` holds no readable Parquet file.
        RateLimitTimeout, BackendError: as :meth:`Table.extend` (rows of earlier
            chunks stay written).
    """
    if chunk < 1:
        raise InvalidRequest(
            f"table {table.name!r}: chunk must be >= 1, got {chunk}",
            table=table.name,
            field="chunk",
            expected=">= 1",
            got=chunk,
        )
    step = min(chunk, table.capacity)
    files, total = [], 0
    for f in _parquet_files(table, Path(path)):  # one open file at a time: folders can be large
        with _open(table, f) as pf:
            plan = plan_columns(table, pf, f)
            _prescan(table, f, pf, plan, step)
            total += pf.metadata.num_rows
        files.append((f, plan))
    written = 0
    with progress_bar(progress, total, table.spec.item_nbytes, f"import {table.name}") as bar:
        for f, plan in files:
            with _open(table, f) as pf:
                for rb in _batches(pf, plan, step):
                    leaves = {c.key: _decode(table, f, c, rb.column(c.name)) for c in plan}
                    written += len(table.extend(nest(leaves, rb.num_rows)))
                    bar.update(rb.num_rows)
    return written


@contextlib.contextmanager
def _open(table: Table, path: Path) -> Iterator[pq.ParquetFile]:
    try:
        pf = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as err:
        raise InvalidRequest(
            f"table {table.name!r}: {str(path)!r} is not a readable Parquet file: {err}",
            table=table.name,
            field="path",
            got=str(path),
        ) from None
    with pf:
        yield pf


def _parquet_files(table: Table, path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.suffix.lower() in (".parquet", ".pq")
            and p.is_file()
            and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
        )
        if files:
            return files
        raise InvalidRequest(
            f"table {table.name!r}: no Parquet files under {str(path)!r}",
            table=table.name,
            field="path",
            got=str(path),
        )
    raise InvalidRequest(
        f"table {table.name!r}: no such file or folder {str(path)!r}",
        table=table.name,
        field="path",
        got=str(path),
    )


def _batches(pf: pq.ParquetFile, plan: list[Column], step: int) -> Iterator[pa.Table]:
    """Record batches of the planned columns, struct columns flattened to dotted names.

    Selecting a dotted top-level name may also select a struct's child of the
    same path; the flattened names stay unique all the same (:func:`plan_columns` checked
    that for the whole file), so the extra columns are harmless.
    """
    tops = {c.top for c in plan}
    columns = [n for n in pf.schema_arrow.names if n in tops]
    for rb in pf.iter_batches(batch_size=step, columns=columns):
        yield flatten_structs(pa.Table.from_batches([rb]))


def _prescan(table: Table, source: Path, pf: pq.ParquetFile, plan: list[Column], step: int) -> None:
    """Read the columns that need it through once, checking every value: those that may
    hold nulls or lists of another length (:attr:`Column.scan`), and those whose values an
    extend refuses (:func:`_refused`), which would otherwise stop the import after the
    chunks before them went in."""
    refused = _value_checks(table)
    check = [c for c in plan if c.scan or c.key in refused]
    if not check:
        return
    first = 0
    for t in _batches(pf, check, step):
        for c in check:
            arr = to_fixed_lists(table, source, c, _one_chunk(t.column(c.name)), first)
            if c.key in refused:
                _refused(table, source, c, refused[c.key], _tensor(table, source, c, arr), first)
        first += t.num_rows


def _value_checks(table: Table) -> dict[NestedKey, int | None]:
    """The fields whose values an extend checks: ``{key: n}`` for a field declaring ``n``
    categories, ``{key: None}`` for the max-value writer's key (no NaN)."""
    checks: dict[NestedKey, int | None] = dict(table.spec.categories())
    if isinstance(table.spec.writer, MaxValueWriterSpec):
        checks[split_key(table.spec.writer.key)] = None
    return checks


def _refused(
    table: Table, source: Path, c: Column, n: int | None, values: torch.Tensor, first: int
) -> None:
    """Raise where rows ``first...`` of column ``c`` hold a value an extend refuses: one
    outside the field's ``n`` categories, or (``n`` is ``None``) NaN.

    Raises:
        SchemaError: naming the column, the file, the row and the value.
    """
    flat = values.reshape(len(values), -1)
    bad = flat.isnan() if n is None else (flat < 0) | (flat >= n)
    rows = bad.any(1).nonzero()
    if not len(rows):
        return
    i = int(rows[0])
    got: int | str
    if n is None:
        what, expected, got = "NaN; the max_value writer ranks items by it", "a number", "nan"
    else:
        got = int(flat[i][bad[i]][0])
        what, expected = f"{got}, outside its {n} categories 0 .. {n - 1}", f"0 .. {n - 1}"
    raise schema_error(table, source, c.name, f"row {first + i} holds {what}", expected, got)


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _decode(table: Table, source: Path, c: Column, col: pa.ChunkedArray) -> torch.Tensor:
    return _tensor(table, source, c, to_fixed_lists(table, source, c, _one_chunk(col)))


def _tensor(table: Table, source: Path, c: Column, arr: pa.Array) -> torch.Tensor:
    """Column ``c``'s fixed-size lists (:func:`to_fixed_lists`) as the field's tensor."""
    meta = {k: v for k, v in (c.field.metadata or {}).items() if k in (META_DTYPE, META_SHAPE)}
    try:
        t = from_column(pa.field(c.name, arr.type, metadata=meta or None), arr)
    except CodecError as err:  # ruled out by plan_columns; kept typed all the same
        raise schema_error(table, source, c.name, str(err)) from None
    return t.reshape([len(arr), *c.shape]).to(c.dtype)
