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
  column chunk's page headers (Thrift, before each page's bytes; no value is read): pyarrow
  decompresses a page whole and holds one page of each column at once, so a row group whose
  largest pages, one per column, decompress to more than ``max_batch_bytes`` is refused, as
  is a page count of values above the rows times a step's values. A row group is never read
  whole: ``iter_batches`` decodes :data:`~tdreplay.codec.minari_hdf5.READ_BYTES` of rows at a
  time (a step's width from the schema; a string's or binary's, such as a JPEG frame's, is at
  most its column's largest page), decoded as Minari decodes them, JPEG frames checked from
  their headers.

The files are those :func:`~tdreplay.codec.dataset_links.check_inside` vetted: no link out.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from .minari_arrow import check_widths, checked_steps, episode_files, episode_pieces
from .minari_hdf5 import READ_BYTES, rows_at_once
from .protocol import MAX_BATCH_BYTES, over_batch_bytes

if TYPE_CHECKING:  # the datasets extra's: imported where a dataset is read (as Minari's own)
    import gymnasium as gym

__all__ = ["parquet_pieces", "parquet_steps"]

#: what a footer's Thrift may hold: no honest footer lists more row groups or columns, nor
#: holds longer strings (statistics, the Arrow schema) than a read at a time
FOOTER = {"thrift_container_size_limit": 1 << 16, "thrift_string_size_limit": READ_BYTES}
#: bytes of a file pyarrow reads at a time (a page larger than it: the page)
BUFFER = 1 << 20
#: a page header's nesting at most (statistics are two levels down)
DEPTH = 8
#: bytes of a page header read at first (statistics of long strings: more)
HEAD = 512


def _open(path: Path) -> pq.ParquetFile:
    return pq.ParquetFile(path, buffer_size=BUFFER, **FOOTER)


def parquet_steps(data: Path, dataset_id: str, episodes: int, total_steps: int) -> None:
    """Refuse a Parquet dataset whose episodes hold other numbers of steps than its metadata
    (:func:`~tdreplay.codec.minari_arrow.checked_steps`), counting rows from footers only."""

    def rows_of(path: Path) -> int:
        with _open(path) as pf:
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
    :data:`~tdreplay.codec.minari_hdf5.READ_BYTES` at a time), as
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
        files = [_open(f) for f in paths]
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
    from the schema and the page headers, each row group's pages checked against ``limit``."""
    widths = _widths(pf.schema_arrow)
    meta = pf.metadata
    if len(widths) != meta.num_columns:
        raise ValueError(
            f"{path}: its Arrow schema has {len(widths)} leaf columns, its footer "
            f"{meta.num_columns}"
        )
    step = 1
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            largest = [
                _pages(m, path, group.column(c), group.num_rows, n)
                for c, (n, _) in enumerate(widths)
            ]
            if sum(largest) > limit:
                worst = max(range(len(largest)), key=largest.__getitem__)
                raise ValueError(
                    f"{path}: row group {g}'s largest pages, one per column, decompress to "
                    f"{sum(largest)} bytes (column {group.column(worst).path_in_schema!r}: "
                    f"{largest[worst]}), {over_batch_bytes(limit)} (pyarrow decompresses a "
                    "page whole, one of each column at once)"
                )
            step = max(
                step, sum(p if w is None else w for (_, w), p in zip(widths, largest, strict=True))
            )
    return step


def _pages(m: mmap.mmap, path: Path, column: Any, rows: int, count: int | None) -> int:
    """The largest page's bytes decompressed of a column chunk, from its page headers; its
    pages' values checked against ``rows`` (a step's ``count`` of values known)."""
    start = column.dictionary_page_offset or column.data_page_offset
    end = start + column.total_compressed_size
    where = f"{path}: column {column.path_in_schema!r}"
    if start < 0 or column.total_compressed_size < 0 or end > len(m):
        raise ValueError(f"{where}: its pages lie outside the file ({start}:{end})")
    largest = values = 0
    at = start
    while at < end:
        size, stored, n, body = _page_header(m, at, end, where)
        if body + stored > end:
            raise ValueError(f"{where}: the page at byte {at} runs past its column chunk")
        values += n
        largest = max(largest, size)
        at = body + stored
    if count is not None and values > rows * max(count, 1):
        raise ValueError(f"{where}: its pages hold {values} values for {rows} rows")
    return largest


