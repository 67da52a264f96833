"""Small helpers between nested-key dicts of tensors and TensorDicts."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase, is_leaf_nontensor

# the one nesting of flat keys: the codec's
from tdreplay.codec.arrow import key_tree as key_tree
from tdreplay.codec.arrow import nest as nest
from tdreplay.codec.arrow import nest_by as nest_by

from .spec import NestedKey


def leaves(td: TensorDictBase) -> dict[NestedKey, object]:
    """``{nested key (tuple): leaf}`` for every leaf of ``td``, tensors or not."""
    out: dict[NestedKey, object] = {}
    # is_leaf_nontensor: a non-tensor leaf is reported, not silently skipped
    for key in td.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor):
        out[key if isinstance(key, tuple) else (key,)] = td.get(key)
    return out


def plain_leaves(td: TensorDictBase) -> dict[NestedKey, Any] | None:
    """``leaves(td)`` for a plain TensorDict of tensors, read straight off its dicts.

    The general walk costs tens of microseconds per call in tensordict's key
    machinery, a large share of a small extend. ``None`` when ``td`` holds
    anything else (non-tensor leaves, lazy stacks, tensorclasses): the caller
    falls back to :func:`leaves`.
    """
    if type(td) is not TensorDict:
        return None
    out: dict[NestedKey, Any] = {}
    todo: list[tuple[NestedKey, TensorDict]] = [((), td)]
    while todo:
        prefix, node = todo.pop()
        for key, value in node._tensordict.items():
            if isinstance(value, torch.Tensor):
                out[(*prefix, key)] = value
            elif type(value) is TensorDict:
                todo.append(((*prefix, key), value))
            else:
                return None
    return out


def byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of the contiguous CPU tensor ``t`` as a flat memoryview sharing its memory
    (a slice of it copies with no torch call, which costs more than a small row's bytes).

    >>> byte_view(torch.zeros(3, 2, dtype=torch.int16)).nbytes
    12
    """
    return t.reshape(-1).view(torch.uint8).numpy().data


def row_bytes(t: torch.Tensor) -> np.ndarray:
    """The rows of ``t`` as a ``[rows, row bytes]`` uint8 array sharing its memory.

    >>> row_bytes(torch.zeros(3, 2, dtype=torch.int16)).shape
    (3, 4)
    """
    return t.contiguous().reshape(len(t), -1).view(torch.uint8).numpy()
