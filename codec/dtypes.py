"""The element types tdreplay stores and sends: the one list, and every mapping derived from it.

A schema names a dtype (``"float32"``); a table allocates it as a torch
dtype; the wire and Parquet carry it as an Arrow type; numpy views the
bytes. :data:`DTypeName` is the list; everything else here is computed from
it, so a dtype is added or removed in one place.

Arrow and numpy have no bfloat16: a bfloat16 column travels as ``uint16``
holding the same bits (the wire codec marks it in the field metadata).

    >>> import torch
    >>> TORCH["bfloat16"], NAMES[torch.uint8], ARROW[torch.bfloat16]
    (torch.bfloat16, 'uint8', DataType(uint16))
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
import pyarrow as pa
import torch

#: every dtype a schema may name, in the order docs and errors list them
DTypeName = Literal[
    "bool",
    "uint8",
    "int8",
    "int16",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
]

#: schema name -> torch dtype
TORCH: dict[str, torch.dtype] = {name: getattr(torch, name) for name in get_args(DTypeName)}
#: torch dtype -> schema name
NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in TORCH.items()}
#: torch dtype -> the numpy dtype of its bytes (bfloat16: uint16 bits)
NUMPY: dict[torch.dtype, np.dtype] = {
    dtype: np.dtype(np.uint16 if name == "bfloat16" else name) for name, dtype in TORCH.items()
}
#: torch dtype -> the Arrow type its column has (bfloat16: uint16 bits)
ARROW: dict[torch.dtype, pa.DataType] = {
    dtype: pa.from_numpy_dtype(np_dtype) for dtype, np_dtype in NUMPY.items()
}


def name_of(dtype: torch.dtype) -> str:
    """The schema name of ``dtype`` (``torch.float32`` -> ``"float32"``), or its torch name."""
    return NAMES.get(dtype, str(dtype).removeprefix("torch."))
