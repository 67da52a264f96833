"""Sampling semantics at the edges: queues and stacks with emptied slots, the rate limiter
below its minimum size, and ``max_times_sampled`` with slices (Reverb's semantics)."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
from testkit import make_spec, rows

from tdreplay.storage import InvalidRequest, SchemaError, TableSpec


def test_fifo_skips_items_removed_from_the_queue(tables) -> None:
    """A removed item (or a failed insert) leaves an empty slot in the queue: the items
    behind it are still returned, in order (it once stranded them: samples timed out
    with items queued, and a later insert into the hole jumped the queue)."""
    table = tables.create(make_spec(capacity=10, sampler={"kind": "fifo"}))
    table.extend(rows(0, 10))
    assert table.remove([5, 0]) == 2
    assert table.sample(4, timeout=1)["id"].tolist() == [1, 2, 3, 4]
    assert table.sample(2, timeout=1)["id"].tolist() == [6, 7]
    table.extend(rows(10, 6))  # into slots 0..5, behind the queued 8 and 9
    assert table.remove([8]) == 1  # the head itself
    assert table.sample(7, timeout=1)["id"].tolist() == [9, 10, 11, 12, 13, 14, 15]
    assert len(table) == 0


def test_lifo_skips_items_removed_from_the_stack(tables) -> None:
    table = tables.create(make_spec(capacity=10, sampler={"kind": "lifo"}))
    table.extend(rows(0, 10))
    assert table.remove([5, 9]) == 2
    assert table.sample(4, timeout=1)["id"].tolist() == [8, 7, 6, 4]
    assert table.sample(1, timeout=1)["id"].tolist() == [3]
    table.extend(rows(10, 7))  # the popped and removed slots are free again: 3..9
    assert len(table) == 10
    assert table.sample(10, timeout=1)["id"].tolist() == [16, 15, 14, 13, 12, 11, 10, 2, 1, 0]


def test_inserts_are_free_below_min_size_to_sample(tables) -> None:
    """Reverb's rule: an insert proceeds while the table holds at most min_size_to_sample
    items. Without it, items removed while inserts ran ahead left both sides waiting for
    good: samples for the minimum size, inserts for samples (a deadlock, measured: size
    5 of min 10, can_sample and can_insert both False)."""
    table = tables.create(
        make_spec(
            capacity=100,
            rate_limiter={"min_size_to_sample": 10, "samples_per_insert": 1.0, "error_buffer": 5},
        )
    )
    table.extend(rows(0, 15))  # inserts * SPI - samples = 15: the limiter's maximum
    assert not table.can_insert(1)
    assert table.remove(list(range(10))) == 10
    assert len(table) == 5 and not table.can_sample(1)
    assert table.can_insert(5) and not table.can_insert(6)
    assert table.info()["stats"]["rate_limiter"]["headroom"]["insert"] == 5
    table.extend(rows(15, 5), timeout=1)
    assert len(table) == 10 and table.can_sample(1) and not table.can_insert(1)
    assert len(table.sample(5, timeout=1)) == 5


def test_an_error_buffer_that_could_block_both_sides_is_refused(tables) -> None:
    """samples_per_insert 8, error_buffer 2 was accepted; after one insert and two samples
    neither an insert (difference 6 + 8 > 10) nor a sample (6 - 1 < 6) could ever proceed.
    Reverb's rule: error_buffer >= max(1, samples_per_insert)."""
    narrow = make_spec().model_dump(mode="json")
    narrow["rate_limiter"] = {"samples_per_insert": 8.0, "error_buffer": 2}
    with pytest.raises(SchemaError, match="error_buffer 2 is below"):
        TableSpec.parse(narrow)
    table = tables.create(make_spec(rate_limiter={"samples_per_insert": 8.0, "error_buffer": 8}))
    for i in range(50):  # one side can always move
        if table.can_sample(1):
            table.sample(1)
        else:
            assert table.can_insert(1), table.rate_limiter.info()
            table.extend(rows(i, 1))


@pytest.mark.parametrize("huge", [math.inf, 1e12])
def test_an_infinite_timeout_waits_and_a_bad_one_is_refused(tables, huge: float) -> None:
    """timeout=inf, and a huge finite one the wire takes too, raised a raw OverflowError
    ('timestamp out of range for platform time_t') instead of waiting; NaN and -1 'timed
    out after nans' / '-1s'. The rule is the contract's (``codec.params.Seconds``)."""
    table = tables.create(make_spec(capacity=8))
    got: list = []
    waiter = threading.Thread(target=lambda: got.append(table.sample(1, timeout=huge)))
    waiter.start()
    time.sleep(0.1)
    assert waiter.is_alive()
    table.extend(rows(0, 1), timeout=huge)
    waiter.join(5)
    assert not waiter.is_alive() and got[0]["id"].tolist() == [0]
    for bad in (math.nan, -1.0):
        with pytest.raises(
            InvalidRequest, match="timeout: Input should be greater than or equal to 0"
        ):
            table.sample(1, timeout=bad)
        with pytest.raises(
            InvalidRequest, match="timeout: Input should be greater than or equal to 0"
        ):
            table.extend(rows(1, 1), timeout=bad)
    assert len(table) == 1 and table.rate_limiter.samples == 1


def test_a_priority_is_checked_alike_on_insert_and_on_update(tables) -> None:
    """One rule for a priority, wherever it comes from: a number past float32's range is
    kept as given (an update once read it as float32, inf, and refused what an insert
    took), and a negative or non-finite one is refused the same way, changing nothing."""
    table = tables.create(make_spec(capacity=8, sampler={"kind": "prioritized"}))
    table.extend(rows(0, 2), priority=1e39)
    assert table.sampler.priorities[:2].tolist() == [1e39, 1e39]
    assert table.update_priority([0, 1], [1e39, 2.5]) == 2
    assert table.sampler.priorities[:2].tolist() == [1e39, 2.5]
    for bad in (float("inf"), float("nan"), -1.0, True):  # a bool is no priority (was 1.0)
        rule = "priorities must be numbers" if bad is True else "priorities must be finite and >= 0"
        with pytest.raises(InvalidRequest, match=rule) as insert:
            table.extend(rows(2, 1), priority=bad)
        with pytest.raises(InvalidRequest, match=rule) as update:
            table.update_priority([1], [bad])
        with pytest.raises(InvalidRequest, match=rule):
            table.update_priority([1], torch.tensor([bad]))
        assert insert.value.field == update.value.field == "priority"
    assert len(table) == 2 and table.sampler.priorities[:2].tolist() == [1e39, 2.5]
