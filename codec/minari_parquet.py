"""A Minari Parquet dataset's episodes read a slice of steps at a time, their sizes checked first.

Minari's Parquet format is its Arrow format (:mod:`tdreplay.codec.minari_arrow`) written as
Parquet: ``data/<id>/`` holds an episode's ``T + 1`` rows as Parquet files beside its
``metadata.json``. A page may be compressed and its values dictionary- or run-length-encoded:
a few KB hold millions of rows of zeros, and Minari's ``iterate_episodes`` decoded each episode
whole. Here, as for Arrow, memory follows the import's chunk:

* :func:`parquet_steps` counts each episode's rows from its files' footers (never a value)
  against the metadata (:func:`~tdreplay.codec.minari_arrow.checked_steps`).
* :func:`parquet_pieces` checks each part's values per step, from the schema, against the
  table's fields (:func:`~tdreplay.codec.minari_arrow.check_widths`), and walks every
  column chunk's page headers (:mod:`tdreplay.codec.parquet_pages`: Thrift, before each
  page's bytes; no value is read): pyarrow
  decompresses a page whole and holds one page of each column at once, so a row group whose
  largest pages, one per column, decompress to more than ``max_batch_bytes`` is refused, as
  is a page count of values above the rows times a step's values. A row group is never read
  whole: ``iter_batches`` decodes :data:`~tdreplay.codec.protocol.READ_BYTES` of rows at a
  time (a step's width from the schema; a string's or binary's, such as a JPEG frame's, is at
  most its column's largest page), decoded as Minari decodes them, JPEG frames checked from
  their headers.

The files are those :func:`~tdreplay.codec.dataset_links.check_inside` vetted: no link out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from .minari_arrow import check_widths, checked_steps, episode_files, episode_pieces
from .minari_hdf5 import rows_at_once
from .parquet_pages import largest_pages, open_parquet
from .protocol import MAX_BATCH_BYTES, READ_BYTES

if TYPE_CHECKING:  # the datasets extra's: imported where a dataset is read (as Minari's own)
    import gymnasium as gym

__all__ = ["parquet_pieces", "parquet_steps"]

#: what a footer's Thrift may hold: no honest footer lists more row groups or columns, nor
#: holds longer strings (statistics, the Arrow schema) than a read at a time
FOOTER = {"thrift_container_size_limit": 1 << 16, "thrift_string_size_limit": READ_BYTES}


def parquet_steps(data: Path, dataset_id: str, episodes: int, total_steps: int) -> None:
    """Refuse a Parquet dataset whose episodes hold other numbers of steps than its metadata
    (:func:`~tdreplay.codec.minari_arrow.checked_steps`), counting rows from footers only."""

    def rows_of(path: Path) -> int:
        with open_parquet(path, **FOOTER) as pf:
            return int(pf.metadata.num_rows)

    checked_steps(data, dataset_id, episodes, total_steps, rows_of)


def parquet_pieces(
    data: Path,
    episodes: int,
    spaces: tuple[gym.Space, gym.Space],
    jpeg: bool,
    rows: int,
    fields: Mapping[str, Any],
    max_batch_bytes: int = MAX_BATCH_BYTES,
) -> Iterator[tuple[int, int, SimpleNamespace]]:
    """Each episode as pieces of at most ``rows`` steps (fewer where a step is wide:
    :data:`~tdreplay.codec.protocol.READ_BYTES` at a time), as
    :func:`~tdreplay.codec.minari_hdf5.pieces` yields them.

    Raises:
        SchemaError: a part's values per step disagree with the table's ``fields``, before
            a value is read.
        ValueError, TypeError, KeyError, OSError: the files are not Minari's layout (a page
            past its column chunk, a page holding more values than its rows can), or a row
            group's largest pages, one per column, decompress to more than ``max_batch_bytes``.
    """
    for i in range(episodes):
        paths = episode_files(data, i)
        files = [open_parquet(f, **FOOTER) for f in paths]
        try:
            step = 1
            for path, pf in zip(paths, files, strict=True):
                check_widths(i, pf.schema_arrow, spaces, jpeg, fields)
                step = max(step, _step_bytes(path, pf, max_batch_bytes))
            at_once = rows_at_once(rows, step)
            batches = (
                b for pf in files for b in pf.iter_batches(batch_size=at_once, use_threads=False)
            )
            yield from episode_pieces(data / str(i), i, batches, at_once, spaces, jpeg)
        finally:
            for pf in files:
                pf.close()


def _step_bytes(path: Path, pf: pq.ParquetFile, limit: int) -> int:
    """A step's bytes decoded, at most (a string's or binary's: its column's largest page),
    from the schema and the page headers, each row group's pages checked against ``limit``
    (:func:`~tdreplay.codec.parquet_pages.largest_pages`)."""
    widths = _widths(pf.schema_arrow)
    if len(widths) != pf.metadata.num_columns:
        raise ValueError(
            f"{path}: its Arrow schema has {len(widths)} leaf columns, its footer "
            f"{pf.metadata.num_columns}"
        )
    counts = [(c, n) for c, (n, _) in enumerate(widths)]
    step = 1
    for largest in largest_pages(path, pf, counts, limit):
        step = max(
            step, sum(p if w is None else w for (_, w), p in zip(widths, largest, strict=True))
        )
    return step


def _widths(schema: pa.Schema) -> list[tuple[int | None, int | None]]:
    """Each leaf column's values and bytes a row, decoded (``None``: of variable length),
    in the order of the footer's columns."""

    def leaves(kind: pa.DataType, count: int | None) -> list[tuple[int | None, int | None]]:
        if pa.types.is_struct(kind):
            return [w for child in kind for w in leaves(child.type, count)]
        if pa.types.is_fixed_size_list(kind):
            return leaves(kind.value_type, None if count is None else count * kind.list_size)
        if pa.types.is_map(kind):
            return leaves(kind.key_type, None) + leaves(kind.item_type, None)
        if pa.types.is_list(kind) or pa.types.is_large_list(kind):
            return leaves(kind.value_type, None)
        if pa.types.is_dictionary(kind):
            return leaves(kind.value_type, None)
        try:
            bits = kind.bit_width
        except ValueError:  # strings, binary: of variable length
            return [(count, None)]
        return [(count, None if count is None else count * max(bits // 8, 1))]

    return [w for field in schema for w in leaves(field.type, 1)]
