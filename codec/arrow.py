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

This module is the format's one entry point; the code lives in
:mod:`~tdreplay.codec.to_arrow` (encoding), :mod:`~tdreplay.codec.from_arrow`
(decoding), :mod:`~tdreplay.codec.format` (names, limits, the error) and
:mod:`~tdreplay.codec.dtypes` (the element types). The byte layouts of whole
IPC streams, for the hot paths, are in :mod:`~tdreplay.codec.ipc`.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.arange(6.).reshape(2, 3),
    ...                  "next": {"done": torch.tensor([[True], [False]])}}, batch_size=[2])
    >>> back = decode(encode(td))
    >>> bool((back == td).all()), back["obs"].dtype, back["next", "done"].dtype
    (True, torch.float32, torch.bool)
"""

from __future__ import annotations

from .errors import CodecError
from .format import (
    MAX_COLUMNS,
    MAX_DIM,
    MAX_META_BYTES,
    MAX_NDIM,
    META_DTYPE,
    META_SHAPE,
    SEP,
    NestedKey,
)
from .from_arrow import (
    decode,
    from_column,
    from_record_batch,
    key_tree,
    nest,
    nest_by,
    read_batches,
    read_one,
    to_leaves,
)
from .to_arrow import column, encode, to_record_batch

__all__ = [
    "MAX_COLUMNS",
    "MAX_DIM",
    "MAX_META_BYTES",
    "MAX_NDIM",
    "META_DTYPE",
    "META_SHAPE",
    "SEP",
    "CodecError",
    "NestedKey",
    "column",
    "decode",
    "encode",
    "from_column",
    "from_record_batch",
    "key_tree",
    "nest",
    "nest_by",
    "read_batches",
    "read_one",
    "to_leaves",
    "to_record_batch",
]
