"""A table's scalar state is declared once, by its parts (``SCALARS`` / ``DERIVED``): the
durable record of a memmap table carries exactly what ``state_dict()`` carries, and a
part whose ``state_dict()`` gains a scalar the record does not carry fails here."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.storage import BackendError, Table, TableSpec
from tdreplay.storage.durable import RECORD_FILE, STATE_DIR
from tdreplay.storage.rate_limiter import RateLimiter
from tdreplay.storage.record import PARTS, RecordLayout
from tdreplay.storage.samplers import Sampler, UniformSampler
from tdreplay.storage.slot_policy import RoundRobinPolicy, SlotPolicy
from tdreplay.storage.slots import Slots

#: every sampler and every writer (the LIFO sampler brings the stack, FIFO a queue's ring)
PARTS_SPECS = {
    "uniform": {"sampler": {"kind": "uniform"}},
    "prioritized": {"sampler": {"kind": "prioritized"}},
    "fifo": {"sampler": {"kind": "fifo"}},
    "lifo": {"sampler": {"kind": "lifo"}},
    "without_replacement": {"sampler": {"kind": "without_replacement"}},
    "slice": {"sampler": {"kind": "slice", "slice_len": 2, "traj_key": "traj"}},
    "max_value": {"writer": {"kind": "max_value", "key": "x"}},
}


def spec(parts: str) -> TableSpec:
    return TableSpec.model_validate(
        {
            "name": "s",
            "capacity": 40,
            "fields": {
                "x": {"shape": [], "dtype": "float32"},
                "traj": {"shape": [], "dtype": "int64"},
            },
            "backend": {"kind": "memmap"},
            "rate_limiter": {"min_size_to_sample": 1},
            **PARTS_SPECS[parts],
        }
    )


def rows(start: int, n: int) -> TensorDict:
    x = torch.arange(start, start + n, dtype=torch.float32)
    return TensorDict({"x": x, "traj": torch.arange(start, start + n) // 5}, [n])


def owners(table: Table) -> dict[str, Any]:
    return {part: table if part == "table" else getattr(table, part) for part in PARTS}


def scalars(state: dict[str, Any], part: str) -> dict[str, Any]:
    """The scalars ``state_dict()`` carries for ``part`` (the table's own: its top level)."""
    values = state if part == "table" else state[part]
    return {
        k: v
        for k, v in values.items()
        if not isinstance(v, (torch.Tensor, dict)) and k != "generator"
    }


def subclasses(cls: type) -> set[type]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *subclasses(sub)}
    return {c for c in found if c.__module__.startswith("tdreplay.") and c.__name__[0] != "_"}


def test_the_cases_cover_every_sampler_and_writer(tmp_path: Path) -> None:
    seen: set[type] = set()
    for name in PARTS_SPECS:
        table = Table.create(spec(name), tmp_path / name)
        seen |= {type(table.sampler), type(table.writer)}
        table.close()
    missing = (subclasses(Sampler) | subclasses(SlotPolicy)) - seen
    assert not missing, f"add a case for {sorted(c.__name__ for c in missing)} to PARTS_SPECS"


@pytest.mark.parametrize("name", list(PARTS_SPECS))
def test_every_scalar_in_a_state_dict_is_declared_and_the_record_carries_the_kept_ones(
    tmp_path: Path, name: str
) -> None:
    table = Table.create(spec(name), tmp_path)
    try:
        table.extend(rows(0, 10))
        state = table.state_dict()
        carried = set(RecordLayout(table).fields)
        for part, owner in owners(table).items():
            kind = type(owner).__name__
            got = set(scalars(state, part))
            declared = {*owner.SCALARS, *owner.DERIVED}
            assert got == declared, f"{part} {kind}: state_dict scalars {got}, declared {declared}"
            for scalar, typ in owner.SCALARS.items():
                assert (part, scalar) in carried, f"{part} {kind}: {scalar} not in the record"
                assert isinstance(state[part][scalar] if part != "table" else state[scalar], typ)
            assert not {(part, s) for s in owner.DERIVED} & carried
    finally:
        table.close()


