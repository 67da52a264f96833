"""Export a table to Parquet or CSV.

An export holds the items live when it starts, oldest first. It reads them in
chunks, each under the table's data read lock, so inserts and samples go on
meanwhile; an item overwritten or removed before its chunk is read is left
out, so every exported row is one whole item as it was inserted. The file is
written next to its destination under a temporary name and renamed into place:
a failed export leaves no file behind (and an existing one untouched). With
``replace=False`` the last step is a hard link, which fails if the name exists: a
file that appears there while the export runs (another export racing for the
name) is never replaced, whatever the timing. A checkpoint exported without a table
(:func:`~tdreplay.storage.checkpoint.items.export_checkpoint`) goes through these
writers too, its live items in the same order: the same file, byte for byte.

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

Import (:mod:`tdreplay.storage.importer`) reads the Parquet files back; a CSV file is
refused (CSV is for other tools: its text is read back exactly by them, not imported).

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from tensordict import TensorDict
    >>> from tdreplay.storage import Table, TableSpec
    >>> spec = TableSpec.model_validate({"name": "demo", "capacity": 8, "backend": {"kind": "memory"},
    ...     "fields": {"obs": {"shape": [2], "dtype": "float32"}, "next.done": {"shape": [1], "dtype": "bool"}}})
    >>> tmp = tempfile.TemporaryDirectory()
    >>> out = Path(tmp.name)
    >>> table = Table.create(spec, root=out / "a")
    >>> _ = table.extend(TensorDict({"obs": torch.ones(3, 2), "next": {"done": torch.zeros(3, 1, dtype=torch.bool)}}, [3]))
    >>> table.export(out / "demo.csv").read_text().splitlines()[:2]
    ['"obs[0]","obs[1]","next.done[0]"', '1.0,1.0,false']
    >>> copy = Table.create(spec.model_copy(update={"name": "copy"}), root=out / "b")
    >>> copy.import_parquet(table.export(out / "demo.parquet"))
    3
    >>> table.destroy(); copy.destroy(); tmp.cleanup()
"""

from __future__ import annotations

import itertools
import logging
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from tdreplay.codec import to_record_batch
from tdreplay.codec.dtypes import ARROW
from tdreplay.codec.exports import ExportedPath, export_format, into_place, keep_existing

from .diskspace import on_full_disk
from .errors import BackendError, InvalidRequest
from .spec import join_key

if TYPE_CHECKING:
    from .consumers import Exportable as Table
    from .consumers import ItemChunks as Items

log = logging.getLogger(__name__)

#: bytes of item data per chunk (one Parquet row group), within the row bounds below; an
#: export's memory peaks near 9x this (copies, Arrow arrays, the writer's pages): at 64 MB
#: it grew by ~300 MB, at 16 MB by ~140 MB (issue 20 asks at most 256 MB)
CHUNK_BYTES = 16 << 20
#: CSV cells per chunk (a cell costs far more as text than as a tensor element: ~300 B
#: at the peak; 4M cells grew an export by ~730 MB, 512K by ~150 MB)
CHUNK_CELLS = 512 << 10
MIN_CHUNK_ROWS = 256
MAX_CHUNK_ROWS = 65536
#: an automatic progress bar shows for tables at least this large (rows or bytes)
LARGE_ROWS = 100_000
LARGE_BYTES = 256 << 20


# ------------------------------------------------------------------ shared
def progress_bar(enabled: bool | None, total: int, nbytes: int, desc: str) -> tqdm:
    """A tqdm bar on stderr; ``None`` shows it for large jobs on a terminal."""
    if enabled is None:
        large = total >= LARGE_ROWS or total * nbytes >= LARGE_BYTES
        enabled = large and sys.stderr.isatty()
    return tqdm(total=total, desc=desc, unit="rows", unit_scale=True, disable=not enabled)


