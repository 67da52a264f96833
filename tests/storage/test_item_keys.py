"""Item keys: a sample's ``sample_info.key`` makes update_priority skip overwritten slots."""

from __future__ import annotations

import pytest
import torch
from storage_helpers import assert_same, snapshot
from testkit import make_spec, rows

from tdreplay.storage import InvalidRequest


def prioritized(tables, capacity: int = 8, **table):
    spec = make_spec(capacity=capacity, sampler={"kind": "prioritized", "alpha": 1.0}, **table)
    return tables.create(spec)


def test_sample_carries_the_items_ordinal(tables) -> None:
    table = tables.create(make_spec(capacity=8))
    table.extend(rows(0, 8))
    table.extend(rows(8, 3))  # the ring wraps: slots 0..2 hold inserts 8..10
    batch = table.sample(8)
    assert batch["sample_info", "key"].dtype == torch.int64
    # in this table item i was insert number i: its ordinal, the key, is i + 1
    assert torch.equal(batch["sample_info", "key"], batch["id"] + 1)
    # a reused batch (out=) is filled the same way
    again = table.sample(8, out=batch)
    assert again is batch and torch.equal(batch["sample_info", "key"], batch["id"] + 1)


def test_update_with_keys_skips_overwritten_slots(tables) -> None:
    table = prioritized(tables)
    table.extend(rows(0, 8))
    batch = table.sample(8)
    index, key = batch["index"], batch["sample_info", "key"]
    table.extend(rows(8, 8))  # a fast collector overwrites every slot
    before = table.sampler.priority(torch.arange(8)).clone()
    assert table.update_priority(index, torch.full((8,), 9.0), key=key) == 0
    assert torch.equal(table.sampler.priority(torch.arange(8)), before)
    # without keys the update lands on the new items, as before
    assert table.update_priority(index, torch.full((8,), 9.0)) == 8
    assert set(table.sampler.priority(index).tolist()) == {9.0}


def test_update_with_keys_applies_to_the_items_still_there(tables) -> None:
    table = prioritized(tables)
    table.extend(rows(0, 8))
    index = torch.arange(8)
    key = table.slots.ordinal[index].clone()
    table.extend(rows(8, 3))  # slots 0..2 now hold new items
    p = torch.arange(1.0, 9.0)
    assert table.update_priority(index, p, key=key) == 5
    got = table.sampler.priority(index)
    assert got[3:].tolist() == p[3:].tolist()
    assert got[:3].tolist() == [1.0, 1.0, 1.0]  # the new items keep their initial priority
    batch = table.sample(8)
    assert torch.equal(batch["sample_info", "key"], table.slots.ordinal[batch["index"]])


def test_keys_survive_checkpoint_and_restore(tables, tmp_path) -> None:
    table = prioritized(tables)
    table.extend(rows(0, 8))
    batch = table.sample(8)
    index, key = batch["index"], batch["sample_info", "key"]
    back = tables.restore(table.checkpoint(tmp_path / "ck"), root=tmp_path / "restored")
    assert back.update_priority(index, torch.full((8,), 4.0), key=key) == 8
    # new inserts continue the numbering: the keys of the old items never come back
    back.extend(rows(8, 8))
    fresh = back.sample(8)["sample_info", "key"]
    assert int(fresh.min()) >= 8
    assert back.update_priority(index, torch.full((8,), 2.0), key=key) == 0


@pytest.mark.parametrize(
    "key",
    [torch.arange(3), torch.arange(5), torch.arange(4, dtype=torch.float32)],
    ids=["short", "long", "float"],
)
def test_bad_keys_are_rejected_and_change_nothing(tables, key: torch.Tensor) -> None:
    table = prioritized(tables)
    table.extend(rows(0, 8))
    before = snapshot(table)
    with pytest.raises(InvalidRequest) as err:
        table.update_priority(torch.arange(4), torch.full((4,), 3.0), key=key)
    assert err.value.field == "key" and "'t'" in str(err.value)
    assert_same(before, snapshot(table))


def test_update_returns_the_count_without_keys(tables) -> None:
    table = prioritized(tables, capacity=8, max_times_sampled=1)
    table.extend(rows(0, 8))
    assert table.update_priority(torch.arange(8), torch.ones(8)) == 8
    batch = table.sample(4)  # each returned item is now spent and removed
    assert table.update_priority(batch["index"], torch.ones(4)) == 0
    assert table.update_priority(torch.empty(0, dtype=torch.int64), torch.empty(0)) == 0
