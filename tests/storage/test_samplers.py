"""Samplers: which items a sample returns, how often, and in what order."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
import torch
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import InvalidRequest, RateLimitTimeout


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


# 99.9% quantiles of the chi-square distribution by degrees of freedom
CHI2_999 = {7: 24.32, 9: 27.88}


# ---------------------------------------------------------------- uniform
def test_uniform_never_samples_unwritten_rows(tables) -> None:
    """TorchRL's pitfall: 10 rows in a 1000-row from_schema storage, sample 256 -> zero rows."""
    table = tables.create(make_spec(capacity=1000))
    table.extend(rows(0, 10))
    batch = table.sample(256)
    assert_consistent(batch)
    assert batch["index"].max() < 10
    assert set(batch["id"].tolist()) == set(range(10))


def test_uniform_is_roughly_uniform(tables) -> None:
    table = tables.create(make_spec(capacity=1000))
    table.extend(rows(0, 10))
    counts = torch.zeros(10)
    for _ in range(20):
        counts += torch.bincount(table.sample(1000)["id"], minlength=10)
    assert chi_square(counts, torch.full((10,), 0.1)) < CHI2_999[9], counts


def test_uniform_after_ring_wrap_and_reseeding(tables) -> None:
    table = tables.create(make_spec(capacity=50), seed=7)
    table.extend(rows(0, 45))
    table.extend(rows(45, 20))  # wraps: ids 15..64 live
    ids = torch.cat([table.sample(50)["id"] for _ in range(40)])
    assert set(ids.tolist()) == set(range(15, 65))
    # the same seed draws the same indices
    again = tables.create(make_spec(name="again", capacity=50), seed=7)
    again.extend(rows(0, 45))
    again.extend(rows(45, 20))
    assert torch.equal(
        torch.cat([again.sample(50)["id"] for _ in range(40)]),
        ids,
    )


# ---------------------------------------------------------------- prioritized
def prioritized(
    tables, *, alpha: float = 0.7, beta: float = 0.5, capacity: int = 64, table=None, **extra
):
    spec = make_spec(
        capacity=capacity,
        sampler={"kind": "prioritized", "alpha": alpha, "beta": beta, **extra},
        **(table or {}),
    )
    return tables.create(spec)


def test_prioritized_frequencies_follow_p_to_the_alpha(tables) -> None:
    alpha, eps = 0.7, 1e-6
    table = prioritized(tables, alpha=alpha)
    table.extend(rows(0, 8))
    p = torch.arange(1, 9, dtype=torch.float64)
    table.update_priority(torch.arange(8), p)
    counts = torch.zeros(8, dtype=torch.float64)
    for _ in range(500):
        counts += torch.bincount(table.sample(64)["id"], minlength=8)
    probs = (p + eps) ** alpha / ((p + eps) ** alpha).sum()
    assert chi_square(counts, probs) < CHI2_999[7], (counts / counts.sum(), probs)
    assert torch.allclose(counts / counts.sum(), probs, rtol=0.06)


def test_prioritized_importance_weights(tables) -> None:
    alpha, beta, eps = 0.6, 0.4, 1e-6
    table = prioritized(tables, alpha=alpha, beta=beta)
    table.extend(rows(0, 6))
    p = torch.tensor([0.5, 1.0, 2.0, 4.0, 8.0, 16.0], dtype=torch.float64)
    table.update_priority(torch.arange(6), p)
    batch = table.sample(64)
    probs = (p + eps) ** alpha / ((p + eps) ** alpha).sum()
    w = (6 * probs) ** -beta
    expected = (w / w.max())[batch["index"]]
    assert torch.allclose(batch["sample_info", "weight"].double(), expected, rtol=1e-5)
    # what each weight was divided by comes with it: (N * P_min)^-beta, the largest
    assert torch.allclose(batch["sample_info", "max_weight"], w.max().expand(64))
    assert torch.allclose(batch["sample_info", "priority"].double(), p[batch["index"]])
    # the lowest priority has the largest weight, 1
    assert batch["sample_info", "weight"].max() <= 1.0
    low = batch["index"] == 0
    if low.any():
        assert torch.allclose(batch["sample_info", "weight"][low], torch.ones(int(low.sum())))


