"""Rows for a table out of Parquet files, checked by the import policy before any is read.

The one reader of both import doors (``Table.import_parquet`` and
``ReplayClient.import_parquet``; the policy is :mod:`.parquet_import`):
:func:`parquet_files` finds the files, :func:`read_parquet` plans every file's
columns, reads every planned column through once, checking every value (nulls,
list lengths, floats rounded into a narrower field, values the table refuses),
and only then yields the rows, ``chunk`` at a time, as TensorDicts of the
table's nested keys in the fields' dtypes. A door extends its table with them.
Memory follows the chunk, not the file: a file is read a buffer at a time, and a row
group whose largest pages (pyarrow decompresses a page whole) decompress past
``max_batch_bytes`` is refused from its page headers (:mod:`.parquet_pages`: a 10 KB
file held one page of 40M zeros, 320 MB decompressed).
A refused file writes nothing: the file's statistics are not taken as proof
(they are the file's own word: one whose statistics said max 7.0 held 1e39 got
past a check that trusted them, and its earlier chunks were written).

    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, torch
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> pq.write_table(pa.table({"obs": [[1.0, 2.0], [3.0, 4.0]], "r": [0.5, 1.5]}), path)
    >>> fields = {"obs": ([2], torch.float32), "next.reward": ([1], torch.float32)}
    >>> total, chunks = read_parquet("t", fields, [path], {"next.reward": "r"})
    >>> td = next(chunks)
    >>> total, td["obs"].tolist(), td["next", "reward"].tolist()
    (2, [[1.0, 2.0], [3.0, 4.0]], [[0.5], [1.5]])
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tensordict import TensorDict

from .arrow import from_column, nest
from .dtypes import NAMES
from .errors import CodecError, InvalidRequest
from .exports import SUFFIXES as EXPORT_SUFFIXES
from .format import META_DTYPE, META_SHAPE
from .parquet_columns import flatten_structs
from .parquet_import import ColumnPlan, Fields, import_error, plan_columns
from .parquet_pages import largest_pages, open_parquet
from .protocol import IMPORT_CHUNK, MAX_BATCH_BYTES, import_batch_bytes, import_chunk
from .spaces import outside_categories

__all__ = ["parquet_files", "read_parquet"]

#: the suffixes of the files a folder's import reads: those an export names Parquet
SUFFIXES = tuple(suffix for suffix, told in EXPORT_SUFFIXES.items() if told == "parquet")


def parquet_files(table: str, source: str | Path) -> list[Path]:
    """``source`` if a file, else the ``*.parquet`` / ``*.pq`` files under it, searched
    recursively (a name starting with ``_`` or ``.`` is skipped, and so is everything
    under a folder named so), in name order.

    Raises:
        InvalidRequest: no such file or folder, a folder without Parquet files, or a CSV file.
    """
    path = Path(source)
    if path.is_file():
        if (
            EXPORT_SUFFIXES.get(path.suffix.lower()) == "csv"
        ):  # read as Parquet, it would say "magic bytes"
            raise InvalidRequest(
                f"table {table!r}: {str(path)!r} is CSV; an import reads Parquet only (a CSV "
                "export is for other tools: export the table as Parquet to import it back)",
                table=table,
                field="path",
                got=str(path),
            )
        return [path]
    if path.is_dir():
        files = sorted(
            p
            for p in path.rglob("*")
            if p.suffix.lower() in SUFFIXES
            and p.is_file()
            and not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
        )
        if files:
            return files
        raise InvalidRequest(
            f"table {table!r}: no Parquet files under {str(path)!r}",
            table=table,
            field="path",
            got=str(path),
        )
    raise InvalidRequest(
        f"table {table!r}: no such file or folder {str(path)!r}",
        table=table,
        field="path",
        got=str(path),
    )


def read_parquet(
    table: str,
    fields: Fields,
    files: Sequence[str | Path],
    columns: Mapping[str, str] | None = None,
    *,
    ignore_extra: bool = False,
    chunk: int = IMPORT_CHUNK,
    refused: Mapping[str, int | None] | None = None,
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> tuple[int, Iterator[TensorDict]]:
    """Every file checked (its schema, then the values that need it), then its rows.

    Args:
        table: the table's name, for errors.
        fields: the table's fields by dotted name.
        files: the files, read in this order (:func:`parquet_files`).
        columns, ignore_extra: as :func:`~.parquet_import.plan_columns`.
        chunk: rows per yielded batch (the last of a file may be shorter).
        refused: the values an extend of the table refuses
            (:func:`~.parquet_import.refused_values`), found here before any row is
            written rather than by the extend of the chunk holding one.
        max_batch_bytes: the bytes a row group's largest pages, one per column read, may
            decompress to together.

    Returns:
        The number of rows, and an iterator of their batches, ``TensorDict`` of batch
        size ``[n]`` keyed by the fields' nested keys.

    Raises:
        SchemaError: see :func:`~.parquet_import.plan_columns`; nulls, lists of
            another length, a value a rounding would overflow, a value ``refused``
            names. Raised here, before any row is yielded.
        InvalidRequest: ``chunk`` or ``max_batch_bytes`` < 1, a file is not readable
            Parquet, or a row group's largest pages decompress past ``max_batch_bytes``.
    """
    chunk = import_chunk(chunk, table)
    limit = import_batch_bytes(max_batch_bytes, table)
    plans, total = [], 0
    for f in files:  # one open file at a time: folders can be large
        with _open(table, f) as pf:
            plan = plan_columns(
                table, fields, pf.schema_arrow, f, columns, ignore_extra=ignore_extra
            )
            _check_counts(table, f, pf, plan)
            _check_pages(table, f, pf, plan, limit)
            _prescan(table, f, pf, plan, chunk, refused or {})
            total += pf.metadata.num_rows
        plans.append((f, plan))

    def rows() -> Iterator[TensorDict]:
        for f, plan in plans:
            with _open(table, f) as pf:
                first = 0
                for t in _batches(pf, plan, chunk):
                    leaves = {c.key: _decode(table, f, c, t.column(c.column), first) for c in plan}
                    yield nest(leaves, t.num_rows)
                    first += t.num_rows

    return total, rows()


@contextlib.contextmanager
def _open(table: str, path: str | Path) -> Iterator[pq.ParquetFile]:
    try:
        pf = open_parquet(path)
    except (pa.ArrowException, OSError) as err:
        raise InvalidRequest(
            f"table {table!r}: {str(path)!r} is not a readable Parquet file: {err}",
            table=table,
            field="path",
            got=str(path),
        ) from None
    with pf:
        yield pf


def _check_counts(
    table: str, source: str | Path, pf: pq.ParquetFile, plan: list[ColumnPlan]
) -> None:
    """Refuse a column whose row group holds more values than its rows can, from the
    file's metadata, before any is read: a row is read whole, so one row of a list of 10^9
    values (a few hundred bytes of file: a run of one value compresses to nothing) would
    take gigabytes to decode before its length could be refused."""
    meta = pf.metadata
    for c in plan:
        per_row = math.prod(c.sizes)  # every dimension is at least 1
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            held = group.column(c.leaf).num_values
            if held > group.num_rows * per_row:
                raise import_error(
                    table, source, c.column, c.field,
                    f"holds {held} values in the {group.num_rows} rows of row group {i} "
                    f"({held / max(group.num_rows, 1):g} a row), expected {per_row} a row "
                    f"(shape {c.shape})",
                    group.num_rows * per_row, held,
                )  # fmt: skip


def _check_pages(
    table: str, source: str | Path, pf: pq.ParquetFile, plan: list[ColumnPlan], limit: int
) -> None:
    """Refuse a row group whose largest pages of the planned columns decompress past
    ``limit``, or whose pages hold more values than its rows can, from the page headers."""
    counts = [(c.leaf, math.prod(c.sizes)) for c in plan]
    try:
        largest_pages(source, pf, counts, limit)
    except ValueError as err:
        raise InvalidRequest(
            f"table {table!r}: {err}", table=table, field="path", got=str(source)
        ) from None


def _batches(pf: pq.ParquetFile, plan: list[ColumnPlan], step: int) -> Iterator[pa.Table]:
    """Batches of the planned columns, struct columns flattened to dotted names.

    Selecting a dotted top-level name may also select a struct's child of the same
    path; the flattened names stay unique all the same (:func:`plan_columns` refused
    a name that is both), so the extra columns are harmless.
    """
    tops = {c.top for c in plan}
    wanted = [n for n in pf.schema_arrow.names if n in tops]
    for rb in pf.iter_batches(batch_size=step, columns=wanted):
        yield flatten_structs(pa.Table.from_batches([rb]))


def _prescan(
    table: str,
    source: str | Path,
    pf: pq.ParquetFile,
    plan: list[ColumnPlan],
    step: int,
    refused: Mapping[str, int | None],
) -> None:
    """Read every planned column through once, checking every value: no nulls, lists of the
    field's length, no value a rounding would overflow, none an extend refuses (``refused``).
    Every column, whatever the file's statistics say: they are the file's own word."""
    first = 0
    for t in _batches(pf, plan, step):
        for c in plan:
            arr = _to_fixed_lists(table, source, c, _one_chunk(t.column(c.column)), first)
            if c.cast == "round":
                _check_range(table, source, c, arr, first)
            if c.field in refused:
                _check_refused(
                    table, source, c, refused[c.field], _tensor(table, source, c, arr), first
                )
        first += t.num_rows


def _check_refused(
    table: str, source: str | Path, c: ColumnPlan, n: int | None, values: torch.Tensor, first: int
) -> None:
    """Refuse rows ``first...`` of column ``c`` holding a value an extend refuses: one
    outside the field's ``n`` categories, or (``n`` is ``None``) NaN."""
    if n is not None:
        found = outside_categories(values.numpy(), n)
        if found is not None:
            row, got = found
            what = f"holds {got} in row {first + row}, outside its {n} categories 0 .. {n - 1}"
            raise import_error(table, source, c.column, c.field, what, f"0 .. {n - 1}", got)
        return
    nan = values.reshape(len(values), -1).isnan().any(1).nonzero()
    if len(nan):
        what = f"holds NaN in row {first + int(nan[0])}; the max_value writer ranks items by it"
        raise import_error(table, source, c.column, c.field, what, "a number", "nan")


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    return arr.storage if isinstance(arr, pa.ExtensionArray) else arr  # as planned


