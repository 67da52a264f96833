"""A checkpoint holds the rows of live slots only; a restore puts them back in their slots.

Before, a checkpoint copied every written row, ``[0, hi)``, live or not: a drained FIFO
table of 2,000 x 1 KB rows checkpointed 2 MB of rows though it held no item (100k rows: 100
MB). Now ``storage/`` holds the live slots' rows in slot order (``live_only`` in the
metadata; the state's ``slots.live`` says which), and the restored table is the same table:
its state, its live rows bit for bit, the same draws from then on.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from storage_helpers import assert_bitwise_equal, assert_same
from tensordict import TensorDict

from tdreplay.storage import Table, TableSpec

ROW = 1024


def queue(root: Path, capacity: int = 2000, sampler: str = "fifo") -> Table:
    spec = TableSpec.model_validate(
        {
            "name": "q",
            "capacity": capacity,
            "backend": {"kind": "memory"},
            "sampler": {"kind": sampler},
            "fields": {
                "obs": {"shape": [ROW], "dtype": "uint8"},
                "id": {"shape": [], "dtype": "int64"},
            },
        }
    )
    return Table.create(spec, root, seed=3)


def batch(start: int, n: int) -> TensorDict:
    ids = torch.arange(start, start + n)
    obs = (ids[:, None] * 7 + torch.arange(ROW)).to(torch.uint8)
    return TensorDict({"obs": obs, "id": ids}, [n])


def row_bytes(path: Path) -> int:
    """The bytes of a checkpoint's row files."""
    folder = path / "storage"
    return sum(f.stat().st_size for f in folder.rglob("*.memmap")) if folder.exists() else 0


def test_a_drained_queue_checkpoints_no_row(tmp_path: Path) -> None:
    table = queue(tmp_path / "root")
    table.extend(batch(0, 2000))
    table.sample(2000)  # every item consumed
    path = table.checkpoint(tmp_path / "ckpt")
    assert row_bytes(path) == 0  # was 2000 * (1024 + 8)
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["hi"] == 2000 and meta["size"] == 0 and meta["live_only"]
    back = Table.restore(path, tmp_path / "back")
    assert_same(table.state_dict(), back.state_dict())
    for t in (table, back):  # the queue goes on alike
        t.extend(batch(5000, 3))
    assert_bitwise_equal(table.sample(3), back.sample(3))
    back.destroy()
    table.destroy()


def test_partly_consumed_tables_keep_their_live_rows_in_their_slots(tmp_path: Path) -> None:
    for sampler in ("fifo", "uniform", "prioritized"):
        table = queue(tmp_path / sampler, sampler=sampler)
        table.extend(batch(0, 1500))
        if sampler == "fifo":
            table.sample(600)
        table.remove(torch.arange(700, 1500, 3))
        table.extend(batch(1500, 700))  # wraps: overwrites the first slots
        path = table.checkpoint(tmp_path / f"ckpt-{sampler}")
        live = table.live_index()
        assert row_bytes(path) == len(live) * (ROW + 8) < 2000 * (ROW + 8)
        back = Table.restore(path, tmp_path / f"back-{sampler}")
        assert_same(table.state_dict(), back.state_dict())
        assert torch.equal(back.live_index(), live)
        assert_bitwise_equal(table.read(live), back.read(live))
        assert_bitwise_equal(table.sample(16), back.sample(16))
        back.destroy()
        table.destroy()


def test_a_checkpoint_of_every_written_row_still_restores(tmp_path: Path) -> None:
    """Checkpoints before ``live_only`` (format 2) held rows ``[0, hi)``, dead ones too."""
    table = queue(tmp_path / "root")
    table.extend(batch(0, 10))
    table.sample(4)
    path = table.checkpoint(tmp_path / "ckpt")
    # the same checkpoint as format 2 wrote it: every written row, slot by slot
    meta = json.loads((path / "metadata.json").read_text())
    del meta["live_only"]
    (path / "metadata.json").write_text(json.dumps({**meta, "format_version": 2}))
    full = table.read(torch.arange(10))
    for key in ("obs", "id"):
        (path / "storage" / f"{key}.memmap").write_bytes(full[key].numpy().tobytes())
        folder_meta = json.loads((path / "storage" / "meta.json").read_text())
        folder_meta[key]["shape"][0] = 10
        (path / "storage" / "meta.json").write_text(json.dumps(folder_meta))
    back = Table.restore(path, tmp_path / "back")
    assert_same(table.state_dict(), back.state_dict())
    assert_bitwise_equal(back.read(torch.arange(10)), full)  # dead rows as they were
    back.destroy()
    table.destroy()
