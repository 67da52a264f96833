"""A memmap table's per-slot state files follow the data: holes at create, reserved with
the rows' extents, and tables (and checkpoints) of the earlier layout upgraded on open."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from storage_helpers import assert_same, snapshot
from tensordict import TensorDict
from testkit import make_spec
from testkit import rows as make_rows

from tdreplay.storage import InvalidCheckpoint, Table, TableSpec
from tdreplay.storage import statefile as SF
from tdreplay.storage.durable import STATE_DIR
from tdreplay.storage.extents import MIN_EXTENT_BYTES

ITEM = 64 << 10  # 64 KiB items: an extent is 1,024 rows, the capacity 100 of them
CAPACITY = 100_000
STATE_PER_SLOT = 1 + 8 + 8 + 8  # live, times sampled, ordinal, request tag


def spec(**extra) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "big",
            "capacity": CAPACITY,
            "fields": {
                "x": {"shape": [], "dtype": "int64"},
                "pad": {"shape": [ITEM - 8], "dtype": "uint8"},
            },
            "backend": {"kind": "memmap"},
            "rate_limiter": {"min_size_to_sample": 1},
            **extra,
        }
    )


def items(start: int, n: int) -> TensorDict:
    x = torch.arange(start, start + n)
    return TensorDict({"x": x, "pad": torch.zeros(n, ITEM - 8, dtype=torch.uint8)}, [n])


def state_files(root: Path) -> list[Path]:
    folder = root / "tables" / "big" / "storage" / STATE_DIR
    return sorted(p for p in folder.iterdir() if p.suffix == ".bin" and p.name != "record.bin")


def allocated(paths: list[Path]) -> int:
    return sum(p.stat().st_blocks * 512 for p in paths)


def test_state_files_are_holes_at_create_and_grow_with_the_rows(tmp_path: Path) -> None:
    table = Table.create(spec(), tmp_path)
    try:
        files = state_files(tmp_path)
        assert {p.name for p in files} == {
            "slots.live.bin",
            "slots.sampled_ordinal.bin",
            "slots.tag.bin",
        }
        # full size, nothing allocated: a fresh table's state is zeros
        assert sum(p.stat().st_size for p in files) == CAPACITY * STATE_PER_SLOT
        assert allocated(files) == 0
        table.extend(items(0, 10))
        # one extent of rows reserved, and the state of as many slots with them
        extent = MIN_EXTENT_BYTES // (ITEM + STATE_PER_SLOT) + 1
        stats = table.info()["stats"]
        assert stats["reserved_bytes"] == extent * (ITEM + STATE_PER_SLOT)
        assert stats["capacity_bytes"] == CAPACITY * (ITEM + STATE_PER_SLOT)
        held = allocated(files)
        assert extent * STATE_PER_SLOT <= held <= extent * STATE_PER_SLOT + 3 * 8192
        # the rows and the state are what they were written as
        batch = table.sample(64)
        assert torch.equal(batch["sample_info", "key"], batch["x"] + 1)
    finally:
        table.close()
    # reopened: the same rows, the same reservation, nothing more allocated
    again = Table.open(spec(), tmp_path)
    try:
        assert again.size == 10
        assert allocated(state_files(tmp_path)) == held
        again.extend(items(10, 5))
        batch = again.sample(256)
        assert torch.equal(batch["sample_info", "key"], batch["x"] + 1)
        assert set(batch["x"].tolist()) <= set(range(15))
        assert again.slots.inserted == 15
    finally:
        again.destroy()


def test_a_preallocated_table_reserves_its_state_with_its_rows(tmp_path: Path) -> None:
    small = spec().model_copy(update={"capacity": 2_000})
    table = Table.create(small, tmp_path, preallocate=True)
    try:
        assert allocated(state_files(tmp_path)) >= 2_000 * STATE_PER_SLOT
        assert table.info()["stats"]["reserved_bytes"] == 2_000 * (ITEM + STATE_PER_SLOT)
    finally:
        table.destroy()


def _as_earlier_layout(root: Path) -> None:
    """Rewrite a closed table's state as the earlier layout kept it: (times sampled, insert
    number with -1 for never written) in ``slots.pairs.bin``, the file fully allocated."""
    folder = root / "tables" / "big" / "storage" / STATE_DIR
    new = folder / "slots.sampled_ordinal.bin"
    pairs = torch.from_file(str(new), shared=False, size=2 * CAPACITY, dtype=torch.int64)
    pairs = pairs.view(CAPACITY, 2).clone()
    pairs[:, 1] -= 1
    old = folder / "slots.pairs.bin"
    with open(old, "wb") as f:
        f.write(pairs.numpy().tobytes())
    new.unlink()


def test_a_table_of_the_earlier_layout_is_upgraded_once_and_keeps_its_items(tmp_path: Path) -> None:
    table = Table.create(spec(), tmp_path)
    table.extend(items(0, 40))
    table.close()
    _as_earlier_layout(tmp_path)
    folder = tmp_path / "tables" / "big" / "storage" / STATE_DIR
    # a conversion cut short before its rename left a partial temporary file: redone
    (folder / ".slots.sampled_ordinal.bin.tmp").write_bytes(b"\x07" * 100)
    again = Table.open(spec(), tmp_path)
    try:
        assert again.size == 40 and again.slots.inserted == 40
        names = {p.name for p in folder.iterdir()}
        assert "slots.pairs.bin" not in names and ".slots.sampled_ordinal.bin.tmp" not in names
        batch = again.sample(256)
        assert torch.equal(batch["sample_info", "key"], batch["x"] + 1)
        index = again.extend(items(40, 2))
        assert again.slots.ordinal[index].tolist() == [41, 42]
    finally:
        again.close()
    # a conversion cut short after its rename (both files there): the new one is kept
    (folder / "slots.pairs.bin").write_bytes(b"\xff" * 16)
    third = Table.open(spec(), tmp_path)
    try:
        assert third.size == 42 and not (folder / "slots.pairs.bin").exists()
    finally:
        third.destroy()


def test_a_checkpoint_of_the_earlier_state_format_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint written as format 1 (insert numbers, ``seq``/``next_seq``/``perm_seq``)
    restores to the same items, keys and epoch as the table it came from."""
    small = TableSpec.model_validate(
        {
            "name": "t",
            "capacity": 16,
            "fields": {"x": {"shape": [], "dtype": "int64"}},
            "sampler": {"kind": "without_replacement"},
            "rate_limiter": {"min_size_to_sample": 1},
        }
    )
    table = Table.create(small, tmp_path / "a", seed=3)
    table.extend(TensorDict({"x": torch.arange(16)}, [16]))
    table.extend(TensorDict({"x": torch.arange(16, 20)}, [4]))  # wrapped: items 4..19 live
    table.sample(5)  # an epoch under way
    path = table.checkpoint(tmp_path / "ck")
    state = SF.load_state(path)
    slots, sampler = state["slots"], state["sampler"]
    slots["seq"] = slots.pop("ordinal") - 1
    slots["next_seq"] = slots.pop("inserted")
    sampler["perm_seq"] = sampler.pop("perm_ordinal") - 1
    monkeypatch.setattr(SF, "STATE_FORMAT", 1)
    SF.save_state(path, state)
    monkeypatch.undo()
    with safe_open(str(path / SF.STATE_FILE), framework="pt") as f:
        assert json.loads(f.metadata()["tdreplay.state"])["format"] == 1
    restored = Table.restore(path, root=tmp_path / "b", seed=3)
    try:
        assert torch.equal(restored.slots.ordinal, table.slots.ordinal)
        assert restored.slots.inserted == 20
        assert torch.equal(restored.sampler.perm_ordinal, table.sampler.perm_ordinal)
        assert restored.sampler.pos == table.sampler.pos
        key = restored.sample(11)["sample_info", "key"]  # the rest of the epoch
        assert sorted(key.tolist()) == sorted(set(key.tolist())) and int(key.min()) >= 5
    finally:
        restored.destroy()
        table.destroy()


