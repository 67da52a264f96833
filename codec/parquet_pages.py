"""A Parquet file's page sizes, read from its page headers before any page is decompressed.

pyarrow decompresses a page whole, and holds one page of each column it reads at once: a
page's header declares how many bytes it decompresses to, and a few KB of zstd or
run-length-encoded values can declare hundreds of MB (a 10 KB file held one page of 40M
float64 zeros: 320 MB). Every reader of a file from elsewhere (the Parquet import,
:mod:`.parquet_read`; Minari's Parquet format, :mod:`.minari_parquet`) opens it with
:func:`open_parquet` (the file read a buffer at a time, never a column chunk whole) and
refuses, with :func:`largest_pages`, a row group whose largest pages, one per column read,
decompress past the import's ``max_batch_bytes``: the page headers are Thrift, walked here
(no value is read).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from .protocol import READ_BYTES, over_batch_bytes

__all__ = ["largest_pages", "open_parquet"]

#: bytes of a file pyarrow reads at a time (a page larger than it: the page)
BUFFER = 1 << 20
#: a page header's nesting at most (statistics are two levels down)
DEPTH = 8
#: bytes of a page header read at first (statistics of long strings: more)
HEAD = 512


def open_parquet(path: str | Path, **footer: int) -> pq.ParquetFile:
    """``path`` opened to be read :data:`BUFFER` at a time: pyarrow's default (``pre_buffer``)
    reads each column chunk of a row group whole before decoding it, so one row group of an
    honest 160 MB file grew the reader by 167 MB (21 MB read this way). ``footer``: the
    limits of pyarrow's footer reader (``thrift_container_size_limit``, ...), its own by
    default (a plain file may honestly hold 100,000 row groups: one per write)."""
    return pq.ParquetFile(path, buffer_size=BUFFER, pre_buffer=False, **footer)


def largest_pages(
    path: str | Path, pf: pq.ParquetFile, counts: Sequence[tuple[int, int | None]], limit: int
) -> list[list[int]]:
    """For each row group of ``pf`` (the file at ``path``), the bytes the largest page of each
    leaf column of ``counts`` decompresses to, from the page headers.

    Args:
        counts: ``(leaf column, values a row)`` pairs; ``None``: the values a row are not
            known (a list of any length), so its pages' values are not checked.
        limit: the bytes a row group's largest pages, one per column of ``counts``, may
            decompress to together (``max_batch_bytes``).

    Raises:
        ValueError: a row group's largest pages decompress past ``limit`` (named with the
            wording of :func:`~tdreplay.codec.protocol.over_batch_bytes`); a page lies past
            its column chunk, holds more values than its rows can, or its header is not
            Parquet's.
    """
    meta = pf.metadata
    groups = []
    with open(path, "rb") as f:  # read with pread, not mapped: a mapping's pages count as RSS
        fd, size = f.fileno(), os.fstat(f.fileno()).st_size
        for g in range(meta.num_row_groups):
            group = meta.row_group(g)
            largest = [
                _pages(fd, size, path, group.column(c), group.num_rows, n) for c, n in counts
            ]
            if sum(largest) > limit:
                worst = max(range(len(largest)), key=largest.__getitem__)
                raise ValueError(
                    f"{path}: row group {g}'s largest pages, one per column, decompress to "
                    f"{sum(largest)} bytes (column "
                    f"{group.column(counts[worst][0]).path_in_schema!r}: {largest[worst]}), "
                    f"{over_batch_bytes(limit)} (pyarrow decompresses a page whole, one of "
                    "each column at once)"
                )
            groups.append(largest)
    return groups


def _pages(fd: int, size: int, path: str | Path, column: Any, rows: int, count: int | None) -> int:
    """The largest page's bytes decompressed of a column chunk of the file ``fd`` (of
    ``size`` bytes), from its page headers; its pages' values checked against ``rows`` (a
    step's ``count`` of values known)."""
    start = column.dictionary_page_offset or column.data_page_offset
    end = start + column.total_compressed_size
    where = f"{path}: column {column.path_in_schema!r}"
    if start < 0 or column.total_compressed_size < 0 or end > size:
        raise ValueError(f"{where}: its pages lie outside the file ({start}:{end})")
    largest = values = 0
    at = start
    while at < end:
        size, stored, n, body = _page_header(fd, at, end, where)
        if body + stored > end:
            raise ValueError(f"{where}: the page at byte {at} runs past its column chunk")
        values += n
        largest = max(largest, size)
        at = body + stored
    if count is not None and values > rows * max(count, 1):
        raise ValueError(f"{where}: its pages hold {values} values for {rows} rows")
    return largest


def _page_header(fd: int, at: int, end: int, where: str) -> tuple[int, int, int, int]:
    """A page header's ``(bytes decompressed, bytes stored, values, where its bytes start)``
    (Thrift compact protocol, ``PageHeader`` of ``parquet.thrift``: fields 2 and 3; a data
    page header's, field 5 or 8, field 1). One loop over the header's fields: a generic
    reader took most of an honest import's checking time."""
    head = HEAD
    while True:
        buf = os.pread(fd, min(head, end - at), at)
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


def _varint(buf: Any, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if shift > 63:
            raise ValueError(f"a page header's integer runs past 64 bits at byte {at}")
        byte = buf[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def _int(buf: Any, at: int) -> tuple[int, int]:
    n, at = _varint(buf, at)
    return (n >> 1) ^ -(n & 1), at


def _value(buf: Any, at: int, kind: int, depth: int) -> tuple[Any, int]:
    """A Thrift compact-protocol value of type ``kind`` at ``at``: an integer or a struct's
    ``{field id: value}`` (what a page header's sizes need); others skipped as ``None``."""
    if kind in (1, 2):  # a struct field's bool: in its type
        return kind == 1, at
    if kind == 3:
        return None, at + 1
    if kind in (4, 5, 6):
        return _int(buf, at)
    if kind == 7:
        return None, at + 8
    if kind == 8:
        n, at = _varint(buf, at)
        return None, at + n
    if kind in (9, 10):  # list, set
        head, at = buf[at], at + 1
        n, item = head >> 4, head & 0x0F
        if n == 15:
            n, at = _varint(buf, at)
        for _ in range(n):
            at = at + 1 if item in (1, 2) else _value(buf, at, item, depth + 1)[1]
        return None, at
    if kind == 11:  # map
        n, at = _varint(buf, at)
        if n:
            types, at = buf[at], at + 1
            for _ in range(n):
                for item in (types >> 4, types & 0x0F):
                    at = at + 1 if item in (1, 2) else _value(buf, at, item, depth + 1)[1]
        return None, at
    if kind == 12:
        return _struct(buf, at, depth + 1)
    raise ValueError(f"a page header holds a Thrift value of type {kind} at byte {at}")


def _struct(buf: Any, at: int, depth: int) -> tuple[dict[int, Any], int]:
    if depth > DEPTH:
        raise ValueError(f"a page header nests deeper than {DEPTH} at byte {at}")
    found: dict[int, Any] = {}
    last = 0
    while True:
        head, at = buf[at], at + 1
        if head == 0:
            return found, at
        delta, kind = head >> 4, head & 0x0F
        if delta:
            last += delta
        else:
            last, at = _int(buf, at)
        found[last], at = _value(buf, at, kind, depth)
