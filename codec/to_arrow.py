"""TensorDict -> Arrow: one record batch, one column per leaf (the format: :mod:`tdreplay.codec.arrow`).

>>> import torch
>>> rb = to_record_batch({("next", "reward"): torch.zeros(2), "obs": torch.zeros(2, 3)})
>>> rb.schema.names, rb.num_rows, str(rb.schema.field("obs").type)
(['next.reward', 'obs'], 2, 'fixed_size_list<item: float>[3]')
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from tensordict import TensorDictBase, is_tensorclass

from .dtypes import ARROW, NAMES
from .errors import CodecError
from .format import META_DTYPE, META_SHAPE, SEP


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
    if flat.dtype == torch.bfloat16:  # numpy has no bfloat16: the same bits as uint16
        arr = flat.view(torch.int16).numpy().view(np.uint16)
    else:
        arr = flat.numpy()
    return pa.Array.from_buffers(
        ARROW[flat.dtype], len(flat), [None, pa.py_buffer(arr)], null_count=0
    )


def column(name: str, t: torch.Tensor) -> tuple[pa.Field, pa.Array]:
    """Encode one leaf ``t`` (``[N, *shape]``) as an Arrow field and column.

    Raises:
        CodecError: ``t`` has a dtype the format does not carry, or no batch dimension.
    """
    if t.dtype not in ARROW:
        raise CodecError(f"key {name!r}: dtype {t.dtype} has no Arrow mapping", field=name)
    if t.ndim == 0:
        raise CodecError(f"key {name!r}: a 0-d tensor has no batch dimension", field=name)
    n, shape = t.shape[0], list(t.shape[1:])
    values = _values_array(t)
    meta = {META_DTYPE: NAMES[t.dtype].encode(), META_SHAPE: json.dumps(shape).encode()}
    if shape:
        size = math.prod(shape)
        list_type = pa.list_(values.type, size)
        arr = pa.FixedSizeListArray.from_buffers(
            list_type, n, [None], children=[values], null_count=0
        )
        return pa.field(name, list_type, nullable=False, metadata=meta), arr
    return pa.field(name, values.type, nullable=False, metadata=meta), values


def to_record_batch(td: TensorDictBase | Mapping[Any, torch.Tensor]) -> pa.RecordBatch:
    """Encode a TensorDict (or tensorclass, or ``{key: tensor}``) of batch ``[N]`` as one record batch.

    A mapping's keys may be strings or nested keys (tuples of strings).

    Raises:
        CodecError: no tensor leaves, a leaf that is not a tensor, leaves with
            different row counts, or a leaf :func:`column` cannot encode.
    """
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
    """Encode as an Arrow IPC stream holding one record batch (``application/vnd.apache.arrow.stream``).

    Raises:
        CodecError: see :func:`to_record_batch`.
    """
    return stream(to_record_batch(td))


def write_stream(rb: pa.RecordBatch, sink: Any) -> None:
    """Write ``rb`` to ``sink`` (a pyarrow output stream) as an IPC stream of one record batch."""
    with pa.ipc.new_stream(sink, rb.schema) as writer:
        writer.write_batch(rb)


def stream(rb: pa.RecordBatch) -> pa.Buffer:
    """``rb`` as the bytes of an IPC stream of one record batch (:func:`write_stream`)."""
    sink = pa.BufferOutputStream()
    write_stream(rb, sink)
    return sink.getvalue()