@pytest.mark.parametrize("name", list(PARTS_SPECS))
def test_a_reopened_table_has_the_scalars_it_had(tmp_path: Path, name: str) -> None:
    table = Table.create(spec(name), tmp_path)
    table.extend(rows(0, 30))
    table.sample(4)
    table.extend(rows(30, 12))  # past the capacity: the ring wraps (a queue or stack fits)
    if name == "prioritized":
        table.update_priority(torch.tensor([3, 7]), torch.tensor([2.5, 9.0]))
    table.rate_limiter.insert_waits, table.rate_limiter.sample_waits = 3, 4
    table.episode_base = 11
    table.sample(2)  # a state change: the record is written
    before = table.state_dict()
    table.close()
    again = Table.open(spec(name), tmp_path)
    try:
        after = again.state_dict()
        for part, owner in owners(again).items():
            kept = {k: v for k, v in scalars(before, part).items() if k not in owner.DERIVED}
            assert {k: scalars(after, part)[k] for k in kept} == kept, part
        assert after["rate_limiter"]["insert_waits"] == 3 and after["episode_base"] == 11
    finally:
        again.close()


def test_a_record_in_the_layout_files_already_hold_opens(tmp_path: Path) -> None:
    """``record.bin`` as earlier versions write it: per slot of 128 bytes, a generation,
    cursor, head, top, inserts, samples, insert waits, sample waits, episode base, items
    inserted (i64 each), the largest priority (f64), a CRC-32 of those (u64)."""
    table = Table.create(spec("prioritized"), tmp_path)
    table.extend(rows(0, 6))
    table.close()
    body = struct.pack("<Q9qd", 50, 6, 0, 0, 9, 17, 2, 5, 13, 6, 4.5)
    record = body + zlib.crc32(body).to_bytes(8, "little")
    torn = bytearray(record)
    torn[20] ^= 1  # a newer generation, torn by a crash: the other slot is used
    torn[:8] = (51).to_bytes(8, "little")
    (tmp_path / "tables" / "s" / "storage" / STATE_DIR / RECORD_FILE).write_bytes(
        record.ljust(128, b"\0") + bytes(torn).ljust(128, b"\0")
    )
    again = Table.open(spec("prioritized"), tmp_path)
    try:
        state = again.state_dict()
        assert state["rate_limiter"] == {
            "inserts": 9,
            "samples": 17,
            "insert_waits": 2,
            "sample_waits": 5,
        }
        assert state["episode_base"] == 13 and state["slots"]["inserted"] == 6
        assert state["sampler"]["max_priority"] == 4.5 and state["writer"]["cursor"] == 6
    finally:
        again.close()


class LappedRing(RoundRobinPolicy):
    """A writer that keeps one more scalar, one the record has no field for."""

    SCALARS = {"cursor": int, "laps": int}


class FractionalRing(RoundRobinPolicy):
    """A writer whose cursor is declared a float: the record keeps it as an int."""

    SCALARS = {"cursor": float}


@pytest.mark.parametrize(
    ("writer", "error"),
    [
        (LappedRing, "declares scalar 'laps' \\(int\\), but the durable record has no field"),
        (FractionalRing, "declares scalar 'cursor' \\(float\\), but .* keeps it as int"),
    ],
)
def test_a_part_declaring_a_scalar_the_record_lacks_is_refused(
    writer: type[SlotPolicy], error: str
) -> None:
    slots = Slots(8)
    table = SimpleNamespace(
        SCALARS={"episode_base": int},
        slots=slots,
        sampler=UniformSampler(slots),
        writer=writer(slots),
        rate_limiter=RateLimiter(),
    )
    with pytest.raises(BackendError, match=f"writer {writer.__name__} {error}"):
        RecordLayout(table)