def _page_header(m: mmap.mmap, at: int, end: int, where: str) -> tuple[int, int, int, int]:
    """A page header's ``(bytes decompressed, bytes stored, values, where its bytes start)``
    (Thrift compact protocol, ``PageHeader`` of ``parquet.thrift``: fields 2 and 3; a data
    page header's, field 5 or 8, field 1). One loop over the header's fields: a generic
    reader took most of an honest import's checking time."""
    head = HEAD
    while True:
        buf = m[at : min(at + head, end)]
        try:
            top, values, length = _fields(buf)
            break
        except IndexError:  # past the bytes read: read more, up to the column chunk's end
            if at + head >= end or head >= READ_BYTES:
                raise ValueError(
                    f"{where}: the page header at byte {at} runs past its column chunk"
                ) from None
            head *= 16
    size, stored = top.get(2), top.get(3)
    if size is None or stored is None or size < 0 or stored < 0 or values < 0:
        raise ValueError(f"{where}: a page header at byte {at} without its sizes")
    return size, stored, values, at + length


def _fields(buf: bytes) -> tuple[dict[int, int], int, int]:
    """The top struct's integer fields, a data page header's values, and the header's
    length, of the header at the start of ``buf`` (``IndexError``: it runs past ``buf``)."""
    top: dict[int, int] = {}
    values = 0
    last, outer = [0], [0]  # per struct level: the last field's id, the struct's own id
    at = 0
    while True:
        head = buf[at]
        at += 1
        if head == 0:
            last.pop()
            outer.pop()
            if not last:
                return top, values, at
            continue
        kind = head & 0x0F
        if head >> 4:
            last[-1] += head >> 4
        else:
            n, at = _varint(buf, at)
            last[-1] = (n >> 1) ^ -(n & 1)
        if kind in (4, 5, 6):
            n = shift = 0
            while True:
                byte = buf[at]
                at += 1
                n |= (byte & 0x7F) << shift
                shift += 7
                if not byte & 0x80 or shift > 63:
                    break
            n = (n >> 1) ^ -(n & 1)
            if len(last) == 1:
                top[last[-1]] = n
            elif len(last) == 2 and outer[-1] in (5, 8) and last[-1] == 1:
                values = n  # DataPageHeader(V2).num_values
        elif kind == 12:
            if len(last) >= DEPTH:
                raise ValueError(f"a page header nests deeper than {DEPTH}")
            outer.append(last[-1])
            last.append(0)
        elif kind == 8:
            n, at = _varint(buf, at)
            at += n
        elif kind == 3:
            at += 1
        elif kind == 7:
            at += 8
        elif kind not in (1, 2):  # lists, sets, maps: no page header of Parquet's holds one
            at = _value(buf, at, kind, len(last))[1]


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


def _varint(m: Any, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if shift > 63:
            raise ValueError(f"a page header's integer runs past 64 bits at byte {at}")
        byte = m[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _int(m: Any, at: int) -> tuple[int, int]:
    n, at = _varint(m, at)
    return (n >> 1) ^ -(n & 1), at


def _value(m: Any, at: int, kind: int, depth: int) -> tuple[Any, int]:
    """A Thrift compact-protocol value of type ``kind`` at ``at``: an integer or a struct's
    ``{field id: value}`` (what a page header's sizes need); others skipped as ``None``."""
    if kind in (1, 2):  # a struct field's bool: in its type
        return kind == 1, at
    if kind == 3:
        return None, at + 1
    if kind in (4, 5, 6):
        return _int(m, at)
    if kind == 7:
        return None, at + 8
    if kind == 8:
        n, at = _varint(m, at)
        return None, at + n
    if kind in (9, 10):  # list, set
        head, at = m[at], at + 1
        n, item = head >> 4, head & 0x0F
        if n == 15:
            n, at = _varint(m, at)
        for _ in range(n):
            at = at + 1 if item in (1, 2) else _value(m, at, item, depth + 1)[1]
        return None, at
    if kind == 11:  # map
        n, at = _varint(m, at)
        if n:
            types, at = m[at], at + 1
            for _ in range(n):
                for item in (types >> 4, types & 0x0F):
                    at = at + 1 if item in (1, 2) else _value(m, at, item, depth + 1)[1]
        return None, at
    if kind == 12:
        return _struct(m, at, depth + 1)
    raise ValueError(f"a page header holds a Thrift value of type {kind} at byte {at}")


def _struct(m: Any, at: int, depth: int) -> tuple[dict[int, Any], int]:
    if depth > DEPTH:
        raise ValueError(f"a page header nests deeper than {DEPTH} at byte {at}")
    found: dict[int, Any] = {}
    last = 0
    while True:
        head, at = m[at], at + 1
        if head == 0:
            return found, at
        delta, kind = head >> 4, head & 0x0F
        if delta:
            last += delta
        else:
            last, at = _int(m, at)
        found[last], at = _value(m, at, kind, depth)
