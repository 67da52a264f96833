"""How the columns of a Parquet file become the fields of a table, for :mod:`~tdreplay.storage.importer`.

:func:`plan_columns` matches a file's columns (struct columns flattened to
dotted names by :mod:`tdreplay.codec.parquet_columns`) to the table's fields and checks each before any row is read:
its dtype must cast losslessly into the field's (``int32 -> int64``,
``float32 -> float64``; never ``float64 -> float32``), its list nesting must
spell the field's shape (or hold all its elements in one flat list), and it
must be free of nulls, which the file's statistics prove or a scan checks
(:attr:`Column.scan`). :func:`to_fixed_lists` then turns a column's data into
nested fixed-size lists of the field's shape, refusing nulls and lists of the
wrong length. Every problem is a :class:`~tdreplay.storage.SchemaError`
naming the column and the file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from tdreplay.codec.arrow import META_DTYPE, META_SHAPE
from tdreplay.codec.dtypes import ARROW, NAMES, TORCH
from tdreplay.codec.parquet_columns import leaf_columns

from .errors import SchemaError
from .spec import NestedKey, join_key

if TYPE_CHECKING:
    from .consumers import Named as Table


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
#: Arrow type -> the dtype its values have: the schema's dtypes (bfloat16 travels as uint16
#: bits, told apart by the field's metadata) and the unsigned types other tools write
_ARROW_DTYPE: dict[pa.DataType, str] = {
    ARROW[dtype]: name for name, dtype in TORCH.items() if name != "bfloat16"
} | {pa.uint16(): "uint16", pa.uint32(): "uint32", pa.uint64(): "uint64"}


@dataclass
class Column:
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


def plan_columns(table: Table, pf: pq.ParquetFile, source: Path) -> list[Column]:
    """Check a file's schema against the table's; say how each column is read."""
    found: dict[str, tuple[pa.Field, int, str]] = {}
    for c in leaf_columns(pf.schema_arrow):
        if c.name in found:
            raise schema_error(table, source, c.name, "appears twice")
        found[c.name] = (c.field, c.leaf, c.top)
    schema = table.spec.torch_schema()
    wanted = {join_key(k): k for k in schema}
    for name in wanted:
        if name not in found:
            raise schema_error(table, source, name, "is missing", expected="present", got="missing")
    for name in found:
        if name not in wanted and not name.startswith("__index_level_"):  # a pandas index
            raise schema_error(
                table, source, name, "is not a field of the table", expected="absent", got="present"
            )
    plan = []
    for name, key in wanted.items():
        f, leaf, top = found[name]
        shape, dtype = schema[key]
        sizes, variable = _check_column(table, source, name, f, shape, dtype)
        scan = variable or not _null_free(pf, leaf)
        plan.append(Column(key, name, top, f, shape, dtype, sizes, scan))
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
    want = NAMES[dtype]
    if META_DTYPE in meta:
        src = meta[META_DTYPE].decode(errors="replace")
        if src not in TORCH or ARROW[TORCH[src]] != t:
            raise schema_error(
                table, source, name, f"has Arrow type {t} but metadata dtype {src!r}", want, src
            )
    elif t in _ARROW_DTYPE:
        src = _ARROW_DTYPE[t]
    else:
        raise schema_error(table, source, name, f"has unsupported Arrow type {f.type}", want, t)
    if want not in _LOSSLESS[src]:
        raise schema_error(
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
        raise schema_error(table, source, name, f"has {got}, expected shape {shape}", shape, got)
    return sizes, None in levels


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


def schema_error(
    table: Table, source: Path, name: str, what: str, expected: Any = None, got: Any = None
) -> SchemaError:
    return SchemaError(
        f"table {table.name!r}: column {name!r} of {str(source)!r} {what}",
        table=table.name,
        field=name,
        expected=expected,
        got=got,
    )


def to_fixed_lists(
    table: Table, source: Path, c: Column, arr: pa.Array, first: int = 0
) -> pa.Array:
    """``arr`` (rows ``first...`` of the file) as nested fixed-size lists of ``c.sizes``.

    Raises:
        SchemaError: a value is null, or a list has the wrong length.
    """

    def fix(a: pa.Array, sizes: list[int], per_row: int) -> pa.Array:
        if a.null_count:
            nulls = f"{a.null_count} null value{'s' if a.null_count > 1 else ''}"
            raise schema_error(table, source, c.name, f"holds {nulls}", "no nulls", nulls)
        if not sizes:
            return pc.cast(a, pa.int64()) if a.type == pa.uint32() else a
        size = sizes[0]
        if not pa.types.is_fixed_size_list(a.type):
            lengths = pc.list_value_length(a).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(lengths != size)
            if len(bad):
                i = int(bad[0])
                raise schema_error(
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
