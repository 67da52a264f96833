"""Writers and removers: which items an insert evicts, and when sampled items go."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from storage_helpers import assert_same, snapshot
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import InvalidRequest, RateLimitTimeout


def test_round_robin_evicts_the_oldest(tables) -> None:
    table = tables.create(make_spec(capacity=8))
    total = 0
    for n in [3, 3, 3, 5, 8, 1, 7, 2]:
        slots = table.extend(rows(total, n))
        assert slots.tolist() == [(total + i) % 8 for i in range(n)]
        total += n
        kept = list(range(max(0, total - 8), total))
        assert table.read(table.live_index())["id"].tolist() == kept
        assert table.writer.cursor == total % 8
        assert len(table) == len(kept)
    assert table.info()["inserts"] == total


def value_table(tables, backend: dict | None = None, capacity: int = 16, **extra):
    spec = make_spec(
        capacity=capacity,
        backend=backend,
        fields={"value": {"shape": [1], "dtype": "float32"}},
        writer={"kind": "max_value", "key": "value"},
        **extra,
    )
    return tables.create(spec)


def valued(start: int, values: torch.Tensor):
    data = rows(start, len(values))
    data["value"] = values.reshape(-1, 1).float()
    return data


def test_max_value_keeps_the_top_k(backend: dict, tables) -> None:
    table = value_table(tables, backend)
    g = torch.Generator().manual_seed(0)
    seen_ids: list[int] = []
    seen_values: list[float] = []
    next_id = 0
    for n in [5, 9, 16, 3, 12, 1, 16, 7]:
        values = torch.randn(n, generator=g)
        values[0] = values[-1]  # a tie inside a batch
        data = valued(next_id, values)
        slots = table.extend(data)
        # the slot of each row of the batch, -1 for a row dropped
        assert len(slots) == n
        kept = table.read(slots[slots >= 0])
        assert_consistent(kept)
        assert kept["id"].tolist() == [
            next_id + i for i in (slots >= 0).nonzero().flatten().tolist()
        ]
        assert torch.equal(kept["value"], data["value"][kept["id"] - next_id])
        if (slots < 0).any() and (slots >= 0).any():  # what was dropped was no larger
            dropped = values[slots < 0]
            assert float(dropped.max()) <= float(values[slots >= 0].min())
        seen_ids += list(range(next_id, next_id + n))
        seen_values += values.tolist()
        next_id += n
        stored = table.read(table.live_index())
        assert_consistent(stored)
        reference = sorted(seen_values, reverse=True)[:16]
        assert sorted(stored["value"].reshape(-1).tolist(), reverse=True) == pytest.approx(
            reference
        )
        # each stored id carries its own value
        by_id = dict(zip(seen_ids, seen_values, strict=True))
        for i, v in zip(stored["id"].tolist(), stored["value"].reshape(-1).tolist(), strict=True):
            assert by_id[i] == pytest.approx(v)
    info = table.info()["writer"]
    assert info["min_value"] == pytest.approx(sorted(seen_values, reverse=True)[15])
    assert info["max_value"] == pytest.approx(max(seen_values))


def test_max_value_drops_items_below_the_minimum(tables) -> None:
    table = value_table(tables, capacity=4)
    table.extend(valued(0, torch.tensor([10.0, 20.0, 30.0, 40.0])))
    slots = table.extend(valued(4, torch.tensor([5.0, 50.0, 1.0])))
    assert slots[0] == -1 and slots[2] == -1 and slots[1] >= 0  # each row's slot, -1: dropped
    assert table.read(slots[1:2])["id"].tolist() == [5]
    assert sorted(table.read(table.live_index())["value"].reshape(-1).tolist()) == [
        20.0,
        30.0,
        40.0,
        50.0,
    ]
    assert table.info()["inserts"] == 5  # only kept items count
    nothing = table.extend(valued(7, torch.tensor([0.0, -1.0])))
    assert nothing.tolist() == [-1, -1] and len(table) == 4


def test_max_times_sampled_removes_items_after_n_samples(tables) -> None:
    table = tables.create(make_spec(capacity=16, max_times_sampled=3))
    table.extend(rows(0, 4))
    counts: Counter = Counter()
    while len(table):
        batch = table.sample(1)
        (i,) = batch["id"].tolist()
        counts[i] += 1
        assert batch["sample_info", "times_sampled"].tolist() == [counts[i]]
        assert len(table) == 4 - sum(c == 3 for c in counts.values())
    assert counts == {0: 3, 1: 3, 2: 3, 3: 3}
    with pytest.raises(RateLimitTimeout):
        table.sample(1, timeout=0.05)
    # freed slots are written again in ring order
    assert table.extend(rows(4, 2)).tolist() == [4, 5]


@pytest.mark.parametrize("sampler", ["uniform", "prioritized", "without_replacement"])
@pytest.mark.parametrize("max_times", [1, 2])
def test_max_times_sampled_holds_inside_a_batch(tables, sampler: str, max_times: int) -> None:
    """An item is never returned more than max_times_sampled times, batches included (Reverb)."""
    table = tables.create(
        make_spec(capacity=64, sampler={"kind": sampler}, max_times_sampled=max_times)
    )
    table.extend(rows(0, 40))
    counts: Counter = Counter()
    while len(table) * max_times >= 8:
        batch = table.sample(8)
        assert_consistent(batch)
        assert batch["sample_info", "times_sampled"].max() <= max_times
        counts.update(batch["id"].tolist())
    assert max(counts.values()) <= max_times
    live = set(table.read(table.live_index())["id"].tolist())
    assert live.isdisjoint(i for i, c in counts.items() if c == max_times)
    assert sum(counts.values()) + sum(max_times - counts[i] for i in live) == 40 * max_times


def test_max_times_sampled_waits_for_enough_items(tables) -> None:
    table = tables.create(make_spec(capacity=64, max_times_sampled=1))
    table.extend(rows(0, 3))
    assert not table.can_sample(4)
    with pytest.raises(RateLimitTimeout):
        table.sample(4, timeout=0.05)
    table.extend(rows(3, 1))
    assert sorted(table.sample(4)["id"].tolist()) == [0, 1, 2, 3]
    assert len(table) == 0


def test_max_times_sampled_with_prioritized_drops_the_mass(tables) -> None:
    table = tables.create(
        make_spec(capacity=8, sampler={"kind": "prioritized", "alpha": 1.0}, max_times_sampled=1)
    )
    table.extend(rows(0, 2))
    table.update_priority(torch.tensor([0]), torch.tensor([1e9]))
    assert table.sample(1)["id"].tolist() == [0]
    assert table.sample(1)["id"].tolist() == [1]
    assert table.sampler.tree.total() == 0.0


def test_max_value_rejects_nan_values(tables) -> None:
    """A NaN would outrank every value and stay for ever; it is refused, and nothing changes."""
    table = value_table(tables, capacity=4)
    table.extend(valued(0, torch.tensor([1.0, 2.0, 3.0])))
    before = snapshot(table)
    with pytest.raises(InvalidRequest, match="key 'value' holds NaN") as info:
        table.extend(valued(3, torch.tensor([float("nan"), 5.0])))
    assert info.value.field == "value"
    assert_same(before, snapshot(table))
    table.extend(valued(5, torch.tensor([10.0, 11.0, 12.0, 13.0])))
    assert sorted(table.read(table.live_index())["value"].reshape(-1).tolist()) == [
        10.0,
        11.0,
        12.0,
        13.0,
    ]
