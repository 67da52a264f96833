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
