"""The columns of a Parquet file by dotted name: struct columns flattened, as nested keys.

A table's nested key is one dotted name (``next.observation``). A Parquet file
holds it either as a flat column of that name (what ``tdreplay export`` writes)
or as a struct column's child (``next`` with a child ``observation``: what
pandas writes for a column of dicts, and Hugging Face ``datasets`` for nested
features). The import (:mod:`.parquet_import`, :mod:`.parquet_read`: both the
table's and the client's) names columns through :func:`leaf_columns` and reads
them through :func:`flatten_structs`, so a mapping's ``next.observation=obs.next``
(a struct's child) names a column the way the error messages do.

    >>> import pyarrow as pa
    >>> t = pa.table({"obs": [[1.0, 2.0]], "next": pa.array([{"obs": [3.0, 4.0], "r": 1.5}])})
    >>> [c.name for c in leaf_columns(t.schema)]
    ['obs', 'next.obs', 'next.r']
    >>> flatten_structs(t).column_names
    ['obs', 'next.obs', 'next.r']
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa

from .arrow import SEP

__all__ = ["LeafColumn", "flatten_structs", "leaf_columns", "struct_children"]


@dataclass(frozen=True)
class LeafColumn:
    """One column a reader can take as a field: a top-level column, or a struct's leaf."""

    #: the dotted name (``next.observation`` for the child ``observation`` of ``next``)
    name: str
    #: its Arrow field (name: the last part)
    field: pa.Field
    #: the index of its first Parquet leaf column (for the file's statistics)
    leaf: int
    #: the file's top-level column that holds it (``name`` itself unless a struct does)
    top: str


def leaf_columns(schema: pa.Schema) -> Iterator[LeafColumn]:
    """Every column of ``schema`` that is not a struct, struct children named by their
    dotted path, in the file's order. Two may share a name (a flat ``next.reward`` beside
    a struct ``next`` with a ``reward``): callers refuse that."""
    leaf = itertools.count()

    def walk(name: str, f: pa.Field, top: str) -> Iterator[LeafColumn]:
        if pa.types.is_struct(f.type):
            for child in f.type:
                yield from walk(f"{name}{SEP}{child.name}", child, top)
        else:
            first = next(leaf)
            for _ in range(_n_leaves(f.type) - 1):
                next(leaf)
            yield LeafColumn(name, f, first, top)

    for f in schema:
        yield from walk(f.name, f, f.name)


def struct_children(schema: pa.Schema, name: str) -> list[str]:
    """The dotted names of the leaves under ``name`` when it is a struct column (or a
    struct child), else ``[]``: what an error about a missing ``name`` should list."""
    prefix = name + SEP
    return [c.name for c in leaf_columns(schema) if c.name.startswith(prefix)]


def _n_leaves(t: pa.DataType) -> int:
    if isinstance(t, pa.ExtensionType):  # stored as its storage, which num_fields ignores
        t = t.storage_type
    if t.num_fields == 0:
        return 1
    return sum(_n_leaves(t.field(i).type) for i in range(t.num_fields))


def flatten_structs(table: pa.Table) -> pa.Table:
    """``table`` with every struct column replaced by its children, named as
    :func:`leaf_columns` names them."""
    while any(pa.types.is_struct(f.type) for f in table.schema):
        table = table.flatten()
    return table