def test_update_priority_changes_sampling(tables) -> None:
    table = prioritized(tables, alpha=1.0)
    table.extend(rows(0, 8))
    table.update_priority(torch.tensor([3]), torch.tensor([1000.0]))
    ids = torch.cat([table.sample(64)["id"] for _ in range(20)])
    assert (ids == 3).float().mean() > 0.97
    # priority 0 makes an item all but unreachable (eps keeps it above zero)
    table.update_priority(torch.arange(8), torch.tensor([1.0] * 3 + [0.0] + [1.0] * 4))
    ids = torch.cat([table.sample(64)["id"] for _ in range(20)])
    assert (ids == 3).sum() == 0
    assert set(ids.tolist()) == {0, 1, 2, 4, 5, 6, 7}


def test_new_items_get_the_largest_priority_seen(tables) -> None:
    table = prioritized(tables)
    table.extend(rows(0, 2))
    assert table.sample(8)["sample_info", "priority"].tolist() == [1.0] * 8
    table.update_priority(torch.tensor([0, 1]), torch.tensor([5.0, 0.25]))
    table.extend(rows(2, 1))
    assert table.sampler.priority(torch.tensor([2])).tolist() == [5.0]


def test_initial_priority_and_extend_priorities(tables) -> None:
    table = prioritized(tables, initial_priority=0.5)
    table.extend(rows(0, 2))
    table.extend(rows(2, 2), priority=torch.tensor([3.0, 7.0]))
    assert table.sampler.priority(torch.arange(4)).tolist() == [0.5, 0.5, 3.0, 7.0]
    table.extend(rows(4, 1))
    assert table.sampler.priority(torch.tensor([4])).tolist() == [0.5]


def test_removed_items_lose_their_priority_mass(tables) -> None:
    table = prioritized(tables, alpha=1.0, capacity=4, initial_priority=1.0)
    table.extend(rows(0, 4))
    table.update_priority(torch.tensor([0]), torch.tensor([1e6]))
    table.extend(rows(4, 1))  # overwrites slot 0, the heavy item
    ids = torch.cat([table.sample(4)["id"] for _ in range(50)])
    assert 0 not in ids.tolist()
    assert set(ids.tolist()) == {1, 2, 3, 4}


@pytest.mark.parametrize(
    ("index", "priority", "words"),
    [
        ([0, 1], [1.0, -2.0], "finite and >= 0, got -2.0"),
        ([0], [float("nan")], "finite and >= 0, got nan"),
        ([0], [float("inf")], "finite and >= 0, got inf"),
        ([0, 1], [1.0], "2 indices but 1 priorities"),
        ([0, 64], [1.0, 1.0], "index 64 outside [0, 64)"),
        ([-1], [1.0], "index -1 outside [0, 64)"),
    ],
)
def test_bad_priority_updates_are_rejected_and_change_nothing(
    tables, index: list[int], priority: list[float], words: str
) -> None:
    table = prioritized(tables)
    table.extend(rows(0, 8))
    table.update_priority(torch.arange(8), torch.arange(1, 9).double())
    before = (table.sampler.priorities.clone(), table.sampler.tree.sums.clone())
    with pytest.raises(InvalidRequest) as info:
        table.update_priority(torch.tensor(index), torch.tensor(priority))
    assert words in str(info.value)
    assert str(info.value).startswith("table 't': ") and info.value.table == "t"
    assert torch.equal(table.sampler.priorities, before[0])
    assert torch.equal(table.sampler.tree.sums, before[1])


@pytest.mark.parametrize("kind", ["uniform", "fifo", "lifo", "without_replacement", "slice"])
def test_update_priority_needs_a_prioritized_sampler(tables, kind: str) -> None:
    """Refused naming the table, its sampler and the field, with nothing changed; priorities
    given to an extend of such a table are refused the same way."""
    sampler = {"kind": kind, **({"slice_len": 2} if kind == "slice" else {})}
    table = tables.create(make_spec(name="plain", capacity=8, sampler=sampler))
    table.extend(rows(0, 4))
    words = f"table 'plain': the {kind!r} sampler keeps no priorities"
    with pytest.raises(InvalidRequest, match=words) as info:
        table.update_priority(torch.tensor([0]), torch.tensor([1.0]))
    assert (info.value.table, info.value.field) == ("plain", "priority")
    with pytest.raises(InvalidRequest, match=words) as info:
        table.extend(rows(4, 1), priority=[1.0])
    assert (info.value.table, info.value.field) == ("plain", "priority")
    assert len(table) == 4 and table.rate_limiter.inserts == 4


