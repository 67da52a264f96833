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
    if pa.types.is_boolean(values.type):
        bits = np.frombuffer(values.buffers()[1], dtype=np.uint8)
        unpacked = np.unpackbits(bits, bitorder="little", count=values.offset + n)[values.offset :]
        return torch.from_numpy(unpacked.astype(np.bool_))
    if values.type == pa.uint16() and dtype != torch.bfloat16:
        return torch.from_numpy(values.to_numpy(zero_copy_only=False).astype(np.int32))
    if values.type not in _FROM_ARROW and values.type != pa.uint16():
        raise CodecError(f"column {name!r}: Arrow type {values.type} is not supported", field=name)
    return _buffer_tensor(values.buffers()[1], dtype, values.offset, n)


def from_column(f: pa.Field, arr: pa.Array) -> torch.Tensor:
    """Decode one Arrow column into a tensor ``[N, *shape]``."""
    name = f.name
    meta = f.metadata or {}
    n = len(arr)
    shape: list[int] = []
    values = arr
    while pa.types.is_fixed_size_list(values.type):
        if values.null_count:
            raise CodecError(f"column {name!r} has {values.null_count} nulls", field=name)
        size = values.type.list_size
        shape.append(size)
        # flatten() honours the array's offset and length
        values = values.flatten()
    if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
        raise CodecError(
            f"column {name!r}: variable-size lists are not supported; use fixed_size_list",
            field=name,
        )
    base = values.type
    if META_DTYPE in meta:
        dname = meta[META_DTYPE].decode()
        if dname not in _DTYPES_BY_NAME:
            raise CodecError(f"column {name!r}: unknown dtype {dname!r} in metadata", field=name)
        dtype = _DTYPES_BY_NAME[dname]
        if _TO_ARROW[dtype] != base:
            raise CodecError(
                f"column {name!r}: metadata says {dname} but the Arrow type is {base}", field=name
            )
    elif base in _FROM_ARROW:
        dtype = _FROM_ARROW[base]
    else:
        raise CodecError(f"column {name!r}: Arrow type {base} is not supported", field=name)
    if META_SHAPE in meta:
        try:
            declared = json.loads(meta[META_SHAPE])
        except ValueError:
            raise CodecError(
                f"column {name!r}: bad shape metadata {meta[META_SHAPE]!r}", field=name
            ) from None
        if not isinstance(declared, list) or not all(
            isinstance(d, int) and d >= 0 for d in declared
        ):
            raise CodecError(f"column {name!r}: bad shape metadata {declared!r}", field=name)
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
    """``{nested key: tensor}`` for every column of ``rb``."""
    out = {}
    for i, f in enumerate(rb.schema):
        col = rb.column(i)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        key = tuple(f.name.split(SEP))
        if key in out:
            raise CodecError(f"column {f.name!r} appears twice", field=f.name)
        out[key] = from_column(f, col)
    return out


def from_record_batch(rb: pa.RecordBatch | pa.Table) -> TensorDict:
    """Decode a record batch into a TensorDict of batch ``[num_rows]`` (views on its buffers)."""
    leaves = to_leaves(rb)
    td = TensorDict(batch_size=[rb.num_rows])
    for key, t in leaves.items():
        try:
            td.set(key, t)
        except (RuntimeError, KeyError, ValueError) as err:
            raise CodecError(
                f"column {'.'.join(key)!r} clashes with another column: {err}", field=".".join(key)
            ) from None
    return td


def read_batches(data: bytes | bytearray | memoryview | pa.Buffer) -> list[pa.RecordBatch]:
    """All record batches of an Arrow IPC stream.

    Raises:
        CodecError: the bytes are not an Arrow IPC stream.
    """
    try:
        reader = pa.ipc.open_stream(data if isinstance(data, pa.Buffer) else pa.py_buffer(data))
        return list(reader)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OSError) as err:
        raise CodecError(f"malformed Arrow IPC stream: {err}") from None


def decode(data: bytes | bytearray | memoryview | pa.Buffer) -> TensorDict:
    """Decode an Arrow IPC stream of one record batch into a TensorDict.

    The tensors are views on ``data`` (bool columns excepted); copy them if
    ``data`` is about to be reused.

    Raises:
        CodecError: the stream is malformed, holds no batch or several, or a
            column cannot be decoded.
    """
    batches = read_batches(data)
    if len(batches) != 1:
        raise CodecError(f"expected one record batch, got {len(batches)}")
    return from_record_batch(batches[0])