def _to_fixed_lists(
    table: str, source: str | Path, c: ColumnPlan, arr: pa.Array, first: int = 0
) -> pa.Array:
    """``arr`` (rows ``first...`` of the file) as nested fixed-size lists of ``c.sizes``.

    Raises:
        SchemaError: a value is null, or a list has the wrong length.
    """

    def fix(a: pa.Array, sizes: list[int], per_row: int) -> pa.Array:
        if a.null_count:
            nulls = f"{a.null_count} null value{'s' if a.null_count > 1 else ''}"
            raise import_error(
                table, source, c.column, c.field, f"holds {nulls}", "no nulls", nulls
            )
        if not sizes:
            return pc.cast(a, pa.int64()) if a.type == pa.uint32() else a
        size = sizes[0]
        if not pa.types.is_fixed_size_list(a.type):
            lengths = pc.list_value_length(a).to_numpy(zero_copy_only=False)
            bad = np.flatnonzero(lengths != size)
            if len(bad):
                i = int(bad[0])
                raise import_error(
                    table, source, c.column, c.field,
                    f"row {first + i // per_row} holds a list of {lengths[i]} values, "
                    f"expected {size}",
                    size, int(lengths[i]),
                )  # fmt: skip
        inner = fix(a.flatten(), sizes[1:], per_row * size)
        return pa.FixedSizeListArray.from_arrays(inner, size)

    return fix(arr, c.sizes, 1)