@pytest.mark.parametrize("sampler", ["uniform", "prioritized"])
def test_a_restored_table_state_follows_its_rows_too(tmp_path: Path, sampler: str) -> None:
    """A restore loaded each per-slot column whole into the new table's state files,
    writing the never-written slots' zeros over their holes: a 100k-slot table holding
    10 items took its whole state on disk (2.5 MB), and on a full tmpfs that write was a
    SIGBUS. Now only the written slots are loaded."""
    table = Table.create(spec(sampler={"kind": sampler}), tmp_path / "a")
    try:
        table.extend(items(0, 10))
        held = allocated(state_files(tmp_path / "a"))
        table.checkpoint(tmp_path / "ck")
    finally:
        table.close()
    restored = Table.restore(tmp_path / "ck", tmp_path / "b")
    try:
        assert restored.size == 10
        assert allocated(state_files(tmp_path / "b")) <= held + 3 * 8192
        batch = restored.sample(4)
        assert torch.equal(batch["sample_info", "key"], batch["x"] + 1)
    finally:
        restored.close()


def test_a_loaded_state_with_anything_past_its_written_slots_is_refused(tmp_path: Path) -> None:
    table = Table.create(spec(), tmp_path / "a")
    try:
        table.extend(items(0, 10))
        state = table.state_dict()
        for column in ("ordinal", "times_sampled"):
            bad = {**state, "slots": dict(state["slots"])}
            bad["slots"][column] = torch.zeros(CAPACITY, dtype=torch.int64)  # every slot's
            bad["slots"][column][:10] = state["slots"][column]
            bad["slots"][column][50] = 3  # slot 50 was never written (hi is 10)
            with pytest.raises(SF.StateError, match=f"slots.{column}: a slot at or past"):
                table.load_state_dict(bad)
        assert table.size == 10 and table.state_dict()["slots"]["hi"] == 10
    finally:
        table.close()


