"""Gymnasium spaces of a table's fields: the spaces of the Minari datasets it exports.

A dataset's observation and action spaces are derived from the table's schema,
each field's shape and dtype, so that every step the dataset holds lies in its
space (``space.contains``), whether or not an environment's spec is given too:

- a float field: ``Box(-inf, inf, shape, dtype)`` (bfloat16 as float32, as its
  values are written);
- an integer field declaring ``n`` categories (``FieldSpec.n``): ``Discrete(n)``
  when scalar, else ``MultiDiscrete`` of ``n`` per element; an export refuses a
  value outside ``0 .. n-1`` (:func:`check_categories`);
- another integer field: ``Box`` over its dtype's whole range;
- a bool field: ``Box(False, True, shape, bool)`` (not ``MultiBinary``: its elements
  are int8, which Minari's Arrow format will not store bools as, and it has no scalar
  form);
- a subtree (``observation.state``, ``observation.pixels``): a ``Dict`` of its leaves.

The spaces are not taken from the environment even when its spec is given: making it
would run its code (a server never does, for a spec that came in a request), and its
spaces need not describe the table's data (TorchRL's CartPole actions are one-hot
``int64[2]``, the environment's space ``Discrete(2)``).

    >>> fields = {"observation": {"shape": [3], "dtype": "float32"},
    ...     "action": {"shape": [], "dtype": "int64", "n": 2}}
    >>> space_of(fields, ["observation"], "observation")
    Box(-inf, inf, (3,), float32)
    >>> space_of(fields, ["action"], "action")
    Discrete(2)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .errors import SchemaError

__all__ = ["categories", "check_categories", "outside_categories", "space_of"]


def _leaf(f: Mapping[str, Any]) -> Any:
    from gymnasium import spaces

    shape = tuple(f.get("shape") or [])
    name = "float32" if f["dtype"] == "bfloat16" else str(f["dtype"])
    dtype: Any = np.dtype(name)
    n = f.get("n")
    if n is not None:
        if not shape:
            return spaces.Discrete(int(n))
        return spaces.MultiDiscrete(np.full(shape, int(n)), dtype=dtype)
    if name == "bool":
        return spaces.Box(0, 1, shape, bool)
    if name.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        return spaces.Box(info.min, info.max, shape, dtype=dtype)
    return spaces.Box(-np.inf, np.inf, shape, dtype=dtype)


def space_of(fields: Mapping[str, Any], keys: list[str], top: str) -> Any:
    """The space of the fields ``keys`` (dotted) under ``top``: the leaf's own space when
    ``keys == [top]``, else a ``Dict`` nested as the keys are.

    Args:
        fields: the table's ``{dotted key: {"shape", "dtype"[, "n"]}}``.
        keys: the leaves under ``top`` (``observation``, or ``observation.*``).
        top: the subtree's key.
    """
    from gymnasium import spaces

    if keys == [top]:
        return _leaf(fields[top])
    tree: dict[str, Any] = {}
    for key in keys:
        parts = key.split(".")[1:]
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = _leaf(fields[key])

    def build(node: dict[str, Any]) -> Any:
        return spaces.Dict({k: build(v) if isinstance(v, dict) else v for k, v in node.items()})

    return build(tree)


def categories(fields: Mapping[str, Any], keys: list[str]) -> dict[str, int]:
    """``{key: n}`` of the fields among ``keys`` that declare ``n`` categories."""
    return {k: int(fields[k]["n"]) for k in keys if fields[k].get("n") is not None}


def check_categories(
    declared: Mapping[str, int], rows: Mapping[str, np.ndarray], first: int = 0
) -> None:
    """Check that each column of ``rows`` that ``declared`` names holds ``0 .. n-1``.

    Args:
        declared: ``{dotted key: n}`` (:func:`categories`; an episode's last observation,
            ``next.observation``, goes into the space of ``observation``).
        rows: ``{dotted key: array [rows, *shape]}``, rows ``first...`` of the export.
        first: the number of the first row, for the message.

    Raises:
        SchemaError: a value is outside its categories (the error names the field, the
            value and its row).
    """
    for key, n in declared.items():
        found = outside_categories(rows[key], n)
        if found is not None:
            row, value = found
            raise SchemaError(
                f"field {key!r} holds {value} in row {first + row}, outside its n = {n} "
                f"categories (0 .. {n - 1}): the dataset's space would not contain it",
                field=key,
                expected=f"0 .. {n - 1}",
                got=value,
            )


def outside_categories(values: np.ndarray, n: int) -> tuple[int, int] | None:
    """The first row of ``values`` (``[rows, *shape]``) holding a value outside its ``n``
    categories ``0 .. n-1``, and that value; ``None`` when every value is one. The one
    test of a field's categories: an extend's, an import's and an export's.

        >>> outside_categories(np.array([[0, 1], [2, 3]]), 3)
        (1, 3)
    """
    if not values.size or (values.min() >= 0 and values.max() < n):
        return None
    where = np.argwhere((values < 0) | (values >= n))[0]
    return int(where[0]), int(values[tuple(where)])
