"""The one rule of a priority, for inserts and updates alike, on either side of the wire:
the server's tables check every priority with it, and the TorchRL adapter checks the
priorities it will send after an insert before the rows go (so bad ones write nothing).

    >>> priorities([0.5, 1e39], "update_priority").tolist()
    [0.5, 1e+39]
    >>> priorities(-1.0, "table 't'")
    Traceback (most recent call last):
    ...
    tdreplay.codec.errors.InvalidRequest: table 't': priorities must be finite and >= 0, got -1.0 [field 'priority']
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .errors import InvalidRequest


def priorities(value: Any, where: str, *, table: str | None = None) -> torch.Tensor:
    """``value`` as priorities, float64 ``[N]`` (the sum-tree's dtype: a priority past
    float32's range stays the number it was), each finite and >= 0.

    Raises:
        InvalidRequest: a priority is not a number, negative or not finite (``where``
            names the call; ``table``, the table's name, is carried by the error).
    """
    if isinstance(value, torch.Tensor):
        kind = "b" if value.dtype == torch.bool else "c" if value.is_complex() else "f"
        given: Any = value.detach()
    else:  # numpy reads a Python float as float64 (torch would take float32: 1e39 -> inf)
        given = np.asarray(value)
        kind = given.dtype.kind
    if kind not in "iuf":
        raise InvalidRequest(
            f"{where}: priorities must be numbers, got {given.dtype}", field="priority", table=table
        )
    priority = torch.as_tensor(given).to(torch.float64).reshape(-1)
    bad = ~torch.isfinite(priority) | (priority < 0)
    if bool(bad.any()):
        raise InvalidRequest(
            f"{where}: priorities must be finite and >= 0, got {priority[bad][0].item()}",
            field="priority",
            table=table,
        )
    return priority
