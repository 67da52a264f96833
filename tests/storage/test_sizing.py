"""``table_nbytes`` (what the byte limits are checked against) covers what a table really allocates.

For every sampler and writer, a memory table of 100 000 slots is filled and
sampled; then the distinct tensor storages it holds (its rows, and everything
reachable from its slots, sampler and writer) are summed. The estimate must be
at least that, and not wildly more (at most 2.5 times).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDictBase
from testkit import make_spec, rows

from tdreplay.storage.sizing import table_nbytes

CAPACITY = 100_000

KINDS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"kind": "uniform"}, {"kind": "round_robin"}),
    ({"kind": "prioritized"}, {"kind": "round_robin"}),
    ({"kind": "fifo"}, {"kind": "round_robin"}),
    ({"kind": "lifo"}, {"kind": "round_robin"}),
    ({"kind": "without_replacement"}, {"kind": "round_robin"}),
    ({"kind": "slice", "slice_len": 4}, {"kind": "round_robin"}),
    ({"kind": "uniform"}, {"kind": "max_value", "key": "id"}),
    ({"kind": "prioritized"}, {"kind": "max_value", "key": "id"}),
    ({"kind": "without_replacement"}, {"kind": "max_value", "key": "id"}),
]


def storages(*roots: Any) -> dict[int, int]:
    """``{data_ptr: nbytes}`` of every tensor storage reachable from ``roots`` (attributes, containers)."""
    found: dict[int, int] = {}
    seen: set[int] = set()
    stack = list(roots)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            found[storage.data_ptr()] = storage.nbytes()
        elif isinstance(obj, TensorDictBase):
            stack.extend(obj.values(include_nested=True, leaves_only=True))
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, list | tuple | set | frozenset):
            stack.extend(obj)
        elif isinstance(obj, torch.Generator | type) or callable(obj):
            continue
        elif hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return found


@pytest.mark.parametrize(
    ("sampler", "writer"), KINDS, ids=[f"{s['kind']}-{w['kind']}" for s, w in KINDS]
)
def test_table_nbytes_covers_what_a_table_allocates(
    tables: Any, sampler: dict[str, Any], writer: dict[str, Any]
) -> None:
    spec = make_spec(capacity=CAPACITY, sampler=sampler, writer=writer)
    table = tables.create(spec)
    table.extend(rows(0, CAPACITY))
    if writer["kind"] == "max_value":  # a second pass that replaces items
        table.extend(rows(CAPACITY, CAPACITY // 2))
    assert table.size == CAPACITY
    table.sample(256)
    if sampler["kind"] == "prioritized":
        batch = table.sample(256)
        table.update_priority(batch["index"], torch.rand(256) + 0.1)
    rows_held = storages(table.backend)
    bookkeeping = storages(table.slots, table.sampler, table.writer)
    held = {**rows_held, **bookkeeping}
    real = sum(held.values())
    rows_bytes = sum(rows_held.values())
    estimate = table_nbytes(spec)
    assert rows_bytes >= CAPACITY * spec.item_nbytes  # the walk did find the rows
    assert estimate >= real, (estimate, real, sorted(bookkeeping.values()))
    assert estimate <= 2.5 * real, (estimate, real)
