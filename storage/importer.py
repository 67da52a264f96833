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
import itertools
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from tdreplay.codec import CodecError, from_column
from tdreplay.codec.arrow import META_DTYPE, META_SHAPE, SEP

from .errors import InvalidRequest, SchemaError
from .export import progress_bar
from .spec import DTYPE_NAMES, DTYPES, NestedKey, join_key
from .tensordicts import nest

if TYPE_CHECKING:
    from .table import Table

log = logging.getLogger(__name__)


# dtype -> the dtypes every one of its values is exactly representable in
_LOSSLESS: dict[str, set[str]] = {
    "bool": {"bool", "uint8", "int8", "int16", "int32", "int64"}
    | {"float16", "bfloat16", "float32", "float64"},
    "uint8": {"uint8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "int8": {"int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"},
    "uint16": {"int32", "int64", "float32", "float64"},
    "int16": {"int16", "int32", "int64", "float32", "float64"},
    "uint32": {"int64", "float64"},
    "int32": {"int32", "int64", "float64"},
    "uint64": set(),
    "int64": {"int64"},
    "float16": {"float16", "float32", "float64"},
    "bfloat16": {"bfloat16", "float32", "float64"},
    "float32": {"float32", "float64"},
    "float64": {"float64"},
}
_ARROW_DTYPE: dict[pa.DataType, str] = {
    pa.bool_(): "bool",
    pa.uint8(): "uint8",
    pa.int8(): "int8",
    pa.uint16(): "uint16",
    pa.int16(): "int16",
    pa.uint32(): "uint32",
    pa.int32(): "int32",
    pa.uint64(): "uint64",
    pa.int64(): "int64",
    pa.float16(): "float16",
    pa.float32(): "float32",
    pa.float64(): "float64",
}


# ------------------------------------------------------------------ import
@dataclass
class _Column:
    """How one Parquet column becomes one field of the table."""

    key: NestedKey
    name: str
    #: the file's top-level column that holds it (``name`` itself unless a struct column does)
    top: str
    field: pa.Field
    shape: list[int]
    dtype: torch.dtype
    #: the list size expected at each nesting level (outermost first)
    sizes: list[int]
    #: data must be read to check it: variable-size lists, or nulls not ruled out
    scan: bool


def import_parquet(
    table: Table, path: str | Path, *, chunk: int = 4096, progress: bool | None = None
) -> int:
    """Extend ``table`` with the rows of a Parquet file, or of a folder of Parquet files.

    Every file's schema is checked first, and files whose columns need it
    (variable-size lists, nullable columns not proven null-free by the file's
    statistics) are read through once more to check list lengths and nulls;
    a mismatch anywhere raises before any row is written. Rows are then read
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
            does not cast losslessly to the field's, holds nulls, or a list of the
            wrong length; the error names the column and the file. Nothing is written.
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
            plan = _plan(table, pf, f)
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


def _leaves(schema: pa.Schema) -> Iterator[tuple[str, pa.Field, int, str]]:
    """``(dotted name, field, Parquet leaf column, top-level column)``, struct columns flattened."""
    leaf = itertools.count()

    def walk(name: str, f: pa.Field, top: str) -> Iterator[tuple[str, pa.Field, int, str]]:
        if pa.types.is_struct(f.type):
            for child in f.type:
                yield from walk(f"{name}{SEP}{child.name}", child, top)
        else:
            first = next(leaf)
            for _ in range(_n_leaves(f.type) - 1):
                next(leaf)
            yield name, f, first, top

    for f in schema:
        yield from walk(f.name, f, f.name)


def _n_leaves(t: pa.DataType) -> int:
    if t.num_fields == 0:
        return 1
    return sum(_n_leaves(t.field(i).type) for i in range(t.num_fields))


def _plan(table: Table, pf: pq.ParquetFile, source: Path) -> list[_Column]:
    """Check a file's schema against the table's; say how each column is read."""
    found: dict[str, tuple[pa.Field, int, str]] = {}
    for name, f, leaf, top in _leaves(pf.schema_arrow):
        if name in found:
            raise _schema_error(table, source, name, "appears twice")
        found[name] = (f, leaf, top)
    schema = table.spec.torch_schema()
    wanted = {join_key(k): k for k in schema}
    for name in wanted:
        if name not in found:
            raise _schema_error(
                table, source, name, "is missing", expected="present", got="missing"
            )
    for name in found:
        if name not in wanted and not name.startswith("__index_level_"):  # a pandas index
            raise _schema_error(
                table, source, name, "is not a field of the table", expected="absent", got="present"
            )
    plan = []
    for name, key in wanted.items():
        f, leaf, top = found[name]
        shape, dtype = schema[key]
        sizes, variable = _check_column(table, source, name, f, shape, dtype)
        scan = variable or not _null_free(pf, leaf)
        plan.append(_Column(key, name, top, f, shape, dtype, sizes, scan))
    return plan


def _check_column(
    table: Table, source: Path, name: str, f: pa.Field, shape: list[int], dtype: torch.dtype
) -> tuple[list[int], bool]:
    """The list sizes column ``f`` must have for the field, and whether it has variable lists."""
    levels: list[int | None] = []  # None: a variable-size list
    t = f.type
    while True:
        if pa.types.is_fixed_size_list(t):
            levels.append(t.list_size)
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            levels.append(None)
        else:
            break
        t = t.value_type
    meta = f.metadata or {}
    want = DTYPE_NAMES[dtype]
    if META_DTYPE in meta:
        src = meta[META_DTYPE].decode(errors="replace")
        if src not in DTYPES or _arrow_type(src) != t:
            raise _schema_error(
                table, source, name, f"has Arrow type {t} but metadata dtype {src!r}", want, src
            )
    elif t in _ARROW_DTYPE:
        src = _ARROW_DTYPE[t]
    else:
        raise _schema_error(table, source, name, f"has unsupported Arrow type {f.type}", want, t)
    if want not in _LOSSLESS[src]:
        raise _schema_error(
            table,
            source,
            name,
            f"has dtype {src}, which does not cast losslessly to {want}",
            want,
            src,
        )
    sizes = _sizes(levels, shape)
    got = _levels_text(levels)
    if META_SHAPE in meta:
        try:
            declared = json.loads(meta[META_SHAPE])
        except ValueError:
            declared = meta[META_SHAPE].decode(errors="replace")
        if declared != shape:
            sizes, got = None, f"shape {declared}"
    if sizes is None:
        raise _schema_error(table, source, name, f"has {got}, expected shape {shape}", shape, got)
    return sizes, None in levels


def _arrow_type(dtype_name: str) -> pa.DataType:
    return pa.uint16() if dtype_name == "bfloat16" else pa.from_numpy_dtype(np.dtype(dtype_name))


def _sizes(levels: list[int | None], shape: list[int]) -> list[int] | None:
    """The list size each level must have for items of ``shape``, or None if none fits.

    Accepted: nesting that spells the shape (``[2][3]`` for ``[2, 3]``), one flat
    list of all elements (row-major), or a scalar column for a one-element field.
    """
    numel = math.prod(shape)
    if not levels:
        return [] if numel == 1 else None
    if len(levels) == len(shape):
        sizes = list(shape)
    elif len(levels) == 1:
        sizes = [numel]
    else:
        return None
    if any(got is not None and got != size for got, size in zip(levels, sizes, strict=True)):
        return None
    return sizes


def _levels_text(levels: list[int | None]) -> str:
    if not levels:
        return "scalar values"
    return "lists of " + "x".join("*" if n is None else str(n) for n in levels)


def _null_free(pf: pq.ParquetFile, leaf: int) -> bool:
    """Whether the file's statistics prove a column free of nulls (null or empty lists included)."""
    meta = pf.metadata
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(leaf).statistics
        if stats is None or not stats.has_null_count or stats.null_count:
            return False
    return True


def _schema_error(
    table: Table, source: Path, name: str, what: str, expected: Any = None, got: Any = None
) -> SchemaError:
    return SchemaError(
        f"table {table.name!r}: column {name!r} of {str(source)!r} {what}",
        table=table.name,
        field=name,
        expected=expected,
        got=got,
    )


def _batches(pf: pq.ParquetFile, plan: list[_Column], step: int) -> Iterator[pa.Table]:
    """Record batches of the planned columns, struct columns flattened to dotted names.

    Selecting a dotted top-level name may also select a struct's child of the
    same path; the flattened names stay unique all the same (:func:`_plan`
    checked that for the whole file), so the extra columns are harmless.
    """
    tops = {c.top for c in plan}
    columns = [n for n in pf.schema_arrow.names if n in tops]
    for rb in pf.iter_batches(batch_size=step, columns=columns):
        t = pa.Table.from_batches([rb])
        while any(pa.types.is_struct(f.type) for f in t.schema):
            t = t.flatten()
        yield t


def _prescan(
    table: Table, source: Path, pf: pq.ParquetFile, plan: list[_Column], step: int
) -> None:
    check = [c for c in plan if c.scan]
    if not check:
        return
    first = 0
    for t in _batches(pf, check, step):
        for c in check:
            _fixed(table, source, c, _one_chunk(t.column(c.name)), first)
        first += t.num_rows


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _fixed(table: Table, source: Path, c: _Column, arr: pa.Array, first: int = 0) -> pa.Array:
    """``arr`` (rows ``first...`` of the file) as nested fixed-size lists of ``c.sizes``.

    Raises:
        SchemaError: a value is null, or a list has the wrong length.
    """

    def fix(a: pa.Array, sizes: list[int], per_row: int) -> pa.Array:
        if a.null_count:
            nulls = f"{a.null_count} null value{'s' if a.null_count > 1 else ''}"
            raise _schema_error(table, source, c.name, f"holds {nulls}", "no nulls", nulls)
        if not sizes:
            return pc.cast(a, pa.int64()) if a.type == pa.uint32() else a
        size = sizes[0]
        if not pa.types.is_fixed_size_list(a.type):
            lengths = pc.list_value_length(a).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(lengths != size)
            if len(bad):
                i = int(bad[0])
                raise _schema_error(
                    table,
                    source,
                    c.name,
                    f"row {first + i // per_row} holds a list of {lengths[i]} values, expected {size}",
                    size,
                    int(lengths[i]),
                )
        inner = fix(a.flatten(), sizes[1:], per_row * size)
        return pa.FixedSizeListArray.from_arrays(inner, size)

    return fix(arr, c.sizes, 1)


def _decode(table: Table, source: Path, c: _Column, col: pa.ChunkedArray) -> torch.Tensor:
    arr = _fixed(table, source, c, _one_chunk(col))
    meta = {k: v for k, v in (c.field.metadata or {}).items() if k in (META_DTYPE, META_SHAPE)}
    try:
        t = from_column(pa.field(c.name, arr.type, metadata=meta or None), arr)
    except CodecError as err:  # ruled out by _plan; kept typed all the same
        raise _schema_error(table, source, c.name, str(err)) from None
    return t.reshape([len(arr), *c.shape]).to(c.dtype)