def test_update_priority_skips_removed_slots(tables) -> None:
    table = prioritized(tables, capacity=8, table={"max_times_sampled": 1})
    table.extend(rows(0, 1))
    batch = table.sample(1)  # removes item 0
    assert len(table) == 0
    table.update_priority(batch["index"], torch.tensor([9.0]))
    assert table.sampler.tree.total() == 0.0
    table.extend(rows(1, 1))
    assert table.sample(1)["id"].tolist() == [1]


# ---------------------------------------------------------------- fifo / lifo
def test_fifo_returns_each_item_once_in_insertion_order(tables) -> None:
    table = tables.create(make_spec(capacity=8, sampler={"kind": "fifo"}))
    out: list[int] = []
    next_id = 0
    g = torch.Generator().manual_seed(0)
    for _ in range(60):  # many laps around the ring
        free = 8 - len(table)
        if free:
            n = int(torch.randint(1, free + 1, (1,), generator=g))
            table.extend(rows(next_id, n))
            next_id += n
        k = int(torch.randint(1, len(table) + 1, (1,), generator=g))
        batch = table.sample(k)
        assert_consistent(batch)
        assert torch.equal(batch["sample_info", "times_sampled"], torch.ones(k, dtype=torch.int64))
        out += batch["id"].tolist()
    out += table.sample(len(table))["id"].tolist() if len(table) else []
    assert out == list(range(next_id))
    assert len(table) == 0


def test_fifo_sample_waits_when_empty_and_insert_waits_when_full(tables) -> None:
    table = tables.create(make_spec(capacity=4, sampler={"kind": "fifo"}))
    with pytest.raises(RateLimitTimeout):
        table.sample(1, timeout=0.05)
    table.extend(rows(0, 3))
    with pytest.raises(RateLimitTimeout):
        table.sample(4, timeout=0.05)  # only 3 queued
    with pytest.raises(RateLimitTimeout):
        table.extend(rows(3, 2), timeout=0.05)  # 1 free slot
    assert table.can_insert(1) and not table.can_insert(2)
    table.extend(rows(3, 1))
    assert len(table) == 4 and not table.can_insert(1)
    assert table.sample(2)["id"].tolist() == [0, 1]
    table.extend(rows(4, 2))
    assert table.sample(4)["id"].tolist() == [2, 3, 4, 5]


def test_fifo_blocked_calls_are_released_by_the_other_side(tables) -> None:
    table = tables.create(make_spec(capacity=2, sampler={"kind": "fifo"}))
    got: list = []
    consumer = threading.Thread(target=lambda: got.append(table.sample(2, timeout=10)))
    consumer.start()
    time.sleep(0.1)
    assert consumer.is_alive()
    table.extend(rows(0, 2))
    consumer.join(5)
    assert not consumer.is_alive() and got[0]["id"].tolist() == [0, 1]

    table.extend(rows(2, 2))  # full
    producer = threading.Thread(target=lambda: got.append(table.extend(rows(4, 1), timeout=10)))
    producer.start()
    time.sleep(0.1)
    assert producer.is_alive()
    assert table.sample(1)["id"].tolist() == [2]
    producer.join(5)
    assert not producer.is_alive()
    assert table.sample(2)["id"].tolist() == [3, 4]


def test_lifo_returns_newest_first(tables) -> None:
    table = tables.create(make_spec(capacity=8, sampler={"kind": "lifo"}))
    table.extend(rows(0, 5))
    assert table.sample(2)["id"].tolist() == [4, 3]
    table.extend(rows(5, 2))
    assert table.sample(3)["id"].tolist() == [6, 5, 2]
    assert table.sample(2)["id"].tolist() == [1, 0]
    assert len(table) == 0
    with pytest.raises(RateLimitTimeout):
        table.sample(1, timeout=0.05)
    table.extend(rows(10, 8))
    with pytest.raises(RateLimitTimeout):
        table.extend(rows(18, 1), timeout=0.05)  # full stack
    assert table.sample(1)["id"].tolist() == [17]
    table.extend(rows(18, 1))
    assert table.sample(8)["id"].tolist() == [18, 16, 15, 14, 13, 12, 11, 10]


