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


def first_misfit(values: torch.Tensor, dtype: torch.dtype) -> int | None:
    """The flat index of the first of ``values`` that ``dtype`` cannot take, else ``None``.

    A value fits when ``dtype`` holds it exactly (an integral value within an integer's
    range, 0 or 1 for bool, an integer a float represents exactly), or, a float into a
    float field, when rounding keeps it finite: the schema declares the precision the
    table keeps, as :mod:`tdreplay.codec.parquet_import` rounds a column.

    >>> first_misfit(torch.tensor([1.0, 0.5]), torch.int64), first_misfit(torch.tensor([300]), torch.uint8)
    (1, 0)
    >>> first_misfit(torch.tensor([1e39], dtype=torch.float64), torch.float32)
    0
    >>> first_misfit(torch.tensor([2, 3]), torch.float16) is None
    True
    """
    flat = values.reshape(-1)
    if flat.dtype == torch.uint64:  # torch compares it wrongly: its values as Python ints
        big = next((i for i, v in enumerate(flat.tolist()) if v > 2**63 - 1), None)
        if big is not None:
            return big
        flat = flat.to(torch.int64)
    if dtype.is_floating_point and flat.dtype.is_floating_point:
        bad = torch.isinf(flat.to(dtype)) & torch.isfinite(flat)
    elif dtype.is_floating_point:  # an integer: exact when it comes back the same
        back = flat.to(dtype).to(torch.float64)
        inside = back.abs() < 2.0**63
        bad = ~inside | (torch.where(inside, back, 0).to(torch.int64) != flat.to(torch.int64))
    else:
        low, high = (
            (0, 1) if dtype == torch.bool else (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
        )
        if flat.dtype.is_floating_point:
            # float bounds exact as powers of two: high + 1 is the first value out of range
            bad = ~torch.isfinite(flat) | (flat != flat.trunc())
            bad |= (flat < float(low)) | (flat >= float(high) + 1.0)
        else:
            wide = flat.to(torch.int64)
            bad = (wide < low) | (wide > high)
    found = torch.nonzero(bad)
    return int(found[0]) if len(found) else None