def _chunk_rows(per_row: int, budget: int) -> int:
    return max(MIN_CHUNK_ROWS, min(MAX_CHUNK_ROWS, budget // max(per_row, 1)))


# ------------------------------------------------------------------ export
def export(
    table: Table,
    path: str | Path,
    *,
    format: str | None = None,
    progress: bool | None = None,
    replace: bool = True,
) -> Path:
    """Write the live items of ``table``, oldest first, to a Parquet or CSV file.

    Args:
        table: the table.
        path: the file to write (its folder is created).
        format: ``"parquet"`` or ``"csv"``; default: from the suffix of ``path``
            (``.parquet``, ``.pq``, ``.csv``); one that a suffix of the other format
            contradicts is refused (:func:`tdreplay.codec.exports.export_format`).
        progress: show a progress bar; ``None`` shows one for large tables when
            stderr is a terminal.
        replace: replace a file at ``path``; ``False``: refuse, at the start and at the
            final step (a link, atomic), so a file that appears meanwhile is kept too.

    Returns:
        The file written (absolute), an :class:`~tdreplay.codec.exports.ExportedPath`:
        its ``rows`` were written, its ``skipped`` rows were live when the export began
        but overwritten or removed before their chunk was read (left out; also logged).

    Raises:
        InvalidRequest: the format is unknown, cannot be told from the suffix or
            contradicts it, or ``path`` is a folder.
        PathExists: ``replace`` is ``False`` and a file is at ``path`` (it is kept).
        TableClosed: the table is closed.
        InsufficientStorage: the disk (or quota) ran full; no file is left behind.
        BackendError: the file could not be written or the storage not read;
            no file is left behind.
    """
    path = Path(path).absolute()
    fmt = export_format(path, format, table.name)
    if path.is_dir():
        raise InvalidRequest(
            f"table {table.name!r}: export path {str(path)!r} is a folder",
            table=table.name,
            field="path",
            got=str(path),
        )
    if not replace:
        keep_existing(path, table.name)
    tmp = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        with on_full_disk(
            f"export of table {table.name!r}",
            path,
            table=table.name,
            cleanup=lambda: tmp.unlink(missing_ok=True),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            items = table.items()
            write = _write_parquet if fmt == "parquet" else _write_csv
            with progress_bar(
                progress, len(items), table.spec.item_nbytes, f"export {table.name}"
            ) as bar:
                dropped = write(table, tmp, items, bar)
            into_place(tmp, path, replace=replace, table=table.name)
    except (OSError, pa.ArrowException) as err:
        raise BackendError(
            f"table {table.name!r}: export to {str(path)!r} failed: {err}", table=table.name
        ) from err
    if dropped:
        log.warning(
            "table %r: %d of %d items were overwritten or removed during the export and are not in %s",
            table.name,
            dropped,
            len(items),
            path,
        )
    return ExportedPath.of(path, rows=len(items) - dropped, skipped=dropped)


def _parquet_schema(table: Table) -> pa.Schema:
    """The codec's schema for the table, with its name and spec (less the backend: the
    file describes the data, not where a server kept it) in the schema metadata."""
    fields = table.spec.torch_schema().items()
    empty = to_record_batch({k: torch.empty([0, *s], dtype=d) for k, (s, d) in fields}).schema
    spec = table.spec.model_dump_json(exclude={"backend"})
    return empty.with_metadata({"tdreplay.table": table.name, "tdreplay.spec": spec})


def _write_parquet(table: Table, path: Path, items: Items, bar: tqdm) -> int:
    rows = _chunk_rows(table.spec.item_nbytes, CHUNK_BYTES)
    written = 0
    with pq.ParquetWriter(path, _parquet_schema(table)) as writer:
        for data, read in items.chunks(rows):
            n = next(iter(data.values())).shape[0]
            if n:
                writer.write_batch(to_record_batch(data), row_group_size=n)
            written += n
            bar.update(read)
    return len(items) - written


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


def _write_csv(table: Table, path: Path, items: Items, bar: tqdm) -> int:
    fields: list[pa.Field] = []
    keys = table.spec.keys()
    for key, (shape, dtype) in table.spec.torch_schema().items():
        if dtype.is_floating_point:
            typ = pa.string()
        else:
            typ = ARROW[dtype]
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
        for data, read in items.chunks(rows):
            n = next(iter(data.values())).shape[0]
            if n:
                arrays = [a for key in keys for a in _csv_arrays(data[key])]
                w.write_table(pa.Table.from_arrays(arrays, schema=schema))
            written += n
            bar.update(read)
    return len(items) - written