# ---------------------------------------------------------------- without replacement
@pytest.mark.parametrize("batch", [5, 7, 20])
def test_without_replacement_epoch_covers_every_item_once(tables, batch: int) -> None:
    table = tables.create(make_spec(capacity=32, sampler={"kind": "without_replacement"}))
    table.extend(rows(0, 20))
    drawn: list[int] = []
    while len(drawn) < 60:
        drawn += table.sample(batch)["id"].tolist()
    for epoch in range(3):
        assert sorted(drawn[20 * epoch : 20 * epoch + 20]) == list(range(20)), epoch
    # epochs are shuffled differently
    assert drawn[:20] != drawn[20:40]


def test_without_replacement_new_items_join_the_next_epoch(tables) -> None:
    table = tables.create(make_spec(capacity=32, sampler={"kind": "without_replacement"}))
    table.extend(rows(0, 10))
    first = table.sample(5)["id"].tolist()
    table.extend(rows(10, 5))
    rest = table.sample(5)["id"].tolist()
    assert sorted(first + rest) == list(range(10))
    nxt = table.sample(15)["id"].tolist()
    assert sorted(nxt) == list(range(15))


# ---------------------------------------------------------------- slices
def slice_spec(capacity: int, slice_len: int, **sampler):
    episodes = {"ep": {"shape": [], "dtype": "int64"}} if sampler.get("traj_key") else {}
    return make_spec(
        capacity=capacity,
        fields=episodes,
        sampler={"kind": "slice", "slice_len": slice_len, **sampler},
    )


def with_episodes(start: int, episodes: list[int]):
    data = rows(start, len(episodes))
    data["ep"] = torch.tensor(episodes, dtype=torch.int64)
    return data


def sampled_slices(table, slice_len: int, calls: int, per_call: int) -> torch.Tensor:
    out = []
    for _ in range(calls):
        batch = table.sample(slice_len * per_call)
        assert_consistent(batch)
        out.append(batch["id"].reshape(-1, slice_len))
    return torch.cat(out)


def test_slices_by_traj_key_stay_inside_episodes(tables) -> None:
    lengths = [3, 7, 1, 12, 5, 4, 2, 9]
    episodes = [e for e, n in enumerate(lengths) for _ in range(n)]
    table = tables.create(slice_spec(64, 4, traj_key="ep", end_key=None))
    table.extend(with_episodes(0, episodes[:20]))
    table.extend(with_episodes(20, episodes[20:]))
    ep = torch.tensor(episodes)
    slices = sampled_slices(table, 4, 60, 8)
    assert torch.equal(slices - slices[:, :1], torch.arange(4).expand_as(slices))
    assert (ep[slices] == ep[slices[:, :1]]).all()
    valid = {s for s in range(len(episodes) - 3) if len(set(episodes[s : s + 4])) == 1}
    assert set(slices[:, 0].tolist()) == valid


