"""Restoring beside a live table: a failed restore changes nothing, a good one touches nothing live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from storage_helpers import assert_bitwise_equal, snapshot
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import CheckpointError, InvalidCheckpoint, Table, TableExists
from tdreplay.storage.backends import MARKER, sweep

FILE_KINDS = ["memmap", "h5"]


def backend_of(kind: str, request: pytest.FixtureRequest) -> dict:
    if kind == "redis":
        request.getfixturevalue("redis_server")  # registers the "default" connection
        return {"kind": "redis"}
    return {"kind": kind}


def files(folder: Path) -> list[str]:
    """What a table folder holds beside its marker."""
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if p.name != MARKER)


def redis_keys(kind: str, request: pytest.FixtureRequest) -> set[bytes]:
    if kind != "redis":
        return set()
    keys = set(request.getfixturevalue("redis_server")["client"].scan_iter(match="tdreplay:t:*"))
    assert keys, "the live table's keys are not found: the pattern is out of date"
    return keys


def garble_state(path: Path) -> None:
    (path / "state.safetensors").write_bytes(b"not a state file")


def truncate_storage(path: Path) -> None:
    os.truncate(path / "storage" / "observation.memmap", 10)


def drop_storage_file(path: Path) -> None:
    (path / "storage" / "next" / "reward.memmap").unlink()


def assert_serves(table: Table, n: int) -> None:
    """``table`` holds items ``0 .. n-1`` and samples them bit for bit."""
    assert len(table) == n
    assert_bitwise_equal(table.read(table.live_index()), rows(0, n))
    batch = table.sample(16)
    assert_consistent(batch)
    assert_bitwise_equal(batch.exclude("index", "sample_info"), rows(0, n)[batch["id"]])


@pytest.mark.parametrize("damage", [garble_state, truncate_storage, drop_storage_file])
@pytest.mark.parametrize("kind", [*FILE_KINDS, "redis"])
def test_failed_restore_leaves_the_live_table_intact(
    tables, root: Path, tmp_path: Path, kind: str, damage, request: pytest.FixtureRequest
) -> None:
    live = tables.create(make_spec(capacity=16, backend=backend_of(kind, request)), root=root)
    live.extend(rows(0, 12))
    path = live.checkpoint(tmp_path / "ckpt")
    damage(path)
    damaged = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    before, on_disk, location = snapshot(live), files(root / "tables" / "t"), live.backend.location
    keys = redis_keys(kind, request)
    with pytest.raises(CheckpointError, match=r"cannot restore|truncated or damaged"):
        tables.restore(path, root=root)
    after = snapshot(live)
    for key in before["rows"]:
        assert torch.equal(before["rows"][key], after["rows"][key]), key
    assert after["size"] == before["size"] and after["inserts"] == before["inserts"]
    assert files(root / "tables" / "t") == on_disk and live.backend.location == location
    assert redis_keys(kind, request) == keys  # the failed restore's own keys are gone
    # reading the checkpoint did not change it (a truncated file is not grown back)
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == damaged
    assert_serves(live, 12)
    live.extend(rows(12, 2))
    assert_serves(live, 14)


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_restore_beside_a_live_table(tables, root: Path, tmp_path: Path, kind: str) -> None:
    live = tables.create(make_spec(capacity=16, backend={"kind": kind}), root=root)
    live.extend(rows(0, 12))
    path = live.checkpoint(tmp_path / "ckpt")
    live.extend(rows(12, 3))
    restored = tables.restore(path, root=root)
    assert restored.backend.location != live.backend.location
    assert Path(restored.backend.location).parent == root / "tables" / "t"
    assert_serves(restored, 12)
    assert_serves(live, 15)  # its files were neither deleted nor written
    with pytest.raises(CheckpointError, match="own data"):  # where the restored table is
        restored.checkpoint(Path(restored.backend.location))
    with pytest.raises(CheckpointError, match="own data"):  # deleted once nothing holds it
        restored.checkpoint(Path(live.backend.location))
    live.destroy()
    assert files(root / "tables" / "t") == [Path(restored.backend.location).name]
    restored.extend(rows(12, 2))
    assert_serves(restored, 14)
    restored.destroy()
    assert files(root / "tables" / "t") == []


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_dead_data_does_not_pile_up(tables, root: Path, tmp_path: Path, kind: str) -> None:
    """Tables closed beside each other (a server that stopped) leave data that is later swept."""
    spec = make_spec(capacity=16, backend={"kind": kind})
    first = tables.create(spec, root=root)
    first.extend(rows(0, 5))
    path = first.checkpoint(tmp_path / "ckpt")
    second = tables.restore(path, root=root)
    (root / "tables" / "t" / "notes.txt").write_text("not ours")
    (root / "tables" / "t" / "storage.backup").mkdir()
    first.close()
    second.close()
    assert len(files(root / "tables" / "t")) == 4
    # the next process restores beside the dead data, then deletes it
    third = tables.restore(path, root=root)
    assert_serves(third, 5)
    assert files(root / "tables" / "t") == sorted(
        ["notes.txt", "storage.backup", Path(third.backend.location).name]
    )
    third.close()
    # a created table refuses the dead data unless told to replace it
    with pytest.raises(TableExists, match="holds data of an earlier table"):
        tables.create(spec, root=root)
    assert len(files(root / "tables" / "t")) == 3
    # then it reuses the primary location and sweeps the dead siblings
    fourth = tables.create(spec, root=root, replace=True)
    primary = {"memmap": "storage", "h5": "storage.h5"}[kind]
    assert fourth.backend.location == str(root / "tables" / "t" / primary)
    assert files(root / "tables" / "t") == sorted(["notes.txt", "storage.backup", primary])
    assert sweep(spec, root) == []  # nothing dead is left; the open table is kept


def test_a_second_table_of_a_name_does_not_replace_an_open_one(tables, root: Path) -> None:
    spec = make_spec(capacity=8, backend={"kind": "memmap"})
    a = tables.create(spec, root=root)
    a.extend(rows(0, 8))
    b = tables.create(spec, root=root)
    b.extend(rows(100, 8))
    assert a.backend.location != b.backend.location
    assert a.read(torch.arange(8))["id"].tolist() == list(range(8))


@pytest.mark.parametrize("kind", FILE_KINDS)
def test_a_checkpoint_holding_a_value_outside_a_fields_categories_is_refused(
    tables, root: Path, tmp_path: Path, kind: str
) -> None:
    """A checkpoint is held to what an extend is: a field declaring ``n`` categories holds
    ``0 .. n-1``; a checkpoint whose rows were edited to hold another value is refused,
    naming the field, the value and its slot, and no table is made of it."""
    spec = make_spec(
        capacity=16,
        backend={"kind": kind},
        fields={"choice": {"shape": [], "dtype": "int16", "n": 3}},
    )
    table = tables.create(spec, root=root)
    td = rows(0, 12)
    td["choice"] = (torch.arange(12) % 3).to(torch.int16)
    table.extend(td)
    path = table.checkpoint(tmp_path / "ckpt")
    column = path / "storage" / "choice.memmap"
    values = bytearray(column.read_bytes())
    values[5 * 2 : 6 * 2] = (9).to_bytes(2, "little", signed=True)
    column.write_bytes(bytes(values))
    other = tmp_path / "other"
    with pytest.raises(InvalidCheckpoint) as info:
        tables.restore(path, root=other)
    assert info.value.field == "choice" and info.value.got == 9, info.value
    assert "holds 9 in slot 5, outside its 3 categories 0 .. 2" in str(info.value)
    assert files(other / "tables" / "t") == []  # nothing allocated is left
    values[5 * 2 : 6 * 2] = (2).to_bytes(2, "little", signed=True)  # in range: it restores
    column.write_bytes(bytes(values))
    restored = tables.restore(path, root=other)
    assert restored.read(torch.arange(12))["choice"][5] == 2