def test_a_state_with_fewer_written_slots_loaded_over_more_leaves_zeros_past_them(
    tmp_path: Path,
) -> None:
    table = Table.create(spec(), tmp_path / "a")
    try:
        table.extend(items(0, 4))
        small = table.state_dict()
        table.extend(items(4, 20))
        table.sample(16)
        table.load_state_dict(small)
        slots = table.state_dict()["slots"]
        assert slots["hi"] == 4 and int(slots["live"].sum()) == 4
        assert not slots["ordinal"][4:].any() and not slots["times_sampled"][4:].any()
        assert not table.slots.ordinal[4:24].any() and not table.slots.live[4:24].any()
    finally:
        table.close()


#: the parts a checkpoint's state holds per slot, by the table that keeps them
PER_SLOT_PARTS = {
    "uniform": {},
    "prioritized": {"sampler": {"kind": "prioritized"}},
    "slice": {"sampler": {"kind": "slice", "slice_len": 2}},
    "max_value": {"writer": {"kind": "max_value", "key": "id"}},
}


@pytest.mark.parametrize("kind", list(PER_SLOT_PARTS))
def test_a_checkpoint_s_state_follows_its_items_not_its_capacity(tmp_path: Path, kind: str) -> None:
    """Every per-slot column went into ``state.safetensors`` whole, zeros past the written
    slots: 10 items in a 2M-slot table wrote a 34 MB state (50 MB prioritized; 500 MB and
    2.5 s for a 20M-slot one), and its restore read all of it back. Now a state holds the
    written slots, and restores to the same table."""
    big = 2_000_000
    table = Table.create(make_spec(capacity=big, **PER_SLOT_PARTS[kind]), tmp_path / "a")
    try:
        table.extend(make_rows(0, 10))
        table.sample(4)
        path = table.checkpoint(tmp_path / "ck")
        before = snapshot(table)
    finally:
        table.close()
    assert (path / SF.STATE_FILE).stat().st_size < 64 << 10
    restored = Table.restore(path, tmp_path / "b")
    try:
        after = snapshot(restored)
        assert_same(before["state"], after["state"], "state")
        assert_same(before["rows"], after["rows"], "rows")
    finally:
        restored.destroy()


def test_a_state_saved_with_a_row_for_every_slot_restores_the_same(tmp_path: Path) -> None:
    """Checkpoints written before kept every slot's row (zeros past the written ones):
    they restore as they did. A column of any other length is refused, naming it."""
    table = Table.create(make_spec(capacity=64, sampler={"kind": "prioritized"}), tmp_path / "a")
    try:
        table.extend(make_rows(0, 10))
        path = table.checkpoint(tmp_path / "ck")
        before = snapshot(table)
    finally:
        table.close()
    state = SF.load_state(path)
    for part, column in (("slots", "live"), ("slots", "ordinal"), ("sampler", "priorities")):
        value = state[part][column]
        state[part][column] = torch.cat([value, value.new_zeros(64 - len(value))])
    SF.save_state(path, state)
    restored = Table.restore(path, tmp_path / "b")
    try:
        assert_same(before["state"], snapshot(restored)["state"], "state")
    finally:
        restored.destroy()
    state["sampler"]["priorities"] = state["sampler"]["priorities"][:20]
    SF.save_state(path, state)
    with pytest.raises(InvalidCheckpoint, match=r"sampler\.priorities: expected shape \[10\]"):
        Table.restore(path, tmp_path / "c")
