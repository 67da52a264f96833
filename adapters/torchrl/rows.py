"""Rows in and out of a table, the way TorchRL's ``TensorDictReplayBuffer`` shapes them.

* :func:`table_keys` reads a table's fields (dotted names) as TensorDict keys.
* :func:`rows_for` turns what a collector hands ``extend`` into the rows the
  table declares: a tensorclass becomes its TensorDict, ``[B, T]`` batches
  are flattened, and keys the buffer itself adds (``index``,
  ``priority_weight``, the loss's ``td_error``, ``sample_info``) are dropped.
* :func:`priority_vector` reduces a loss's per-item priority to one number
  per row, with TorchRL's default reduction (``max`` over trailing dims).
* :func:`spec_from_tensordict` writes the schema of a table that stores
  exactly what a TensorDict holds, for ``ReplayClient.create_table``.

    >>> import torch
    >>> from tensordict import TensorDict
    >>> td = TensorDict({"obs": torch.zeros(3, 4), "next": {"reward": torch.zeros(3, 1)}}, [3])
    >>> spec = spec_from_tensordict(td, "demo", capacity=100)
    >>> spec["fields"]
    {'next.reward': {'shape': [1], 'dtype': 'float32'}, 'obs': {'shape': [4], 'dtype': 'float32'}}
    >>> sorted(table_keys(spec["fields"]))
    [('next', 'reward'), ('obs',)]
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from tensordict import TensorDictBase, is_leaf_nontensor, is_tensorclass
from tensordict.utils import NestedKey

from tdreplay.client import SchemaError, TableExists
from tdreplay.codec.dtypes import name_of

#: keys a sampled batch (or a loss run on it) carries that are not rows of the table
SAMPLE_KEYS: tuple[NestedKey, ...] = ("index", "priority_weight", "sample_info")


def as_tuple(key: NestedKey) -> tuple[str, ...]:
    """``"a"`` -> ``("a",)``; tuples as they are."""
    return (key,) if isinstance(key, str) else tuple(key)


def table_keys(fields: Iterable[str]) -> frozenset[tuple[str, ...]]:
    """The TensorDict keys of a table's fields (``"next.reward"`` -> ``("next", "reward")``)."""
    return frozenset(tuple(name.split(".")) for name in fields)


def as_tensordict(data: Any, *, who: str) -> TensorDictBase:
    """``data`` as a TensorDict: a TensorDict as it is, a tensorclass as its TensorDict.

    Raises:
        TypeError: anything else (TorchRL's TensorDict buffers take only these).
    """
    if isinstance(data, TensorDictBase):
        return data
    if is_tensorclass(data):
        return data._tensordict
    raise TypeError(
        f"{who} takes a TensorDict or a tensorclass, got {type(data).__name__}; "
        "wrap other data in a TensorDict"
    )


def rows_for(
    data: TensorDictBase,
    keys: frozenset[tuple[str, ...]],
    ignored: Iterable[NestedKey],
) -> tuple[TensorDictBase, set[tuple[str, ...]]]:
    """The rows of ``data`` the table stores, flattened to ``[N]``, and the keys left out.

    Args:
        data: a batch ``[N]``, ``[B, T]`` or ``[]`` (one step).
        keys: the table's keys (:func:`table_keys`).
        ignored: keys never stored nor reported (what sampling and losses add).

    Returns:
        ``(rows, extra)``: ``rows`` holds the table's keys that ``data`` has (the
        server names any it lacks); ``extra`` the leaf keys of ``data`` the table
        does not declare (non-tensor data included), beside ``ignored`` ones.
    """
    skip = [as_tuple(k) for k in ignored]
    # non-tensor data (strings, objects) counts: it is left out like any undeclared key
    every = data.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor)
    leaves = {as_tuple(key) for key in every}
    extra = {k for k in leaves - keys if not any(k[: len(s)] == s for s in skip)}
    present = [k for k in keys if k in leaves]  # one walk of data's keys, not one per key
    rows = data.select(*present)
    if rows.batch_dims == 0:
        rows = rows.unsqueeze(0)
    elif rows.batch_dims > 1:
        rows = rows.reshape(-1)
    return rows, extra


def refuse_non_tensor(data: TensorDictBase, table: str) -> None:
    """What ``strict=True`` does with non-tensor data: refuse it by name (the wire carries
    tensors only, so it would be left out without a word).

    Raises:
        SchemaError: ``data`` holds non-tensor leaves (nothing was written).
    """
    every = data.keys(include_nested=True, leaves_only=True, is_leaf=is_leaf_nontensor)
    tensors = {as_tuple(k) for k in data.keys(include_nested=True, leaves_only=True)}
    opaque = sorted(".".join(k) for k in map(as_tuple, every) if k not in tensors)
    if opaque:
        raise SchemaError(
            f"table {table!r} holds tensors: non-tensor data {opaque} cannot be stored "
            "(strict=True refuses it; without strict it is left out with a warning)",
            table=table,
            field=opaque[0],
        )


def priority_vector(data: TensorDictBase, priority_key: NestedKey) -> torch.Tensor:
    """One priority per row of ``data`` (batch ``[N]``, ``[B, T]`` or ``[]``): ``max`` over the rest.

    Raises:
        KeyError: ``data`` has no ``priority_key`` (run the loss on the batch first).
    """
    priority = data.get(priority_key, None)
    if priority is None:
        raise KeyError(
            f"no {priority_key!r} in the batch to take priorities from: run the loss on "
            "the sampled batch first (it writes the key), or pass priority_key= to "
            "TDReplayBuffer to name another"
        )
    priority = torch.as_tensor(priority).detach()
    n = max(1, data.batch_size.numel())
    return priority.reshape(n, -1).amax(dim=1)


