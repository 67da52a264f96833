"""What a Parquet file must and may hold to be imported into a table: the one import policy.

A table is extended from Parquet files through two doors, the table's own
``Table.import_parquet`` (in the server's process, or a script's) and the
client's ``ReplayClient.import_parquet`` / ``tdreplay import`` (the file read on
the caller's side, its rows sent as extends). Both decide here, with
:func:`plan_columns`, which column fills each field and how it is cast, and both
read the file through :mod:`.parquet_read`; so a file gets the same answer,
and a refusal the same :class:`~tdreplay.codec.errors.SchemaError` naming the
column, the field and the file, whichever door it goes through. Every check
runs before the first row is written: a refused file writes nothing.

**Columns.** Each field of the table reads one column: the one ``columns``
maps it to (``{"observation": "obs"}``, ``--map observation=obs``), else the
column of its own dotted name; a struct column's children are columns named
by their dotted path (:mod:`.parquet_columns`). A field without its column,
a mapping that names no field, and a name that is both a flat column and a
struct's child are refused. A column that no field reads is *extra*, and
extra columns are refused, all of them listed in one error, unless the caller
passes ``ignore_extra=True`` (``tdreplay import --ignore-extra``). An import
that drops data silently is the worse failure: the extra column is most
often a field under another name (``next_obs`` for ``next.observation``)
that only a mapping was missing, and a dataset imported without it looks
complete. pandas' index columns (``__index_level_0__``) are bookkeeping, not
data, and are always skipped.

**Casts.** A column's values are cast to the field's dtype when no value can
change: ``bool`` into any number, an integer into a wider integer or a
float that holds all its values (``int32 -> int64``, ``int32 -> float64``),
a float into a wider float (``float32 -> float64``). A float column into a
*narrower float* field (``float64 -> float32``: what pandas and Hugging Face
``datasets`` write for Python floats; ``float32 -> float16``) is accepted
too, each value rounded to the field's precision: the schema declares the
precision the table keeps, it is the precision the rows would have had if
they had been collected into it, and refusing the most common file there is
would only teach every user to pass an override. What rounding must not do
is turn a number into another kind of value: a finite value beyond the
field's range would become infinite, so it is refused (``holds 1e+39 in row
3, beyond float32's range``), found by reading the column once before any row
is written. The file's statistics are not taken as proof of anything: they are
the file's own word (one whose statistics said max 7.0 held 1e39). Everything else
is refused: a float into an integer or bool field (truncation), an integer
into a narrower integer (wrap-around) or a float that cannot hold it
(``int64 -> float32``), ``uint64``, strings and other non-numbers.

    >>> import pyarrow as pa, torch
    >>> fields = {"obs": ([2], torch.float32), "next.done": ([], torch.bool)}
    >>> t = pa.table({"o": pa.array([[1.0, 2.0]]), "d": [True], "note": ["x"]})
    >>> plan = plan_columns("t", fields, t.schema, "a.parquet", {"obs": "o", "next.done": "d"},
    ...                     ignore_extra=True)
    >>> [(c.field, c.column, c.cast) for c in plan]
    [('obs', 'o', 'round'), ('next.done', 'd', 'lossless')]
    >>> plan_columns("t", fields, t.schema, "a.parquet", {"obs": "o", "next.done": "d"})
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.SchemaError: table 't': column 'note' of 'a.parquet' is not a field of \
the table; map a field to it, or pass ignore_extra=True (--ignore-extra) to skip it
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import torch

from .dtypes import ARROW, NAMES, TORCH
from .errors import SchemaError
from .format import META_DTYPE, META_SHAPE, SEP
from .parquet_columns import leaf_columns, struct_children

__all__ = ["Cast", "ColumnPlan", "Fields", "cast_of", "import_error", "plan_columns"]

#: a table's fields by dotted name: ``{"next.reward": ([1], torch.float32)}``
Fields = Mapping[str, tuple[Sequence[int], torch.dtype]]
#: how a column's values become the field's: unchanged or widened, or rounded to a narrower float
Cast = Literal["lossless", "round"]

_FLOATS = {"float16", "bfloat16", "float32", "float64"}
# dtype -> the dtypes every one of its values is exactly representable in
_LOSSLESS: dict[str, set[str]] = {
    "bool": {"bool", "uint8", "int8", "int16", "int32", "int64"} | _FLOATS,
    "uint8": {"uint8", "int16", "int32", "int64"} | _FLOATS,
    "int8": {"int8", "int16", "int32", "int64"} | _FLOATS,
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
#: the leading columns pandas writes for a DataFrame's index
_PANDAS_INDEX = "__index_level_"


def cast_of(src: str, want: str) -> Cast | None:
    """How values of dtype ``src`` go into a field of dtype ``want``; ``None``: refused.

    >>> cast_of("int32", "int64"), cast_of("float64", "float32"), cast_of("int64", "int32")
    ('lossless', 'round', None)
    """
    if want in _LOSSLESS.get(src, set()):
        return "lossless"
    if src in _FLOATS and want in _FLOATS:
        return "round"
    return None


@dataclass(frozen=True)
class ColumnPlan:
    """How one Parquet column becomes one field of the table."""

    #: the field's dotted name
    field: str
    #: the field's nested key
    key: tuple[str, ...]
    #: the column's dotted name (the field's own unless mapped)
    column: str
    #: the file's top-level column that holds it (``column`` itself unless a struct does)
    top: str
    arrow: pa.Field
    shape: list[int]
    dtype: torch.dtype
    #: the list size expected at each nesting level (outermost first)
    sizes: list[int]
    cast: Cast
    #: the index of its Parquet leaf column (for the file's metadata)
    leaf: int


def refused_values(
    fields: Mapping[str, Mapping[str, Any]], writer: Mapping[str, Any]
) -> dict[str, int | None]:
    """The values an extend refuses, which an import checks before writing anything (as it
    checks nulls): ``{dotted field: n}`` for a field declaring ``n`` categories, and the
    max-value writer's key with ``None`` (no NaN). From a table's spec or its info alike.

        >>> refused_values({"a": {"n": 4}, "v": {}}, {"kind": "max_value", "key": "v"})
        {'a': 4, 'v': None}
    """
    refused: dict[str, int | None] = {k: int(f["n"]) for k, f in fields.items() if f.get("n")}
    if writer.get("kind") == "max_value":
        refused[str(writer["key"])] = None
    return refused


def plan_columns(
    table: str,
    fields: Fields,
    schema: pa.Schema,
    source: str | Path,
    columns: Mapping[str, str] | None = None,
    *,
    ignore_extra: bool = False,
) -> list[ColumnPlan]:
    """Check a file's schema against a table's fields (see the module's docstring); say
    how each field is read.

    Args:
        table: the table's name, for errors.
        fields: the table's fields by dotted name.
        schema: the file's Arrow schema.
        source: the file, for errors.
        columns: ``{field: column}`` for the fields not read from their own name.
        ignore_extra: skip the columns no field reads instead of refusing them.

    Raises:
        SchemaError: a field without its column, a mapping naming no field, a column
            name both flat and a struct's child, an extra column (unless
            ``ignore_extra``), an unsupported type or a cast the policy refuses, a
            shape that does not fit the field's.
    """
    mapping = dict(columns or {})
    for name, column in mapping.items():
        if name not in fields:
            raise SchemaError(
                f"table {table!r}: the mapping {name}={column} names no field of the table "
                f"(fields: {', '.join(fields)})",
                table=table,
                field=name,
                got=name,
            )
    found: dict[str, tuple[pa.Field, int, str]] = {}
    tops: dict[str, list[str]] = {}  # the top-level column of each leaf of that name
    for c in leaf_columns(schema):
        found[c.name] = (c.field, c.leaf, c.top)
        tops.setdefault(c.name, []).append(c.top)
    plan = []
    for name, (shape, dtype) in fields.items():
        column = mapping.get(name, name)
        if column not in found:
            raise _missing(table, schema, list(found), name, column, source)
        if len(tops[column]) > 1:
            raise import_error(table, source, column, name, _twice(column, tops[column]))
        f, leaf, top = found[column]
        plan.append(_plan_one(table, source, name, column, top, f, leaf, list(shape), dtype))
    read = {c.column for c in plan}
    extra = [n for n in found if n not in read and not n.startswith(_PANDAS_INDEX)]
    if extra and not ignore_extra:
        raise _extra(table, source, extra)
    return plan


def _plan_one(
    table: str,
    source: str | Path,
    name: str,
    column: str,
    top: str,
    f: pa.Field,
    leaf: int,
    shape: list[int],
    dtype: torch.dtype,
) -> ColumnPlan:
    levels: list[int | None] = []  # None: a variable-size list
    t = _storage(f.type)
    while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        levels.append(t.list_size if pa.types.is_fixed_size_list(t) else None)
        t = t.value_type
    meta = f.metadata or {}
    want = NAMES[dtype]

    def error(what: str, expected: Any, got: Any) -> SchemaError:
        return import_error(table, source, column, name, what, expected, got)

    if META_DTYPE in meta:
        src = meta[META_DTYPE].decode(errors="replace")
        if src not in TORCH or ARROW[TORCH[src]] != t:
            raise error(f"has Arrow type {t} but metadata dtype {src!r}", want, src)
    elif t in _ARROW_DTYPE:
        src = _ARROW_DTYPE[t]
    else:
        raise error(f"has unsupported Arrow type {f.type}, not numbers", want, str(t))
    cast = cast_of(src, want)
    if cast is None:
        raise error(
            f"has dtype {src}, which does not cast to {want} without loss (allowed: "
            "lossless casts, and float into a narrower float)",
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
        raise error(f"has {got}, expected shape {shape}", shape, got)
    key = tuple(name.split(SEP))
    return ColumnPlan(name, key, column, top, f, shape, dtype, sizes, cast, leaf)


def _twice(column: str, tops: list[str]) -> str:
    """How a leaf name appears more than once: as columns of that name, struct children."""
    flat = tops.count(column)
    kinds = (
        [f"{flat} columns of that name" if flat > 1 else "a column of that name"] if flat else []
    )
    kinds += [f"a child of the struct {top!r}" for top in tops if top != column]
    times = "twice" if len(tops) == 2 else f"{len(tops)} times"
    return f"appears {times}: as {' and '.join(kinds)}"


def _storage(t: pa.DataType) -> pa.DataType:
    """An extension type's storage (Hugging Face ``datasets``' ``Array2D`` .. ``Array5D``,
    lists of lists, while ``datasets`` is imported in the process reading the file)."""
    return t.storage_type if isinstance(t, pa.ExtensionType) else t


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


def import_error(
    table: str,
    source: str | Path,
    column: str,
    field: str,
    what: str,
    expected: Any = None,
    got: Any = None,
) -> SchemaError:
    """The error of an import about one column (the one wording of both doors):
    ``table 't': column 'obs' (for field 'observation') of 'a.parquet' holds 2 nulls``."""
    mapped = "" if column == field else f" (for field {field!r})"
    return SchemaError(
        f"table {table!r}: column {column!r}{mapped} of {str(source)!r} {what}",
        table=table,
        field=field,
        expected=expected,
        got=got,
    )


def _missing(
    table: str, schema: pa.Schema, names: list[str], field: str, column: str, source: str | Path
) -> SchemaError:
    children = struct_children(schema, column)
    if children:
        return import_error(
            table, source, column, field,
            f"is a struct of {', '.join(children)}; map the field to one of them, "
            f"e.g. {field}={children[0]}",
            column, children,
        )  # fmt: skip
    return SchemaError(
        f"table {table!r}: no column {column!r} for field {field!r} in {str(source)!r} "
        f"(columns: {', '.join(names)}); map one, e.g. {field}=COLUMN",
        table=table,
        field=field,
        expected=column,
        got=names,
    )


def _extra(table: str, source: str | Path, extra: list[str]) -> SchemaError:
    listed = ", ".join(repr(n) for n in extra)
    which, are, it = ("column", "is not a field", "it") if len(extra) == 1 else (
        "columns", "are not fields", "them"
    )  # fmt: skip
    return SchemaError(
        f"table {table!r}: {which} {listed} of {str(source)!r} {are} of the table; map a field "
        f"to {it}, or pass ignore_extra=True (--ignore-extra) to skip {it}",
        table=table,
        field=extra[0],
        expected="absent",
        got=extra,
    )
