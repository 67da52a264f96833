"""An export of a checkpoint, read straight from its files, is the table's own export, byte for byte.

``tdreplay export --checkpoint`` restored the checkpoint into a whole table first, with the
bookkeeping of every slot its spec declares (~550 MB for 10 rows in an 8M-slot prioritized
table: ``tests/service/test_cli_offline_bounds.py``). It now reads the checkpoint's state
and rows and orders the live slots itself (:func:`tdreplay.storage.export_checkpoint`),
through the writers :meth:`Table.export` uses: the files must be the same, for every layout
a checkpoint has (format 3's live rows, format 2's written rows, TorchRL's flat layout),
every order a table keeps (a ring, a ring with removed items, a max-value table's slots),
several chunks (row groups) and a Redis table (no Redis needed to export its checkpoint).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from testkit import make_spec, rows

import tdreplay.storage.export as export_module
from tdreplay.storage import InvalidCheckpoint, SchemaError, Table, export_checkpoint

#: a chunk (a Parquet row group, a CSV batch) of 16 items: these tables export in several
CHUNK = 16


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(export_module, "MIN_CHUNK_ROWS", CHUNK)
    monkeypatch.setattr(export_module, "MAX_CHUNK_ROWS", CHUNK)


def filled(tables: Any, kind: str, backend: dict | None = None) -> Table:
    """A table of 64 slots that wrapped, with items removed or consumed (dead slots)."""
    extra: dict[str, Any] = {
        "uniform": {},
        "prioritized": {"sampler": {"kind": "prioritized"}},
        "slice": {"sampler": {"kind": "slice", "slice_len": 4, "end_key": "next.done"}},
        "fifo": {"sampler": {"kind": "fifo"}},
        "max_value": {
            "fields": {"value": {"shape": [1], "dtype": "float32"}},
            "writer": {"kind": "max_value", "key": "value"},
        },
    }[kind]
    table = tables.create(make_spec(f"t-{kind}", capacity=64, backend=backend, **extra))
    # 120 items into 64 slots (a queue waits while full: 80, 30 of them consumed first)
    for start in (0, 40) if kind == "fifo" else (0, 40, 80):
        data = rows(start, 40)
        if kind == "max_value":  # kept by value: the slots are not in insertion order
            data["value"] = torch.randperm(40, generator=torch.Generator().manual_seed(start))[
                :, None
            ].float()
        table.extend(data)
        if kind == "prioritized":
            drawn = table.sample(8)
            table.update_priority(drawn["index"], torch.rand(8) + 0.1)
        if kind == "fifo":
            table.sample(30 if start == 0 else 7)  # consumed: dead slots in the ring
    if kind != "fifo":
        table.remove(table.live_index()[::5])
    assert len(table) > 2 * CHUNK  # several chunks
    return table


def same_files(table: Table, checkpoint: Path, out: Path) -> None:
    for fmt in ("parquet", "csv"):
        online = table.export(out / f"online.{fmt}")
        offline = export_checkpoint(checkpoint, out / f"offline.{fmt}")
        assert offline.rows == online.rows == len(table) and offline.skipped == 0
        assert offline.read_bytes() == online.read_bytes(), fmt
    assert pq.ParquetFile(out / "online.parquet").num_row_groups == -(-len(table) // CHUNK)


@pytest.mark.parametrize("kind", ["uniform", "prioritized", "slice", "fifo", "max_value"])
def test_a_checkpoint_exports_as_its_table(tables: Any, tmp_path: Path, kind: str) -> None:
    table = filled(tables, kind)
    checkpoint = table.checkpoint(tmp_path / "ckpt")
    assert json.loads((checkpoint / "metadata.json").read_text())["live_only"]
    same_files(table, checkpoint, tmp_path)


def test_a_checkpoint_of_every_written_row_exports_as_its_table(
    tables: Any, tmp_path: Path
) -> None:
    """Format 2 held rows ``[0, hi)``, dead ones too: the live ones are exported."""
    table = filled(tables, "prioritized")
    path = table.checkpoint(tmp_path / "ckpt")
    meta = json.loads((path / "metadata.json").read_text())
    del meta["live_only"]
    (path / "metadata.json").write_text(json.dumps({**meta, "format_version": 2}))
    every = table.read(torch.arange(meta["hi"]))
    for key in table.spec.torch_schema():
        value = every[key]
        folder = path / "storage" / Path(*key[:-1])
        (folder / f"{key[-1]}.memmap").write_bytes(value.contiguous().view(torch.uint8).numpy())
        entries = json.loads((folder / "meta.json").read_text())
        entries[key[-1]]["shape"][0] = meta["hi"]
        (folder / "meta.json").write_text(json.dumps(entries))
    same_files(table, path, tmp_path)


def test_a_checkpoint_in_torchrl_s_flat_layout_exports_as_its_table(
    tables: Any, tmp_path: Path
) -> None:
    table = tables.create(make_spec("flat", capacity=64))
    table.extend(rows(0, 50))  # one stream of trajectories, not wrapped: TED2Flat keeps it
    path = table.checkpoint(tmp_path / "ckpt", ted2flat=True)
    assert json.loads((path / "metadata.json").read_text())["ted2flat"]
    same_files(table, path, tmp_path)


def test_a_redis_table_s_checkpoint_exports_without_its_redis(
    tables: Any, tmp_path: Path, redis_server: dict
) -> None:
    table = filled(tables, "uniform", {"kind": "redis"})
    path = table.checkpoint(tmp_path / "ckpt")
    same_files(table, path, tmp_path)


def test_an_empty_checkpoint_exports_as_its_table(tables: Any, tmp_path: Path) -> None:
    table = tables.create(make_spec("empty", capacity=64, sampler={"kind": "fifo"}))
    for fmt in ("parquet", "csv"):
        online = table.export(tmp_path / f"never.{fmt}")
        assert export_checkpoint(table.checkpoint(tmp_path / "never"), tmp_path / f"n.{fmt}")
        assert (tmp_path / f"n.{fmt}").read_bytes() == online.read_bytes()
    table.extend(rows(0, 20))
    table.sample(20)  # drained: no live row, none in the checkpoint
    path = table.checkpoint(tmp_path / "drained")
    same_files(table, path, tmp_path)


def test_the_limit_counts_what_the_checkpoint_holds(tables: Any, tmp_path: Path) -> None:
    table = tables.create(make_spec("held", capacity=1 << 20))
    table.extend(rows(0, 100))
    path = table.checkpoint(tmp_path / "ckpt")
    item = table.spec.item_nbytes
    # the declared 1M slots would be refused; the 100 rows and slots held are not
    exported = export_checkpoint(path, tmp_path / "a.parquet", limit=100 * (item + 64))
    assert exported.rows == 100
    with pytest.raises(SchemaError, match=r"100 rows x .* \(--max-table-bytes\)"):
        export_checkpoint(path, tmp_path / "b.parquet", limit=100 * item)
    assert not (tmp_path / "b.parquet").exists()


def test_a_damaged_checkpoint_is_refused_as_a_restore_refuses_it(
    tables: Any, tmp_path: Path
) -> None:
    table = filled(tables, "uniform")
    path = table.checkpoint(tmp_path / "ckpt")
    (path / "storage" / "id.memmap").write_bytes(b"short")
    for read in (
        lambda: Table.restore(path, tmp_path / "back"),
        lambda: export_checkpoint(path, tmp_path / "x.parquet"),
    ):
        with pytest.raises(InvalidCheckpoint, match="truncated or damaged"):
            read()
    assert not (tmp_path / "x.parquet").exists()