def flat_index(data: TensorDictBase) -> torch.Tensor:
    """``data["index"]`` as one slot per row (TorchRL expands it over trailing dims).

    Raises:
        KeyError: ``data`` has no ``index`` (it was not sampled from, nor extended into, a buffer).
    """
    index = data.get("index", None)
    if index is None:
        raise KeyError(
            "no 'index' in the batch: update priorities of batches returned by sample() "
            "(or extended through the buffer)"
        )
    index = torch.as_tensor(index)
    while index.ndim > data.batch_dims and index.ndim > 0:
        index = index[..., 0]
    return index.reshape(-1)


def spec_from_tensordict(
    data: TensorDictBase,
    name: str,
    *,
    capacity: int,
    sampler: Mapping[str, Any] | str = "uniform",
    backend: Mapping[str, Any] | str = "memmap",
    exclude: Iterable[NestedKey] = SAMPLE_KEYS,
    **options: Any,
) -> dict[str, Any]:
    """The spec of a table storing the leaves of ``data`` (one row per item of its batch).

    Args:
        data: an example batch ``[N]``, ``[B, T]`` or ``[]``: its batch dims are
            the rows, every other dim is a field's shape.
        name: the table's name.
        capacity: how many items it holds.
        sampler: a sampler kind (``"prioritized"``) or its whole block
            (``{"kind": "prioritized", "alpha": 0.6, "beta": 0.4}``).
        backend: a backend kind or block.
        exclude: keys left out (by default what sampling adds).
        **options: further spec entries (``writer``, ``rate_limiter``...).

    Returns:
        A mapping :meth:`tdreplay.client.ReplayClient.create_table` takes.

    Raises:
        ValueError: a key holds something other than a tensor, or has a dot in it.
    """
    skip = [as_tuple(k) for k in exclude]
    fields: dict[str, dict[str, Any]] = {}
    for key in sorted(data.keys(include_nested=True, leaves_only=True), key=as_tuple):
        k = as_tuple(key)
        if any(k[: len(s)] == s for s in skip):
            continue
        if any("." in part for part in k):
            raise ValueError(f"key {key!r}: a table's field names cannot hold dots")
        value = data.get(key)
        if not isinstance(value, torch.Tensor):
            raise ValueError(f"key {key!r} holds a {type(value).__name__}, not a tensor")
        shape = list(value.shape[data.batch_dims :])
        fields[".".join(k)] = {"shape": shape, "dtype": name_of(value.dtype)}
    return {
        "name": name,
        "capacity": capacity,
        "fields": fields,
        "sampler": {"kind": sampler} if isinstance(sampler, str) else dict(sampler),
        "backend": {"kind": backend} if isinstance(backend, str) else dict(backend),
        **options,
    }


#: the kind of a sampler or writer the table options given as ``create=`` leave unset
DEFAULT_KINDS = {"sampler": "uniform", "writer": "round_robin"}


def spec_part(options: Mapping[str, Any], part: str) -> dict[str, Any]:
    """The ``sampler`` or ``writer`` block of table options given as ``create=`` (a bare
    kind or a block; the default kind when unset)."""
    block = options.get(part, DEFAULT_KINDS[part])
    return {"kind": block} if isinstance(block, str) else dict(block)


def warn_extra(table: str, extra: set[tuple[str, ...]], warned: set[frozenset[Any]]) -> None:
    """Warn once per set of keys (``warned`` remembers them) that ``extra`` is not stored."""
    key = frozenset(extra)
    if key in warned:
        return
    warned.add(key)
    names = sorted(".".join(k) for k in extra)
    warnings.warn(
        f"TDReplayBuffer(table={table!r}): the table does not declare {names}; "
        "they are not stored (add them to the schema: a table holds tensors, not non-tensor "
        "data; or pass strict=True to have the server refuse them)",
        UserWarning,
        stacklevel=3,
    )


def found_rows(table: str, size: int, existing: str) -> None:
    """``create=`` met a table that holds rows already: say so, or refuse (``existing``)."""
    what = f"table {table!r} exists and holds {size} rows"
    if existing == "refuse":
        raise TableExists(
            f"{what}; TDReplayBuffer(create=..., existing='refuse') starts on an empty "
            "table: delete it first (ReplayClient.delete_table), or pass existing='reuse'",
            table=table,
        )
    warnings.warn(
        f"TDReplayBuffer(create=...): {what}; they are reused (another process may have "
        "written them). Pass existing='refuse' to start empty instead",
        UserWarning,
        stacklevel=4,
    )


def largest(rows: TensorDictBase, key: str, n: int, table: str) -> torch.Tensor:
    """The positions of the ``n`` rows with the largest ``key`` (a field's dotted name), in
    batch order; of equal values the earlier row, as the server's ``max_value`` writer ranks
    a batch. TorchRL's ``TensorDictMaxValueWriter`` likewise keeps a batch's top ``n``.

    Raises:
        SchemaError: ``rows`` has no ``key`` (nothing was written).
    """
    values = rows.get(tuple(key.split(".")), None)
    if values is None:
        raise SchemaError(
            f"table {table!r}: the batch has no {key!r}, which its max_value writer ranks by",
            table=table,
            field=key,
        )
    values = torch.as_tensor(values).reshape(len(rows), -1)[:, 0]
    order = torch.argsort(values.to(torch.float64), descending=True, stable=True)
    return order[:n].sort().values
