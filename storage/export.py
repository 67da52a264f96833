"""Export a table to Parquet or CSV, and import a Parquet dataset into a table.

An export holds the items live when it starts, oldest first. It reads them in
chunks, each under the table's data read lock, so inserts and samples go on
meanwhile; an item overwritten or removed before its chunk is read is left
out, so every exported row is one whole item as it was inserted. The file is
written next to its destination under a temporary name and renamed into place:
a failed export leaves no file behind (and an existing one untouched).

**Parquet** files use the wire schema of :mod:`tdreplay.codec`: one column
per field, nested keys joined with ``"."`` (``next.reward``); a scalar field
is a primitive column, a tensor field a ``fixed_size_list`` of its elements in
row-major order, with ``tdreplay.shape`` / ``tdreplay.dtype`` in the field
metadata. Arrow has no bfloat16, so a bfloat16 field is stored as ``uint16``
holding the same bits (``tdreplay.dtype = "bfloat16"``). The schema metadata
holds the table's name (``tdreplay.table``) and spec (``tdreplay.spec``, JSON,
without the backend block).
One row group per chunk.

Readers: pyarrow and pandas read the file as is (tensor fields as lists).
``TensorDict.from_parquet(path, separator=".")`` gives nested keys; it reads
list columns through Python lists, so tensor fields come back flattened to
``[N, numel]`` with torch's default dtypes (integers and bfloat16 bits as
int64, float16/float32 as float32, bool as bool; float64 tensor fields are
rounded to float32). Scalar fields keep their dtype (bfloat16 as uint16
bits: ``t.view(torch.bfloat16)``). :func:`import_parquet` and
:func:`tdreplay.codec.from_record_batch` restore every dtype and shape
exactly.

**CSV** layout:

* one header row, then one row per item;
* a scalar field is one column named by its dotted key (``collector.traj_ids``);
* a tensor field of shape ``[d0, d1, ...]`` is expanded into one column per
  element, row-major, named ``key[i]`` for one dimension and ``key[i,j,...]``
  for more (``observation[0]``, ``pixels[0,1]``); a field with no elements
  has no column;
* bool is written ``true`` / ``false`` (pandas and ``TensorDict.from_csv``
  read it back as bool);
* integers in decimal;
* floating fields (float16, bfloat16, float32, float64) as the shortest
  decimal that reads back as the same float64, which is the exact value of
  the element (every float16, bfloat16 and float32 is a float64); integral
  values keep a ``.0`` (``1.0``, ``-0.0``) so readers infer a float column;
  ``nan``, ``inf``, ``-inf`` as such. Read as float64 and cast to the field's
  dtype, every value is bit-exact (NaN payloads aside).

Import takes Parquet only: a file, or a folder of ``*.parquet`` / ``*.pq``
files (names starting with ``_`` or ``.`` are skipped). Every file's schema is
checked against the table before any row is written; columns written by other
tools (plain or nested lists, fixed-size lists, struct columns for nested
keys, no tdreplay metadata) are accepted when their shapes match and their
dtype casts losslessly into the field's (``int32 -> int64``,
``float32 -> float64``; never ``float64 -> float32``).

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from tensordict import TensorDict
    >>> from tdreplay.storage import Table, TableSpec
    >>> spec = TableSpec.model_validate({"name": "demo", "capacity": 8, "backend": {"kind": "memory"},
    ...     "fields": {"obs": {"shape": [2], "dtype": "float32"}, "next.done": {"shape": [1], "dtype": "bool"}}})
    >>> table = Table.create(spec, root=tempfile.mkdtemp())
    >>> _ = table.extend(TensorDict({"obs": torch.ones(3, 2), "next": {"done": torch.zeros(3, 1, dtype=torch.bool)}}, [3]))
    >>> out = Path(tempfile.mkdtemp())
    >>> table.export(out / "demo.csv").read_text().splitlines()[:2]
    ['"obs[0]","obs[1]","next.done[0]"', '1.0,1.0,false']
    >>> copy = Table.create(spec.model_copy(update={"name": "copy"}), root=tempfile.mkdtemp())
    >>> copy.import_parquet(table.export(out / "demo.parquet"))
    3
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from tdreplay.codec import CodecError, from_column, to_record_batch
from tdreplay.codec.arrow import META_DTYPE, META_SHAPE, SEP

from .errors import BackendError, EmptyTableError, InvalidRequest, SchemaError
from .spec import DTYPE_NAMES, DTYPES, NestedKey, join_key
from .tensordicts import nest

if TYPE_CHECKING:
    from .table import Table

log = logging.getLogger(__name__)

FORMATS = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv"}
#: bytes of item data per chunk (one Parquet row group), within the row bounds below
CHUNK_BYTES = 64 << 20
#: CSV cells per chunk (a cell costs far more as text than as a tensor element)
CHUNK_CELLS = 4 << 20
MIN_CHUNK_ROWS = 256
MAX_CHUNK_ROWS = 65536
#: an automatic progress bar shows for tables at least this large (rows or bytes)
LARGE_ROWS = 100_000
LARGE_BYTES = 256 << 20

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


# ------------------------------------------------------------------ shared
def _progress(enabled: bool | None, total: int, nbytes: int, desc: str) -> tqdm:
    """A tqdm bar on stderr; ``None`` shows it for large jobs on a terminal."""
    if enabled is None:
        large = total >= LARGE_ROWS or total * nbytes >= LARGE_BYTES
        enabled = large and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="rows", unit_scale=True, disable=not enabled)


def _chunk_rows(per_row: int, budget: int) -> int:
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, budget // max(per_row, 1)))


# ------------------------------------------------------------------ export
def export(
    table: Table, path: str | Path, *, format: str | None = None, progress: bool | None = None
) -> Path:
    """Write the live items of ``table``, oldest first, to a Parquet or CSV file.

    Args:
        table: the table.
        path: the file to write (replaced if it exists; its folder is created).
        format: ``"parquet"`` or ``"csv"``; default: from the suffix of ``path``
            (``.parquet``, ``.pq``, ``.csv``).
        progress: show a progress bar; ``None`` shows one for large tables when
            stderr is a terminal.

    Returns:
        The file written (absolute).

    Raises:
        InvalidRequest: the format is unknown or cannot be told from the suffix,
            or ``path`` is a folder.
        EmptyTableError: the table is closed.
        BackendError: the file could not be written or the storage not read;
            no file is left behind.
    """
    path = Path(path).absolute()
    fmt = _format(table, path, format)
    if path.is_dir():
        raise InvalidRequest(
            f"table {table.name!r}: export path {str(path)!r} is a folder",
            table=table.name,
            field="path",
            got=str(path),
        )
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        index, seq = _snapshot(table)
        write = _write_parquet if fmt == "parquet" else _write_csv
        with _progress(progress, len(index), table.spec.item_nbytes, f"export {table.name}") as bar:
            dropped = write(table, tmp, index, seq, bar)
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        if isinstance(err, (OSError, pa.ArrowException)):
            raise BackendError(
                f"table {table.name!r}: export to {str(path)!r} failed: {err}", table=table.name
            ) from err
        raise
    if dropped:
        log.warning(
            "table %r: %d of %d items were overwritten or removed during the export and are not in %s",
            table.name,
            dropped,
            len(index),
            path,
        )
    return path


def _format(table: Table, path: Path, format: str | None) -> str:
    if format is None:
        fmt = FORMATS.get(path.suffix.lower())
        if fmt is None:
            raise InvalidRequest(
                f"table {table.name!r}: cannot tell the export format from {path.name!r}; "
                f"use a suffix in {sorted(FORMATS)} or pass format",
                table=table.name,
                field="path",
                expected=sorted(FORMATS),
                got=path.suffix,
            )
        return fmt
    fmt = format.lower()
    if fmt not in ("parquet", "csv"):
        raise InvalidRequest(
            f"table {table.name!r}: unknown export format {format!r}",
            table=table.name,
            field="format",
            expected=["parquet", "csv"],
            got=format,
        )
    return fmt


def _snapshot(table: Table) -> tuple[torch.Tensor, torch.Tensor]:
    """Live slots oldest first, and the insert number of the item each holds, taken at once."""
    with table._cond:
        if table.closed:  # its storage handles are gone
            raise EmptyTableError(f"table {table.name!r} is closed", table=table.name)
        s = table.slots
        live = s.live.nonzero().squeeze(1)
        index = live[torch.argsort(s.seq[live])]
        return index, s.seq[index].clone()


def _chunks(
    table: Table, index: torch.Tensor, seq: torch.Tensor, rows: int
) -> Iterator[tuple[dict[NestedKey, torch.Tensor], int]]:
    """``(items, slots read)`` for the slots of ``index``, ``rows`` at a time.

    Each chunk is read under the data read lock. A slot whose item is still
    live with the same insert number after the read was not written during it:
    an insert marks the slots it claims dead before it writes them and gives
    them a new number after. Other rows are left out. (The check is made after
    the read lock is released: sampling takes that lock while holding the
    table's, so taking them the other way round could deadlock.)
    """
    for start in range(0, len(index), rows):
        idx, want = index[start : start + rows], seq[start : start + rows]
        with table._data_lock.read():
            data = table.backend.read(idx)
        with table._cond:
            intact = table.slots.live[idx] & (table.slots.seq[idx] == want)
        if not bool(intact.all()):
            keep = intact.nonzero().squeeze(1)
            data = {k: v.index_select(0, keep) for k, v in data.items()}
        yield data, len(idx)


def _parquet_schema(table: Table) -> pa.Schema:
    """The codec's schema for the table, with its name and spec (less the backend: the
    file describes the data, not where a server kept it) in the schema metadata."""
    empty = to_record_batch(table.backend.empty(0)).schema
    spec = table.spec.model_dump_json(exclude={"backend"})
    return empty.with_metadata({"tdreplay.table": table.name, "tdreplay.spec": spec})


def _write_parquet(
    table: Table, path: Path, index: torch.Tensor, seq: torch.Tensor, bar: tqdm
) -> int:
    rows = _chunk_rows(table.spec.item_nbytes, CHUNK_BYTES)
    written = 0
    with pq.ParquetWriter(path, _parquet_schema(table)) as writer:
        for data, read in _chunks(table, index, seq, rows):
            n = next(iter(data.values())).shape[0]
            if n:
                writer.write_batch(to_record_batch(data), row_group_size=n)
            written += n
            bar.update(read)
    return len(index) - written


def csv_columns(key: str, shape: list[int]) -> list[str]:
    """The CSV column names of a field: ``key`` for a scalar, ``key[i,j,...]`` per element otherwise."""
    if not shape:
        return [key]
    return [f"{key}[{','.join(map(str, ix))}]" for ix in itertools.product(*map(range, shape))]


def _float_text(values: np.ndarray) -> pa.Array:
    """Shortest round-trip decimals of ``values`` (as float64), integral ones with ``.0``."""
    text = pc.cast(pa.array(values.astype(np.float64, copy=False)), pa.string())
    integral = pc.match_substring_regex(text, r"^-?[0-9]+$")
    return pc.if_else(integral, pc.binary_join_element_wise(text, ".0", ""), text)


def _csv_arrays(t: torch.Tensor) -> list[pa.Array]:
    """One Arrow array per CSV column of ``t`` (``[N, *shape]``): zero-copy slices of one array."""
    n = t.shape[0]
    columns = t.reshape(n, -1).T.contiguous()  # column j of the CSV is row j here
    flat = columns.reshape(-1)
    if t.dtype.is_floating_point:
        arr = _float_text(flat.to(torch.float64).numpy())
    else:
        arr = pa.array(flat.numpy())
    return [arr.slice(j * n, n) for j in range(columns.shape[0])]


def _write_csv(table: Table, path: Path, index: torch.Tensor, seq: torch.Tensor, bar: tqdm) -> int:
    fields: list[pa.Field] = []
    keys = table.spec.keys()
    for key, (shape, dtype) in table.spec.torch_schema().items():
        if dtype.is_floating_point:
            typ = pa.string()
        else:
            typ = pa.from_numpy_dtype(np.dtype(DTYPE_NAMES[dtype]))
        fields += [pa.field(name, typ) for name in csv_columns(join_key(key), shape)]
    schema = pa.schema(fields)
    cells = max(len(fields), 1)
    rows = _chunk_rows(cells, CHUNK_CELLS)
    written = 0
    options = pcsv.WriteOptions(quoting_style="none")
    with (
        pa.OSFile(str(path), "wb") as sink,
        pcsv.CSVWriter(sink, schema, write_options=options) as w,
    ):
        for data, read in _chunks(table, index, seq, rows):
            n = next(iter(data.values())).shape[0]
            if n:
                arrays = [a for key in keys for a in _csv_arrays(data[key])]
                w.write_table(pa.Table.from_arrays(arrays, schema=schema))
            written += n
            bar.update(read)
    return len(index) - written


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
    with _progress(progress, total, table.spec.item_nbytes, f"import {table.name}") as bar:
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
