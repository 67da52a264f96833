"""Rows for a table out of any flat-column Parquet file, through a column mapping.

tdreplay's own exports read back exactly (every dtype and shape, bfloat16
included: the columns' ``tdreplay.*`` metadata says how). Files other tools
wrote are read when each of the table's fields has a column — its own dotted
name, or the one ``columns`` maps it to (``{"observation": "obs"}``) — holding
numbers (or bools) without nulls, with as many elements per row as the field
(a scalar column, or lists of that length, nested or flat). Values are cast to
the field's dtype; a float column never goes into an integer or bool field.
Columns the mapping does not name and the table has no field for are ignored.
A struct column's children are columns too, named by their dotted path
(:mod:`tdreplay.codec.parquet_columns`): a struct ``next`` with a child
``observation``, as pandas and Hugging Face ``datasets`` write nested data, is
the column ``next.observation``, read by the field of that name or mapped
(``{"next.observation": "nxt.obs"}``).

Every file's schema is checked before any row is read; a problem is a
:class:`~tdreplay.client.errors.SchemaError` naming the column, the field
and the file.

    >>> import pyarrow as pa
    >>> fields = {"obs": {"shape": [2], "dtype": "float32"}, "next.done": {"shape": [], "dtype": "bool"}}
    >>> t = pa.table({"o": pa.array([[1.0, 2.0], [3.0, 4.0]]), "d": [False, True], "x": ["a", "b"]})
    >>> plan = plan_columns(fields, t.schema, {"obs": "o", "next.done": "d"}, "demo.parquet")
    >>> rows = decode(fields, plan, t, "demo.parquet")
    >>> rows["obs"].tolist(), rows["next.done"].tolist()
    ([[1.0, 2.0], [3.0, 4.0]], [False, True])
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict

from ..codec import from_column
from ..codec.dtypes import TORCH
from ..codec.errors import CodecError, SchemaError
from ..codec.format import META_DTYPE
from ..codec.parquet_columns import flatten_structs, leaf_columns, struct_children

__all__ = ["decode", "nest_rows", "parquet_files", "plan_columns", "read_rows"]


def parquet_files(source: str | Path) -> list[Path]:
    """``source`` if a file, else the ``*.parquet`` / ``*.pq`` files under it (names starting
    with ``_`` or ``.`` skipped), in name order.

    Raises:
        FileNotFoundError: no such file, or a folder without Parquet files.
    """
    path = Path(source)
    if path.is_dir():
        found = sorted(
            p
            for p in path.rglob("*")
            if p.suffix in (".parquet", ".pq") and not p.name.startswith(("_", "."))
        )
        if not found:
            raise FileNotFoundError(f"{str(path)!r} holds no *.parquet file")
        return found
    if not path.exists():
        raise FileNotFoundError(f"{str(path)!r}: no such file or folder")
    return [path]


def _numel(spec: Mapping[str, Any]) -> int:
    return int(np.prod(spec.get("shape") or [], dtype=np.int64))


def plan_columns(
    fields: Mapping[str, Any],
    schema: pa.Schema,
    columns: Mapping[str, str] | None,
    source: str | Path,
) -> dict[str, str]:
    """``{field: column}`` for a table with ``fields`` reading a file of ``schema``.

    Raises:
        SchemaError: the mapping names a field the table lacks, or a field has no
            column (its own name, or the mapped one), or a column is not numeric.
    """
    mapping = dict(columns or {})
    for name in mapping:
        if name not in fields:
            raise SchemaError(
                f"--map {name}={mapping[name]}: the table has no field {name!r} "
                f"(fields: {', '.join(fields)})",
                field=name,
                got=name,
            )
    leaves: dict[str, pa.Field] = {}
    twice = set()
    for c in leaf_columns(schema):
        if c.name in leaves:
            twice.add(c.name)
        leaves[c.name] = c.field
    plan = {}
    for name, spec in fields.items():
        column = mapping.get(name, name)
        if column not in leaves:
            raise _missing(schema, list(leaves), name, column, source)
        if column in twice:
            raise SchemaError(
                f"{source}: column {column!r} (for field {name!r}) appears twice: a column "
                "of that name and a struct column's child",
                field=name,
                got=column,
            )
        typ = leaves[column].type
        while (
            pa.types.is_list(typ) or pa.types.is_large_list(typ) or pa.types.is_fixed_size_list(typ)
        ):
            typ = typ.value_type
        floating = pa.types.is_floating(typ)
        if not (floating or pa.types.is_integer(typ) or pa.types.is_boolean(typ)):
            raise SchemaError(
                f"{source}: column {column!r} (for field {name!r}) holds {typ}, not numbers",
                field=name,
                got=str(typ),
            )
        if floating and not TORCH[spec["dtype"]].is_floating_point:
            raise SchemaError(
                f"{source}: column {column!r} holds {typ}; field {name!r} is {spec['dtype']} "
                "(a float column never goes into an integer or bool field)",
                field=name,
                expected=spec["dtype"],
                got=str(typ),
            )
        plan[name] = column
    return plan


def _missing(
    schema: pa.Schema, names: list[str], field: str, column: str, source: str | Path
) -> SchemaError:
    children = struct_children(schema, column)
    if children:
        return SchemaError(
            f"{source}: column {column!r} (for field {field!r}) is a struct of "
            f"{', '.join(children)}; map the field to one of them, e.g. --map "
            f"{field}={children[0]}",
            field=field,
            expected=column,
            got=children,
        )
    return SchemaError(
        f"{source}: no column {column!r} for field {field!r} (columns: {', '.join(names)}); "
        f"map one with --map {field}=COLUMN",
        field=field,
        expected=column,
        got=names,
    )


def _values(arr: pa.Array, column: str, n: int, numel: int, source: str | Path) -> pa.Array:
    """The elements of a column's rows, flattened, checked to be ``numel`` per row."""
    if arr.null_count:
        raise SchemaError(f"{source}: column {column!r} holds nulls", field=column)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        lengths = pc.list_value_length(arr)
        low, high = pc.min_max(lengths).values()
        if n and (low.as_py() != high.as_py()):
            raise SchemaError(
                f"{source}: column {column!r} holds lists of {low} to {high} elements",
                field=column,
            )
    values = arr
    while isinstance(values, pa.ListArray | pa.LargeListArray | pa.FixedSizeListArray):
        values = values.flatten()
        if values.null_count:
            raise SchemaError(f"{source}: column {column!r} holds nulls", field=column)
    if len(values) != n * numel:
        per = len(values) // n if n else 0
        raise SchemaError(
            f"{source}: column {column!r} holds {per} elements per row; its field has {numel}",
            field=column,
            expected=numel,
            got=per,
        )
    return values


