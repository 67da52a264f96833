"""TensorDict <-> Arrow, the one wire and file format of tdreplay.

A TensorDict of batch ``[N]`` becomes one Arrow record batch of ``N`` rows:

* one column per leaf; nested keys joined with ``"."`` (``next.reward``);
* a scalar-per-row field is a primitive column; a field of shape ``[d0, d1, ...]``
  is a ``fixed_size_list<d0*d1*...>`` column, row-major, with the shape kept in
  the field metadata (``tdreplay.shape``, e.g. ``"[84, 84, 4]"``);
* dtypes map to Arrow types one to one: bool -> ``bool``, uint8..int64 ->
  ``uint8..int64``, float16 -> ``halffloat``, float32/64 -> ``float``/``double``;
  Arrow has no bfloat16, so a bfloat16 field travels as ``uint16`` holding the
  same bits, with ``tdreplay.dtype = "bfloat16"`` in the field metadata.

Every dtype round-trips exactly. Decoding is zero-copy for every type but
bool (Arrow packs bools into bits): the tensors are views on the source buffer.
A foreign client (pyarrow, no tdreplay) may send nested fixed-size lists
instead of flat ones and may omit the metadata; the shape is then read from
the list nesting.

Bytes from the network are untrusted: before a column is read, its lengths
and buffer sizes are checked against the bytes (Arrow's ``validate``, per
column, never per row); nesting, shapes, metadata and the column count are
bounded (:data:`MAX_NDIM`, :data:`MAX_DIM`, :data:`MAX_META_BYTES`,
:data:`MAX_COLUMNS`). Whatever is wrong is a :class:`CodecError` naming the
column.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.arange(6.).reshape(2, 3),
    ...                  "next": {"done": torch.tensor([[True], [False]])}}, batch_size=[2])
    >>> back = decode(encode(td))
    >>> bool((back == td).all()), back["obs"].dtype, back["next", "done"].dtype
    (True, torch.float32, torch.bool)
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tensordict import TensorDict, TensorDictBase, is_tensorclass

SEP = "."
META_DTYPE = b"tdreplay.dtype"
META_SHAPE = b"tdreplay.shape"

_TO_ARROW: dict[torch.dtype, pa.DataType] = {
    torch.bool: pa.bool_(),
    torch.uint8: pa.uint8(),
    torch.int8: pa.int8(),
    torch.int16: pa.int16(),
    torch.int32: pa.int32(),
    torch.int64: pa.int64(),
    torch.float16: pa.float16(),
    torch.bfloat16: pa.uint16(),
    torch.float32: pa.float32(),
    torch.float64: pa.float64(),
}
_FROM_ARROW: dict[pa.DataType, torch.dtype] = {
    v: k for k, v in _TO_ARROW.items() if k != torch.bfloat16
}
_FROM_ARROW[pa.uint16()] = torch.int32  # a plain uint16 column (no metadata) widens losslessly
_NUMPY: dict[torch.dtype, Any] = {
    torch.uint8: np.uint8,
    torch.int8: np.int8,
    torch.int16: np.int16,
    torch.int32: np.int32,
    torch.int64: np.int64,
    torch.float16: np.float16,
    torch.float32: np.float32,
    torch.float64: np.float64,
}
_DTYPE_NAMES = {d: str(d).removeprefix("torch.") for d in _TO_ARROW}
_DTYPES_BY_NAME = {v: k for k, v in _DTYPE_NAMES.items()}


class CodecError(ValueError):
    """The bytes are not a tdreplay-compatible Arrow IPC stream, or a column cannot be decoded.

    Attributes:
        field: the column (dotted key) at fault, when one is.
    """

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


# ------------------------------------------------------------------ encoding
def _flat_leaves(td: TensorDictBase | Mapping[Any, torch.Tensor]) -> dict[str, torch.Tensor]:
    if is_tensorclass(td):
        td = td._tensordict  # type: ignore[union-attr]
    if isinstance(td, TensorDictBase):
        items: Iterable[tuple[Any, Any]] = td.items(include_nested=True, leaves_only=True)
    else:
        items = td.items()
    out = {}
    for key, value in items:
        name = key if isinstance(key, str) else SEP.join(key)
        if not isinstance(value, torch.Tensor):
            raise CodecError(f"key {name!r} holds {type(value).__name__}, not a tensor", field=name)
        out[name] = value
    return out


def _values_array(t: torch.Tensor) -> pa.Array:
    """A flat Arrow array over the elements of ``t`` (zero-copy except for bool)."""
    flat = t.detach().reshape(-1)
    if flat.device.type != "cpu":
        flat = flat.cpu()
    flat = flat.contiguous()
    if flat.dtype == torch.bool:
        bits = np.packbits(flat.numpy(), bitorder="little")
        return pa.Array.from_buffers(
            pa.bool_(), len(flat), [None, pa.py_buffer(bits)], null_count=0
        )
    if flat.dtype == torch.bfloat16:
        arr = flat.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = flat.numpy()
    return pa.Array.from_buffers(
        _TO_ARROW[flat.dtype], len(flat), [None, pa.py_buffer(arr)], null_count=0
    )


def column(name: str, t: torch.Tensor) -> tuple[pa.Field, pa.Array]:
    """Encode one leaf ``t`` (``[N, *shape]``) as an Arrow field and column."""
    if t.dtype not in _TO_ARROW:
        raise CodecError(f"key {name!r}: dtype {t.dtype} has no Arrow mapping", field=name)
    if t.ndim == 0:
        raise CodecError(f"key {name!r}: a 0-d tensor has no batch dimension", field=name)
    n, shape = t.shape[0], list(t.shape[1:])
    values = _values_array(t)
    meta = {META_DTYPE: _DTYPE_NAMES[t.dtype].encode(), META_SHAPE: json.dumps(shape).encode()}
    if shape:
        size = math.prod(shape)
        list_type = pa.list_(values.type, size)
        arr = pa.FixedSizeListArray.from_buffers(
            list_type, n, [None], children=[values], null_count=0
        )
        return pa.field(name, list_type, nullable=False, metadata=meta), arr
    return pa.field(name, values.type, nullable=False, metadata=meta), values


def to_record_batch(td: TensorDictBase | Mapping[Any, torch.Tensor]) -> pa.RecordBatch:
    """Encode a TensorDict (or tensorclass, or ``{key: tensor}``) of batch ``[N]`` as one record batch."""
    leaves = _flat_leaves(td)
    if not leaves:
        raise CodecError("nothing to encode: no tensor leaves")
    fields, arrays, n = [], [], None
    for name, t in leaves.items():
        f, a = column(name, t)
        if n is None:
            n = len(a)
        elif len(a) != n:
            raise CodecError(f"key {name!r} has {len(a)} rows, others have {n}", field=name)
        fields.append(f)
        arrays.append(a)
    return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


def encode(td: TensorDictBase | Mapping[Any, torch.Tensor]) -> pa.Buffer:
    """Encode as an Arrow IPC stream holding one record batch (``application/vnd.apache.arrow.stream``)."""
    rb = to_record_batch(td)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rb.schema) as writer:
        writer.write_batch(rb)
    return sink.getvalue()


# ------------------------------------------------------------------ decoding
#: most dimensions an item may have (nested fixed-size lists, or ``tdreplay.shape`` entries)
MAX_NDIM = 32
#: largest item dimension, and largest item (elements) a column may declare
MAX_DIM = (1 << 31) - 1
#: most columns a record batch may have
MAX_COLUMNS = 4096
#: longest ``tdreplay.shape`` / ``tdreplay.dtype`` metadata value, in bytes
MAX_META_BYTES = 512
_SHAPE = re.compile(r"\[\s*(?:\d+\s*(?:,\s*\d+\s*)*)?\]", re.ASCII)
#: what pyarrow raises on bytes or arrays it cannot make sense of
_ARROW_ERRORS = (pa.ArrowException, OSError, ValueError, UnicodeDecodeError)


def _buffer_tensor(buf: pa.Buffer, dtype: torch.dtype, offset: int, count: int) -> torch.Tensor:
    np_dtype = np.uint16 if dtype == torch.bfloat16 else _NUMPY[dtype]
    arr = np.frombuffer(
        buf, dtype=np_dtype, count=count, offset=offset * np.dtype(np_dtype).itemsize
    )
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
    if values.type not in _FROM_ARROW and values.type != pa.uint16():
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


def from_column(f: pa.Field, arr: pa.Array) -> torch.Tensor:
    """Decode one Arrow column into a tensor ``[N, *shape]``.

    Raises:
        CodecError: the column is malformed (buffers too small, lengths that
            disagree), holds nulls, is of a type with no tensor dtype, nests
            deeper than :data:`MAX_NDIM`, or its metadata is unreadable or
            disagrees with its type.
    """
    name = f.name
    try:
        arr.validate()  # O(nesting depth): buffer sizes and child lengths, before anything reads them
    except _ARROW_ERRORS as err:
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
    base = values.type
    dname = _meta_text(meta, META_DTYPE, name)
    if dname is not None:
        if dname not in _DTYPES_BY_NAME:
            raise CodecError(
                f"column {name!r}: unknown dtype {dname[:40]!r} in metadata", field=name
            )
        dtype = _DTYPES_BY_NAME[dname]
        if _TO_ARROW[dtype] != base:
            raise CodecError(
                f"column {name!r}: metadata says {dname} but the Arrow type is {base} "
                f"(a {dname} column travels as {_TO_ARROW[dtype]})",
                field=name,
            )
    elif base in _FROM_ARROW:
        dtype = _FROM_ARROW[base]
    else:
        raise CodecError(f"column {name!r}: Arrow type {base} is not supported", field=name)
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


def to_leaves(rb: pa.RecordBatch | pa.Table) -> dict[tuple[str, ...], torch.Tensor]:
    """``{nested key: tensor}`` for every column of ``rb``.

    Raises:
        CodecError: more than :data:`MAX_COLUMNS` columns, a column name that
            is empty or has an empty part (``"a..b"``), twice the same name, a
            name that is another's prefix (``x`` and ``x.y``), a column whose
            length is not the batch's row count, or a column :func:`from_column`
            cannot decode.
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