def _check_range(table: str, source: str | Path, c: ColumnPlan, arr: pa.Array, first: int) -> None:
    """Refuse a finite value that rounding into ``c.dtype`` would make infinite: at once
    where the column's min and max (one vectorised pass) lie within the field's range, else
    value by value (an infinity is no overflow; a value just past the range may round to
    its largest)."""
    values = arr
    while pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    if (c.arrow.metadata or {}).get(META_DTYPE) != b"bfloat16":  # not the bits it travels as
        low, high = (v.as_py() for v in pc.min_max(values).values())
        top = torch.finfo(c.dtype).max
        if low is None or (-top <= low and high <= top):  # NaN only, or all within range
            return
    src = _float_values(c, values)
    bad = torch.nonzero(torch.isinf(src.to(c.dtype)) & torch.isfinite(src)).flatten()
    if len(bad):
        i, top, want = int(bad[0]), torch.finfo(c.dtype).max, NAMES[c.dtype]
        value = float(src[i])
        raise import_error(
            table, source, c.column, c.field,
            f"holds {value:g} in row {first + i // math.prod(c.shape)}, beyond {want}'s "
            f"range (+-{top:g})",
            f"|value| <= {top:g}", value,
        )  # fmt: skip


def _float_values(c: ColumnPlan, values: pa.Array) -> torch.Tensor:
    """A rounded column's flat values as a tensor of their own float dtype (bfloat16 from
    the bits it travels as)."""
    data = np.array(values.to_numpy(zero_copy_only=False))  # writable, as torch wants
    if (c.arrow.metadata or {}).get(META_DTYPE) == b"bfloat16":
        return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(data)


def _decode(
    table: str, source: str | Path, c: ColumnPlan, col: pa.ChunkedArray, first: int
) -> torch.Tensor:
    """Rows ``first...`` of column ``c`` as the field's tensor, checked again as they are
    decoded (:func:`_prescan` read them all; a file changed since is refused at its chunk,
    never a value rounded to inf)."""
    arr = _to_fixed_lists(table, source, c, _one_chunk(col), first)
    if c.cast == "round":
        _check_range(table, source, c, arr, first)
    return _tensor(table, source, c, arr)


def _tensor(table: str, source: str | Path, c: ColumnPlan, arr: pa.Array) -> torch.Tensor:
    """ColumnPlan ``c``'s fixed-size lists (:func:`_to_fixed_lists`) as the field's tensor."""
    meta = {k: v for k, v in (c.arrow.metadata or {}).items() if k in (META_DTYPE, META_SHAPE)}
    try:
        t = from_column(pa.field(c.column, arr.type, metadata=meta or None), arr)
    except CodecError as err:  # ruled out by plan_columns; kept typed all the same
        raise import_error(table, source, c.column, c.field, str(err)) from None
    return t.reshape([len(arr), *c.shape]).to(c.dtype)
