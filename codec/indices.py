"""The one rule of a slot, or of a sampled item's key, as a caller names it (``update_priority``,
``remove``, ``read``), on either side of the wire and in process: an integer in
``[0, 2**63)``, never a float (0.5 would name slot 0: the wrong item changed), a bool
(``True`` would be slot 1) or a string converted.

:data:`SlotIndex` is the rule as the contract's models take it (a JSON list on the server,
a client's arguments before they are sent). :func:`slot_tensor` applies it to an in-process
call's values: a tensor or array of an integer dtype holds integers by its dtype, so only
its bounds are read (one ``aminmax``, the hot path: a learner's ``batch["index"]``); any
other value (a list, a number, an array of another dtype) is judged by :data:`SlotIndex`
itself, item by item.

    >>> slot_tensor(torch.tensor([3, 1]), "index", "t", end=8).tolist()
    [3, 1]
    >>> slot_tensor([1, True], "index", "t")
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: table 't': index must be integers, got True (item 1)
    >>> slot_tensor([0, 8], "index", "t", end=8)
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: table 't': index 8 outside [0, 8)
"""

from __future__ import annotations

import contextlib
from typing import Annotated, Any

import numpy as np
import torch
from pydantic import Field, TypeAdapter, ValidationError

from .errors import InvalidRequest

#: the end of the slots and keys a caller may name: an int64's range, never negative
SLOT_END = 1 << 63
#: a slot (or a sampled item's key) as a caller names it: an int, never a float, a bool or a
#: string converted
SlotIndex = Annotated[int, Field(ge=0, lt=SLOT_END, strict=True)]
_SLOTS = TypeAdapter(list[SlotIndex])
#: the dtypes that hold only integers an int64 holds too (bool is no integer here, and a
#: uint64 may pass 2**63: its values are judged one by one)
_INTEGRAL = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})
_BOUNDS = frozenset({"greater_than_equal", "less_than"})


def flat_values(values: Any) -> list[Any] | None:
    """What a caller gave as slots, keys or priorities — a tensor, an array, one number, or
    a list of them, nested or not — as one flat list of Python values, unconverted: a float
    stays a float and a bool a bool, for the contract's rule to judge (a cast to int64 would
    make 0.5 slot 0). ``None`` stays ``None``.

        >>> flat_values(torch.tensor([[1], [2]])), flat_values([0.5, True]), flat_values(3)
        ([1, 2], [0.5, True], [3])
    """
    if values is None:
        return None
    if isinstance(values, list | tuple) and all(isinstance(v, int | float | str) for v in values):
        return list(values)
    try:
        return torch.as_tensor(values).detach().reshape(-1).cpu().tolist()  # type: ignore[no-any-return]
    except (TypeError, ValueError, RuntimeError, OverflowError):  # not numbers: the rule says so
        return list(values) if isinstance(values, list | tuple) else [values]


def slot_tensor(values: Any, field: str, table: str, *, end: int = SLOT_END) -> torch.Tensor:
    """``values`` (slots or keys) as int64 ``[N]`` by the rule of :data:`SlotIndex`, each
    below ``end`` too (a table's capacity, for its slots).

    Raises:
        InvalidRequest: a value is not an integer (a float, a bool, a string), or lies
            outside ``[0, end)``; names ``field`` and ``table``.
    """
    t = values.detach() if isinstance(values, torch.Tensor) else None
    if isinstance(values, np.ndarray) and values.dtype.kind in "iubfc":
        with contextlib.suppress(TypeError):  # a dtype torch lacks: judged one by one
            t = torch.from_numpy(values)
    if t is not None and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        got = str(t.dtype).removeprefix("torch.")  # no walk: the dtype says what they all are
        raise _not_integers(field, table, got)
    if t is None or t.dtype not in _INTEGRAL:
        try:
            t = torch.tensor(_SLOTS.validate_python(_flat(values)), dtype=torch.int64)
        except ValidationError as err:
            first = err.errors()[0]
            bad, at = first["input"], first["loc"][0]
            if first["type"] in _BOUNDS:
                raise _outside(field, table, bad, end) from None
            raise _not_integers(field, table, f"{bad!r:.40} (item {at})") from None
    t = t.reshape(-1)
    if len(t):  # a key's end is an int64's: its dtype keeps it below, only its least is read
        low, high = (int(v) for v in torch.aminmax(t)) if end < SLOT_END else (int(t.min()), 0)
        if low < 0 or high >= end:
            raise _outside(field, table, low if low < 0 else high, end)
    return t.to(torch.int64)


def _flat(values: Any) -> list[Any]:
    """``values`` as :data:`SlotIndex` judges them: a flat list as it is (a list of ints, the
    common case, walked once, by the validator), anything else by :func:`flat_values`."""
    if isinstance(values, list) and not (values and isinstance(values[0], list | tuple)):
        return values
    return flat_values(values) or []


def _not_integers(field: str, table: str, got: str) -> InvalidRequest:
    return InvalidRequest(
        f"table {table!r}: {field} must be integers, got {got}",
        table=table,
        field=field,
        expected="int64",
        got=got,
    )


def _outside(field: str, table: str, bad: Any, end: int) -> InvalidRequest:
    return InvalidRequest(
        f"table {table!r}: {field} {bad} outside [0, {end})",
        table=table,
        field=field,
        expected=f"[0, {end})",
        got=bad,
    )