def test_slices_by_end_key_stay_inside_episodes(tables) -> None:
    table = tables.create(slice_spec(64, 3, end_key="next.done"))
    for start in range(0, 40, 5):  # episodes (every 7 items) span extend calls
        table.extend(rows(start, 5, episode_len=7))
    slices = sampled_slices(table, 3, 60, 8)
    assert torch.equal(slices - slices[:, :1], torch.arange(3).expand_as(slices))
    assert ((slices[:, :-1] % 7) != 6).all()  # a done flag can only close a slice
    valid = {s for s in range(38) if s // 7 == (s + 2) // 7}
    assert set(slices[:, 0].tolist()) == valid
    assert {4, 9, 14} <= valid  # slices across extend calls do occur


def test_slices_never_cross_the_ring_write_cursor(tables) -> None:
    table = tables.create(slice_spec(20, 4, traj_key="ep", end_key=None))
    for start in range(0, 30, 6):  # one long episode, 30 items into 20 slots
        table.extend(with_episodes(start, [0] * 6))
    slices = sampled_slices(table, 4, 60, 5)
    assert torch.equal(slices - slices[:, :1], torch.arange(4).expand_as(slices))
    # live ids 10..29; slot 9 holds 29 and slot 10 holds 10: no slice joins them
    assert set(slices[:, 0].tolist()) == set(range(10, 27))
    assert 17 in set(slices[:, 0].tolist())  # wraps from slot 19 to slot 0, legitimately


def test_slice_batch_must_be_a_multiple_of_slice_len(tables) -> None:
    table = tables.create(slice_spec(32, 4, traj_key="ep", end_key=None))
    words = r"^table 't': batch size 6 is not a multiple of slice_len 4"
    with pytest.raises(InvalidRequest, match=words) as info:
        table.sample(6, timeout=0.2)  # refused at once, even with nothing to sample
    assert (info.value.table, info.value.field) == ("t", "batch_size")
    table.extend(with_episodes(0, [0] * 8))
    with pytest.raises(InvalidRequest, match="multiple of slice_len 4"):
        table.sample(6)
    assert table.rate_limiter.samples == 0
    ids = table.sample(8)["id"].reshape(2, 4)
    assert torch.equal(ids - ids[:, :1], torch.arange(4).expand(2, 4))


def test_slice_sampler_waits_for_a_whole_slice(tables) -> None:
    table = tables.create(slice_spec(32, 4, traj_key="ep", end_key=None))
    table.extend(with_episodes(0, [0, 0, 0, 1, 1, 1]))  # no episode is 4 long
    assert not table.can_sample(4)
    with pytest.raises(RateLimitTimeout):
        table.sample(4, timeout=0.05)
    table.extend(with_episodes(6, [1]))
    assert table.sample(4)["id"].tolist() == [3, 4, 5, 6]


def test_samplers_report_their_state(tables) -> None:
    table = tables.create(make_spec(capacity=16, sampler={"kind": "without_replacement"}))
    table.extend(rows(0, 10))
    table.sample(4)
    info = table.info()["sampler"]
    assert info == {
        "kind": "without_replacement",
        "epoch": 1,
        "epoch_position": 4,
        "epoch_size": 10,
    }
    counts = Counter(table.sample(6)["id"].tolist())
    assert max(counts.values()) == 1


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"sampler": {"kind": "prioritized", "alpha": 0.7, "beta": 0.5}},
        {"sampler": {"kind": "prioritized", "alpha": 0.7, "beta": 0.5}, "max_times_sampled": 2},
        {"max_times_sampled": 3},
        {"sampler": {"kind": "without_replacement"}},
        {"sampler": {"kind": "fifo"}},
        {"sampler": {"kind": "lifo"}},
    ],
    ids=[
        "uniform",
        "prioritized",
        "prioritized_capped",
        "max_times_sampled",
        "without_replacement",
        "fifo",
        "lifo",
    ],
)
@pytest.mark.parametrize("kind", ["memory", "memmap"])
def test_a_small_sample_into_a_target_counts_and_reads_as_any_other(
    tables, extra: dict, kind: str
) -> None:
    """A sample of a few items into a reused target (each item counted and read one by one)
    and a plain sample on a twin table with the same seed draw the same items and answer
    the same index, times sampled, key, priority and weight, and leave the same counts."""
    backend = {"kind": kind}
    a, b, c = (
        tables.create(make_spec(name=name, capacity=16, backend=backend, **extra), seed=7)
        for name in "abc"
    )
    for t in (a, b, c):
        t.extend(rows(0, 12))
        if "prioritized" in str(extra):
            t.update_priority(torch.arange(12), torch.arange(1.0, 13.0))
    # the targets are made of a third table's samples: a queue's twins keep their items
    targets = {n: a.target(c.sample(n).clone(), n) for n in (1, 3, 8)}
    compared: set[int] = set()
    for n in [1, 3, 8, 1, 8, 3] * 2:
        if not a.can_sample(n):
            assert not b.can_sample(n)
            continue
        got, want = a.sample(n, out=targets[n]), b.sample(n)
        compared.add(n)
        for key in ("index", ("sample_info", "times_sampled"), ("sample_info", "key")):
            assert torch.equal(got[key], want[key]), (key, got[key], want[key])
        weighted = [("sample_info", "max_weight")] if "prioritized" in str(extra) else []
        for key in [("sample_info", "priority"), ("sample_info", "weight"), *weighted]:
            assert torch.allclose(got[key], want[key]), (key, got[key], want[key])
        assert torch.equal(got["id"], want["id"])
    assert compared == {1, 3, 8}  # each size drawn into its target at least once
    assert torch.equal(a.slots.times_sampled, b.slots.times_sampled)
    assert torch.equal(a.slots.live, b.slots.live)
