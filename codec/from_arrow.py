"""Arrow -> TensorDict: every column checked, then viewed (the format: :mod:`tdreplay.codec.arrow`).

Bytes from the network are untrusted: before a column is read, its lengths
and buffer sizes are checked against the bytes (Arrow's ``validate``, per
column, never per row); nesting, shapes, metadata and the column count are
bounded (:data:`~tdreplay.codec.format.MAX_NDIM`, ``MAX_DIM``,
``MAX_META_BYTES``, ``MAX_COLUMNS``). Whatever is wrong is a
:class:`~tdreplay.codec.format.CodecError` naming the column.

    >>> import pyarrow as pa
    >>> leaves = to_leaves(pa.record_batch({"next.done": pa.array([True, False])}))
    >>> leaves
    {('next', 'done'): tensor([ True, False])}
    >>> nest(leaves, 2)["next", "done"].tolist()
    [True, False]
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tensordict import TensorDict

from .dtypes import ARROW, NUMPY, TORCH
from .errors import CodecError
from .format import (
    ARROW_ERRORS,
    MAX_COLUMNS,
    MAX_DIM,
    MAX_META_BYTES,
    MAX_NDIM,
    META_DTYPE,
    META_SHAPE,
    SEP,
    NestedKey,
)

#: Arrow type -> dtype of a column without ``tdreplay.dtype`` metadata (a foreign client's)
_PLAIN: dict[pa.DataType, torch.dtype] = {
    arrow: dtype for dtype, arrow in ARROW.items() if dtype != torch.bfloat16
}
# torch has no uint16 in the list: a plain uint16 column is widened to int32, losslessly
_PLAIN[pa.uint16()] = torch.int32
_SHAPE = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\]", re.ASCII)


def _buffer_tensor(buf: pa.Buffer, dtype: torch.dtype, offset: int, count: int) -> torch.Tensor:
    np_dtype = NUMPY[dtype]
    arr = np.frombuffer(buf, dtype=np_dtype, count=count, offset=offset * np_dtype.itemsize)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # read-only numpy view: the tensor shares the source buffer
        t = torch.from_numpy(arr)
    return t.view(torch.bfloat16) if dtype == torch.bfloat16 else t


def _decode_values(values: pa.Array, dtype: torch.dtype, name: str) -> torch.Tensor:
    if values.null_count:
        raise CodecError(f"column {name!r} has {values.null_count} nulls", field=name)
    n = len(values)
    if n == 0:  # a zero-size field, or no rows: there may be no data buffer at all
        return torch.empty(0, dtype=dtype)
    if pa.types.is_boolean(values.type):
        bits = np.frombuffer(values.buffers()[1], dtype=np.uint8)
        unpacked = np.unpackbits(bits, bitorder="little", count=values.offset + n)[values.offset :]
        return torch.from_numpy(unpacked.astype(np.bool_))
    if values.type == pa.uint16() and dtype != torch.bfloat16:
        return torch.from_numpy(values.to_numpy(zero_copy_only=False).astype(np.int32))
    if values.type not in _PLAIN:
        raise CodecError(f"column {name!r}: Arrow type {values.type} is not supported", field=name)
    return _buffer_tensor(values.buffers()[1], dtype, values.offset, n)


def _meta_text(meta: Mapping[bytes, bytes], key: bytes, name: str) -> str | None:
    raw = meta.get(key)
    if raw is None:
        return None
    what = key.decode()
    if len(raw) > MAX_META_BYTES:
        raise CodecError(
            f"column {name!r}: {what} metadata of {len(raw)} bytes (at most {MAX_META_BYTES})",
            field=name,
        )
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        raise CodecError(
            f"column {name!r}: {what} metadata {raw[:40]!r} is not ASCII", field=name
        ) from None


def _declared_shape(text: str, name: str) -> list[int]:
    """The item shape a ``tdreplay.shape`` value (``"[84, 84, 4]"``) declares."""
    if not _SHAPE.fullmatch(text.strip()):
        raise CodecError(
            f"column {name!r}: bad shape metadata {text[:80]!r} (expected a list of integers >= 0)",
            field=name,
        )
    shape = [int(d) for d in re.findall(r"\d+", text)]
    _check_shape(shape, name, "shape metadata")
    return shape


def _check_shape(shape: list[int], name: str, what: str) -> None:
    if len(shape) > MAX_NDIM:
        raise CodecError(
            f"column {name!r}: {what} has {len(shape)} dimensions (at most {MAX_NDIM})", field=name
        )
    if any(d > MAX_DIM for d in shape) or math.prod(shape) > MAX_DIM:
        raise CodecError(
            f"column {name!r}: {what} {shape[:8]} is too large (at most {MAX_DIM} elements per item)",
            field=name,
        )


def _dtype(base: pa.DataType, meta: Mapping[bytes, bytes], name: str) -> torch.dtype:
    """The dtype of a column whose (innermost) values are of Arrow type ``base``."""
    dname = _meta_text(meta, META_DTYPE, name)
    if dname is None:
        if base not in _PLAIN:
            raise CodecError(f"column {name!r}: Arrow type {base} is not supported", field=name)
        return _PLAIN[base]
    if dname not in TORCH:
        raise CodecError(f"column {name!r}: unknown dtype {dname[:40]!r} in metadata", field=name)
    dtype = TORCH[dname]
    if ARROW[dtype] != base:
        raise CodecError(
            f"column {name!r}: metadata says {dname} but the Arrow type is {base} "
            f"(a {dname} column travels as {ARROW[dtype]})",
            field=name,
        )
    return dtype


def from_column(f: pa.Field, arr: pa.Array) -> torch.Tensor:
    """Decode one Arrow column into a tensor ``[N, *shape]``.

    Raises:
        CodecError: the column is malformed (buffers too small, lengths that
            disagree), holds nulls, is of a type with no tensor dtype, nests
            deeper than :data:`~tdreplay.codec.format.MAX_NDIM`, or its
            metadata is unreadable or disagrees with its type.
    """
    name = f.name
    try:
        arr.validate()  # O(nesting depth): buffer sizes and child lengths, before anything reads them
    except ARROW_ERRORS as err:
        raise CodecError(f"column {name!r} is malformed: {err}", field=name) from None
    meta = f.metadata or {}
    n = len(arr)
    shape: list[int] = []
    values = arr
    while pa.types.is_fixed_size_list(values.type):
        if len(shape) == MAX_NDIM:
            raise CodecError(
                f"column {name!r}: fixed-size lists nested deeper than {MAX_NDIM}", field=name
            )
        if values.null_count:
            raise CodecError(f"column {name!r} has {values.null_count} nulls", field=name)
        size = values.type.list_size
        shape.append(size)
        # the child array ignores the list's offset and length: slice it to this list's rows
        values = values.values.slice(values.offset * size, len(values) * size)
    _check_shape(shape, name, "list nesting")
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        raise CodecError(
            f"column {name!r}: variable-size lists are not supported; use fixed_size_list",
            field=name,
        )
    dtype = _dtype(values.type, meta, name)
    text = _meta_text(meta, META_SHAPE, name)
    if text is not None:
        declared = _declared_shape(text, name)
        if math.prod(declared) != math.prod(shape):
            raise CodecError(
                f"column {name!r}: shape metadata {declared} does not match list size {math.prod(shape)}",
                field=name,
            )
        shape = declared
    flat = _decode_values(values, dtype, name)
    if len(flat) != n * math.prod(shape):
        raise CodecError(
            f"column {name!r}: {len(flat)} values for {n} rows of shape {shape}", field=name
        )
    return flat.reshape([n, *shape])


def to_leaves(rb: pa.RecordBatch | pa.Table) -> dict[NestedKey, torch.Tensor]:
    """``{nested key: tensor}`` for every column of ``rb``.

    Raises:
        CodecError: more than :data:`~tdreplay.codec.format.MAX_COLUMNS`
            columns, a column name that is empty or has an empty part
            (``"a..b"``), twice the same name, a name that is another's prefix
            (``x`` and ``x.y``), a column whose length is not the batch's row
            count, or a column :func:`from_column` cannot decode.
    """
    if rb.num_columns > MAX_COLUMNS:
        raise CodecError(f"{rb.num_columns} columns (at most {MAX_COLUMNS})")
    out = {}
    for i, f in enumerate(rb.schema):
        try:
            f.name  # noqa: B018 - pyarrow decodes the name here
        except UnicodeDecodeError:
            raise CodecError(f"column #{i}: the name is not UTF-8") from None
        col = rb.column(i)
        if len(col) != rb.num_rows:
            raise CodecError(
                f"column {f.name!r} has {len(col)} rows, the record batch says {rb.num_rows}",
                field=f.name,
            )
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        key = tuple(f.name.split(SEP))
        if not all(key):
            raise CodecError(f"column {f.name!r}: empty key part", field=f.name)
        if key in out:
            raise CodecError(f"column {f.name!r} appears twice", field=f.name)
        out[key] = from_column(f, col)
    # ``x`` and ``x.y`` cannot both be leaves (a TensorDict would keep only one of them)
    for key in out:
        for i in range(1, len(key)):
            if key[:i] in out:
                name, prefix = SEP.join(key), SEP.join(key[:i])
                raise CodecError(
                    f"column {name!r} clashes with column {prefix!r} (a leaf cannot hold keys)",
                    field=name,
                )
    return out


def nest(leaves: Mapping[NestedKey, torch.Tensor], n: int) -> TensorDict:
    """A TensorDict of batch ``[n]`` holding ``leaves`` (the tensors themselves, not copies).

    Nothing is checked again: every tensor must have ``n`` rows, and no key
    may be another's prefix, as :func:`to_leaves` ensures. A caller nesting
    the same keys again and again works the tree out once (:func:`key_tree`)
    and builds with :func:`nest_by`.
    """
    return nest_by(key_tree(list(leaves)), leaves, torch.Size([n]))


def nest_by(tree: dict[str, Any], leaves: Mapping[NestedKey, Any], batch: torch.Size) -> TensorDict:
    """:func:`nest` with the key tree worked out already (:func:`key_tree` of ``leaves``' keys)."""
    return TensorDict._new_unsafe(fill(tree, leaves), batch_size=batch)


def key_tree(keys: list[NestedKey]) -> dict[str, Any]:
    """``{"next": {"reward": ("next", "reward")}, ...}``: where each flat key sits when nested.

    >>> key_tree([("obs",), ("next", "reward")])
    {'obs': ('obs',), 'next': {'reward': ('next', 'reward')}}
    """
    tree: dict[str, Any] = {}
    for key in keys:
        node = tree
        for part in key[:-1]:
            node = node.setdefault(part, {})
        node[key[-1]] = key
    return tree


def fill(tree: dict[str, Any], flat: Mapping[NestedKey, Any]) -> dict[str, Any]:
    """The nested dict of ``flat``'s values laid out as ``tree`` (see :func:`key_tree`)."""
    return {k: flat[v] if isinstance(v, tuple) else fill(v, flat) for k, v in tree.items()}


def from_record_batch(rb: pa.RecordBatch | pa.Table) -> TensorDict:
    """Decode a record batch into a TensorDict of batch ``[num_rows]`` (views on its buffers).

    Raises:
        CodecError: a column cannot be decoded, or one column's key is a
            prefix of another's (see :func:`to_leaves`).
    """
    return nest(to_leaves(rb), rb.num_rows)


def _open(
    data: bytes | bytearray | memoryview | pa.Buffer,
) -> tuple[pa.ipc.RecordBatchStreamReader, pa.BufferReader]:
    buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
    source = pa.BufferReader(buffer)
    try:
        _refuse_compression(buffer)
        return pa.ipc.open_stream(source), source
    except CodecError:
        raise
    except ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream: {err}") from None


def _refuse_compression(buffer: pa.Buffer) -> None:
    """Refuse a stream whose batches have compressed buffers, before pyarrow decompresses
    them into memory sized by what the body declares (16 KiB of ZSTD zeros: 512 MiB of
    rows), past every limit on the bytes a client sends. tdreplay never compresses.

    Raises:
        CodecError: a record batch or dictionary batch names a body compression.
    """
    messages = pa.ipc.MessageReader.open_stream(buffer)
    while True:
        try:
            message = messages.read_next_message()
        except StopIteration:
            return
        batch = message.type in ("record batch", "dictionary batch")
        if batch and _names_compression(memoryview(message.metadata), message.type):
            raise CodecError(
                "Arrow IPC stream with compressed buffers (LZ4 or ZSTD): send the "
                "buffers uncompressed (IpcWriteOptions(compression=None))",
                field="body",
            )


def _names_compression(fb: memoryview, kind: str) -> bool:
    """Whether the ``Message`` flatbuffer ``fb`` (checked by pyarrow) of a ``kind`` message
    has a ``compression`` in its ``RecordBatch`` (a dictionary batch's ``data``)."""

    def u32(at: int) -> int:
        return int.from_bytes(fb[at : at + 4], "little")

    def field(table: int, i: int) -> int:  # a table's i-th field, absolute (0: absent)
        vtable = table - int.from_bytes(fb[table : table + 4], "little", signed=True)
        at = 4 + 2 * i
        if at >= int.from_bytes(fb[vtable : vtable + 2], "little"):
            return 0
        off = int.from_bytes(fb[vtable + at : vtable + at + 2], "little")
        return table + off if off else 0

    def child(table: int, i: int) -> int:  # the table a table's i-th field points to
        at = field(table, i)
        return at + u32(at) if at else 0

    batch = child(u32(0), 2)  # Message.header
    if batch and kind == "dictionary batch":
        batch = child(batch, 1)  # DictionaryBatch.data
    return bool(batch) and bool(field(batch, 3))  # RecordBatch.compression


def read_batches(data: bytes | bytearray | memoryview | pa.Buffer) -> list[pa.RecordBatch]:
    """All record batches of an Arrow IPC stream.

    Raises:
        CodecError: the bytes are not an Arrow IPC stream.
    """
    reader, _ = _open(data)
    try:
        return list(reader)
    except ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream: {err}") from None


def read_one(data: bytes | bytearray | memoryview | pa.Buffer) -> pa.RecordBatch:
    """The one record batch of an Arrow IPC stream (stops reading at a second one).

    Raises:
        CodecError: the bytes are not an Arrow IPC stream, hold no record
            batch or several, or go on after the stream's end.
    """
    reader, source = _open(data)
    try:
        batch = reader.read_next_batch()
    except StopIteration:
        raise CodecError("expected one record batch, got 0") from None
    except ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream: {err}") from None
    try:
        reader.read_next_batch()
    except StopIteration:
        extra = source.size() - source.tell()
        if extra:
            raise CodecError(f"{extra} bytes after the end of the Arrow IPC stream") from None
        return batch
    except ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream after the record batch: {err}") from None
    raise CodecError("expected one record batch, got 2 or more")


def decode(data: bytes | bytearray | memoryview | pa.Buffer) -> TensorDict:
    """Decode an Arrow IPC stream of one record batch into a TensorDict.

    The tensors are views on ``data`` (bool columns excepted); copy them if
    ``data`` is about to be reused.

    Raises:
        CodecError: the stream is malformed, holds no batch or several, or a
            column cannot be decoded (see :func:`to_leaves`).
    """
    return from_record_batch(read_one(data))