def decode(
    fields: Mapping[str, Any], plan: Mapping[str, str], table: pa.Table, source: str | Path
) -> dict[str, torch.Tensor]:
    """``{field: tensor [n, *shape]}`` of one batch of rows (see the module's docstring;
    struct columns are flattened first)."""
    table = flatten_structs(table)
    n = table.num_rows
    out = {}
    for name, column in plan.items():
        spec, col = fields[name], table.column(column)
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        shape, dtype = list(spec.get("shape") or []), TORCH[spec["dtype"]]
        meta = table.schema.field(column).metadata or {}
        if META_DTYPE in meta:  # a tdreplay export's column: decoded exactly, as written
            try:
                t = from_column(table.schema.field(column), arr)
            except CodecError as err:
                raise SchemaError(f"{source}: column {column!r}: {err}", field=name) from None
            if t.numel() != n * _numel(spec):
                raise SchemaError(
                    f"{source}: column {column!r} has shape {list(t.shape[1:])}; field "
                    f"{name!r} has {shape}",
                    field=name,
                    expected=shape,
                    got=list(t.shape[1:]),
                )
        else:
            values = _values(arr, column, n, _numel(spec), source)
            t = torch.from_numpy(np.array(values.to_numpy(zero_copy_only=False)))
        out[name] = t.reshape([n, *shape]).to(dtype)
    return out


def read_rows(
    fields: Mapping[str, Any],
    files: list[Path],
    columns: Mapping[str, str] | None = None,
    chunk: int = 4096,
) -> tuple[int, Iterator[tuple[Path, dict[str, torch.Tensor]]]]:
    """Every file's schema checked, then its rows ``chunk`` at a time, file by file.

    Returns:
        The number of rows, and an iterator of ``(file, {field: tensor})``.

    Raises:
        SchemaError: see :func:`plan_columns` (before any row is read), or
            while iterating, a column's values (nulls, lengths).
        OSError, pyarrow.ArrowException: a file cannot be read.
    """
    plans, total = [], 0
    for f in files:
        with pq.ParquetFile(f) as pf:
            schema = pf.schema_arrow
            plan = plan_columns(fields, schema, columns, f)
            tops = {c.name: c.top for c in leaf_columns(schema)}
            plans.append((f, plan, sorted({tops[c] for c in plan.values()})))
            total += pf.metadata.num_rows

    def rows() -> Iterator[tuple[Path, dict[str, torch.Tensor]]]:
        for f, plan, wanted in plans:
            with pq.ParquetFile(f) as pf:
                for rb in pf.iter_batches(batch_size=chunk, columns=wanted):
                    yield f, decode(fields, plan, pa.Table.from_batches([rb]), f)

    return total, rows()


def nest_rows(rows: Mapping[str, torch.Tensor], n: int) -> TensorDict:
    """``{dotted key: tensor}`` as a TensorDict of batch ``[n]`` with nested keys."""
    return TensorDict({tuple(k.split(".")): v for k, v in rows.items()}, [n])
