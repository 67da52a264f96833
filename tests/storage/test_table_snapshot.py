"""``Table.snapshot()``: the table at one instant, read while it serves (or held, to compare)."""

from __future__ import annotations

import threading

import pytest
import torch
from testkit import make_spec, rows

from tdreplay.storage import TableClosed
from tdreplay.storage.checkpoint.sinks import RowsInMemory


def copied(snap, table) -> dict:
    schema = table.spec.torch_schema()
    sink = RowsInMemory({k: torch.empty([snap.hi, *s], dtype=d) for k, (s, d) in schema.items()})
    snap.copy(sink)
    return sink.tensors


def test_rows_overwritten_inside_the_block_come_out_as_they_were(tables) -> None:
    table = tables.create(make_spec(capacity=16))
    table.extend(rows(0, 16))
    with table.snapshot() as snap:
        table.extend(rows(16, 4))  # overwrites slots 0..3 while the snapshot is read
        got = copied(snap, table)
    assert snap.hi == 16 and snap.size == 16 and snap.state["slots"]["inserted"] == 16
    assert got[("id",)].tolist() == list(range(16))  # items 0..3, not 16..19
    assert table.read(torch.arange(4))["id"].tolist() == [16, 17, 18, 19]


def test_a_held_snapshot_keeps_extends_waiting_until_the_block_ends(tables) -> None:
    table = tables.create(make_spec(capacity=16))
    table.extend(rows(0, 8))
    done = threading.Event()
    with table.snapshot(hold=True) as snap:
        writer = threading.Thread(target=lambda: (table.extend(rows(8, 4)), done.set()))
        writer.start()
        assert not done.wait(0.2)  # the extend waits for the table's locks
        assert copied(snap, table)[("id",)].tolist() == list(range(8))
    writer.join(10)
    assert done.is_set() and len(table) == 12


def test_a_closed_table_has_no_snapshot_and_no_items(tables) -> None:
    table = tables.create(make_spec(capacity=16))
    table.extend(rows(0, 4))
    table.close()
    with pytest.raises(TableClosed), table.snapshot():
        pass
    with pytest.raises(TableClosed):
        table.items()


def test_items_are_the_live_ones_oldest_first_read_in_chunks(tables) -> None:
    table = tables.create(make_spec(capacity=8))
    table.extend(rows(0, 8))
    table.extend(rows(8, 3))  # a wrapped ring: slots 0..2 hold the newest
    items = table.items()
    assert len(items) == 8
    got = [data[("id",)].tolist() for data, _ in items.chunks(3)]
    assert got == [[3, 4, 5], [6, 7, 8], [9, 10]]


def _oldest_first(table) -> list[int]:
    """The live items' ids sorted by ordinal: what an export must give, in that order."""
    s = table.slots
    live = s.live.nonzero().squeeze(1)
    order = live[torch.argsort(s.ordinal[live])]
    return table.read(order)["id"].tolist() if len(order) else []


@pytest.mark.parametrize(
    ("extra", "ring"),
    [
        ({}, True),
        ({"sampler": {"kind": "fifo"}}, True),
        ({"max_times_sampled": 2}, True),
        ({"sampler": {"kind": "lifo"}}, False),
        ({"writer": {"kind": "max_value", "key": "id"}}, False),
    ],
    ids=["round_robin", "fifo", "max_times_sampled", "lifo-stack", "max_value"],
)
@pytest.mark.parametrize("rows_per_chunk", [1, 3, 7, 64])
def test_items_oldest_first_along_the_ring_or_sorted(
    tables, extra: dict, ring: bool, rows_per_chunk: int
) -> None:
    """A ring writer's items are read along the ring, with nothing held per item; every
    other writer's are sorted by ordinal. Either way: the live items oldest first, in
    chunks of the asked rows (the last fewer), through fills, wraps and holes."""
    table = tables.create(make_spec(capacity=16, **extra))
    start = 0
    for n, take in [(5, 0), (9, 3), (7, 2), (6, 0), (3, 4)]:  # partial, full, wrapped, holes
        if table.slots.n_live + n > 16 and ("lifo" in str(extra) or "fifo" in str(extra)):
            table.sample(table.slots.n_live + n - 16)  # a queue or stack waits when full
        table.extend(rows(start, n))
        start += n
        if take and table.can_sample(take):
            table.sample(take)  # fifo/lifo consume; max_times_sampled may remove
        if not extra:
            table.remove(torch.tensor([(start + 1) % 16]))  # a hole in the ring
        items = table.items()
        assert (items.ring is not None) == ring and (items.order is None) == ring
        chunks = [data[("id",)].tolist() for data, _ in items.chunks(rows_per_chunk)]
        assert [x for c in chunks for x in c] == _oldest_first(table)
        assert all(len(c) == rows_per_chunk for c in chunks[:-1])
        assert sum(read for _, read in items.chunks(rows_per_chunk)) == len(items)


def test_a_ring_whose_ordinals_disagree_is_read_sorted(tables) -> None:
    """A restored state may put the cursor where the ordinals do not start (it is checked
    for its ranges, not for this): the items still come oldest first, by ordinal."""
    table = tables.create(make_spec(capacity=8))
    table.extend(rows(0, 8))
    state = table.state_dict()
    state["writer"]["cursor"] = 3  # the ring would start at item 3
    table.load_state_dict(state)
    items = table.items()
    assert items.ring == 3
    assert [x for data, _ in items.chunks(3) for x in data[("id",)].tolist()] == list(range(8))
    assert items.ring is None and items.order is not None  # found out, and sorted