def from_record_batch(rb: pa.RecordBatch | pa.Table) -> TensorDict:
    """Decode a record batch into a TensorDict of batch ``[num_rows]`` (views on its buffers).

    Raises:
        CodecError: a column cannot be decoded (see :func:`to_leaves`), or one
            column's key is a prefix of another's (``x`` and ``x.y``).
    """
    leaves = to_leaves(rb)
    td = TensorDict(batch_size=[rb.num_rows])
    for key, t in leaves.items():
        try:
            td.set(key, t)
        except (RuntimeError, KeyError, ValueError):
            name = SEP.join(key)
            raise CodecError(
                f"column {name!r} clashes with another column (one key is a prefix of the other)",
                field=name,
            ) from None
    return td


def _open(
    data: bytes | bytearray | memoryview | pa.Buffer,
) -> tuple[pa.ipc.RecordBatchStreamReader, pa.BufferReader]:
    source = pa.BufferReader(data if isinstance(data, pa.Buffer) else pa.py_buffer(data))
    try:
        return pa.ipc.open_stream(source), source
    except _ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream: {err}") from None


def read_batches(data: bytes | bytearray | memoryview | pa.Buffer) -> list[pa.RecordBatch]:
    """All record batches of an Arrow IPC stream.

    Raises:
        CodecError: the bytes are not an Arrow IPC stream.
    """
    reader, _ = _open(data)
    try:
        return list(reader)
    except _ARROW_ERRORS as err:
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
    except _ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream: {err}") from None
    try:
        reader.read_next_batch()
    except StopIteration:
        extra = source.size() - source.tell()
        if extra:
            raise CodecError(f"{extra} bytes after the end of the Arrow IPC stream") from None
        return batch
    except _ARROW_ERRORS as err:
        raise CodecError(f"malformed Arrow IPC stream after the record batch: {err}") from None
    raise CodecError("expected one record batch, got 2 or more")


def decode(data: bytes | bytearray | memoryview | pa.Buffer) -> TensorDict:
    """Decode an Arrow IPC stream of one record batch into a TensorDict.

    The tensors are views on ``data`` (bool columns excepted); copy them if
    ``data`` is about to be reused.

    Raises:
        CodecError: the stream is malformed, holds no batch or several, or a
            column cannot be decoded (see :func:`from_record_batch`).
    """
    return from_record_batch(read_one(data))
