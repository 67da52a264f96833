"""Every backend behaves the same: round-trips, ring overwrite, read, live_index, info, destroy."""

from __future__ import annotations

from pathlib import Path

import pytest
import testkit
import torch
from storage_helpers import assert_bitwise_equal, bits
from tensordict import TensorDict, tensorclass
from testkit import assert_consistent, make_spec, rows

from tdreplay.storage import (
    DTYPES,
    EmptyTableError,
    InvalidRequest,
    Table,
    TableClosed,
    TableSpec,
)

FIELDS = ["id", "observation", "action", ("next", "reward"), ("next", "done"), "pixels"]


def test_extend_then_sample_round_trips_exactly(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=32, backend=backend))
    data = rows(0, 10)
    assert table.extend(data).tolist() == list(range(10))
    assert len(table) == table.size == 10
    batch = table.sample(32)
    assert batch.batch_size == torch.Size([32])
    assert_consistent(batch)
    ids = batch["id"]
    assert ids.min() >= 0 and ids.max() < 10
    # the slot of each row is its id here, and the row is the inserted one, bit for bit
    assert torch.equal(batch["index"], ids)
    assert_bitwise_equal(batch, data[ids], FIELDS)
    assert batch["sample_info", "times_sampled"].dtype == torch.int64
    assert torch.equal(batch["sample_info", "weight"], torch.ones(32))
    assert torch.equal(batch["sample_info", "priority"], torch.ones(32))


def test_ring_overwrite_keeps_the_newest(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=16, backend=backend))
    table.extend(rows(0, 10))
    # 10 more rows wrap: slots 10..15 then 0..3 (the index-tensor write path)
    assert table.extend(rows(10, 10)).tolist() == [*range(10, 16), 0, 1, 2, 3]
    assert len(table) == 16
    live = table.live_index()
    assert live.tolist() == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3]
    stored = table.read(live)
    assert stored["id"].tolist() == list(range(4, 20))
    assert_bitwise_equal(stored, rows(4, 16), FIELDS)
    for _ in range(5):
        batch = table.sample(16)
        assert_consistent(batch)
        assert batch["id"].min() >= 4
        assert torch.equal(batch["id"] % 16, batch["index"])
    # a full-capacity extend replaces everything
    table.extend(rows(100, 16))
    assert table.read(table.live_index())["id"].tolist() == list(range(100, 116))


def test_read_moves_no_counter(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=8, backend=backend))
    table.extend(rows(0, 8))
    before = table.info()
    got = table.read(torch.tensor([7, 0, 3, 3]))
    assert got["id"].tolist() == [7, 0, 3, 3]
    assert set(got.keys()) == {"id", "observation", "action", "next", "pixels"}
    assert_consistent(got)
    after = table.info()
    assert after["samples"] == before["samples"] == 0
    assert after["bytes_out"] == before["bytes_out"]
    assert int(table.slots.times_sampled.sum()) == 0


def test_live_index_is_oldest_first(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=8, backend=backend))
    assert table.live_index().tolist() == []
    table.extend(rows(0, 3))
    assert table.live_index().tolist() == [0, 1, 2]
    table.extend(rows(3, 7))  # wraps onto slots 0, 1
    assert table.live_index().tolist() == [2, 3, 4, 5, 6, 7, 0, 1]
    assert table.read(table.live_index())["id"].tolist() == list(range(2, 10))


def test_info(backend: dict, tables, tmp_path: Path) -> None:
    spec = make_spec(name="infotable", capacity=8, backend=backend)
    table = tables.create(spec)
    info = table.info()
    assert info["name"] == "infotable"
    assert info["size"] == 0 and info["capacity"] == 8
    assert info["backend"] == backend["kind"]
    assert info["can_sample"] is False and info["can_insert"] is True
    assert info["item_nbytes"] == 8 + 3 * 4 + 2 * 2 + 2 + 1 + 4 == spec.item_nbytes
    assert info["fields"]["observation"] == {"shape": [3], "dtype": "float32"}
    assert info["sampler"]["kind"] == "uniform" and info["writer"]["kind"] == "round_robin"
    if backend["kind"] == "memmap":
        assert Path(info["location"]).is_dir()
    elif backend["kind"] == "h5":
        assert Path(info["location"]).is_file()
    elif backend["kind"] == "redis":
        assert info["location"] == testkit.REDIS["default"]
    else:
        assert info["location"] is None
    table.extend(rows(0, 5))
    table.sample(3)
    info = table.info()
    assert info["size"] == 5 and info["inserts"] == 5 and info["samples"] == 3
    assert info["bytes_in"] == 5 * spec.item_nbytes and info["bytes_out"] == 3 * spec.item_nbytes
    assert info["can_sample"] is True
    assert info["writer"]["cursor"] == 5


def test_sample_into_out(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=16, backend=backend))
    table.extend(rows(0, 16))
    first = table.sample(8)
    buffers = {k: first.get(k).data_ptr() for k in FIELDS}
    again = table.sample(8, out=first)
    assert again is first
    assert_consistent(again)
    assert {k: again.get(k).data_ptr() for k in FIELDS} == buffers  # gathered in place
    assert torch.equal(again["id"], again["index"])


def test_extend_takes_a_tensorclass(backend: dict, tables) -> None:
    @tensorclass
    class Step:
        id: torch.Tensor
        observation: torch.Tensor
        action: torch.Tensor
        next: TensorDict
        pixels: torch.Tensor

    data = rows(0, 4)
    step = Step(
        id=data["id"],
        observation=data["observation"],
        action=data["action"],
        next=data["next"],
        pixels=data["pixels"],
        batch_size=[4],
    )
    table = tables.create(make_spec(capacity=8, backend=backend))
    table.extend(step)
    assert_bitwise_equal(table.read(torch.arange(4)), data, FIELDS)


def test_every_dtype_round_trips_bit_for_bit(backend: dict, tables) -> None:
    fields = {name: {"shape": [4], "dtype": name} for name in DTYPES}
    spec = TableSpec.model_validate(
        {"name": "dtypes", "capacity": 8, "fields": fields, "backend": backend}
    )
    table = tables.create(spec)
    g = torch.Generator().manual_seed(0)
    data = {}
    for name, dtype in DTYPES.items():
        if dtype == torch.bool:
            data[name] = torch.rand(6, 4, generator=g) > 0.5
            continue
        # random bytes, so every bit pattern (NaN payloads, -0.0, subnormals) must survive
        raw = torch.randint(0, 256, (6, 4 * dtype.itemsize), dtype=torch.uint8, generator=g)
        data[name] = raw.view(dtype)
    extremes = {
        "int64": torch.tensor([torch.iinfo(torch.int64).min, torch.iinfo(torch.int64).max]),
        "float32": torch.tensor([float("inf"), -0.0]),
        "bfloat16": torch.tensor([float("-inf"), 3.0e38]).bfloat16(),
    }
    for name, values in extremes.items():
        data[name][0, :2] = values
    td = TensorDict(data, batch_size=[6])
    table.extend(td)
    stored = table.read(torch.tensor([5, 0, 1, 2, 3, 4, 0]))
    for name in DTYPES:
        assert stored[name].dtype == DTYPES[name]
        assert torch.equal(bits(stored[name]), bits(td[name][[5, 0, 1, 2, 3, 4, 0]])), name
    batch = table.sample(8)
    for name in DTYPES:
        assert torch.equal(bits(batch[name]), bits(td[name][batch["index"]])), name


def test_destroy_deletes_the_data(backend: dict, tables, request: pytest.FixtureRequest) -> None:
    table = tables.create(make_spec(name="doomed", capacity=8, backend=backend))
    table.extend(rows(0, 8))
    location = table.backend.location
    if backend["kind"] == "redis":
        client = request.getfixturevalue("redis_server")["client"]
        prefix = table.backend.storage._prefix
        assert list(client.scan_iter(match=f"{prefix}*"))
    table.destroy()
    if backend["kind"] in ("memmap", "h5"):
        assert location is not None and not Path(location).exists()
    if backend["kind"] == "redis":
        assert list(client.scan_iter(match=f"{prefix}*")) == []
    # a destroyed table refuses work instead of returning or storing garbage
    with pytest.raises(TableClosed, match="closed"):
        table.sample(2, timeout=0)
    with pytest.raises(TableClosed, match="closed"):
        table.extend(rows(8, 2), timeout=0)


def test_close_keeps_file_data_for_a_new_process(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=8, backend=backend))
    table.extend(rows(0, 3))
    location = table.backend.location
    table.close()
    if backend["kind"] in ("memmap", "h5"):
        assert Path(location).exists()


def test_two_tables_on_one_backend_do_not_share_rows(backend: dict, tables) -> None:
    a = tables.create(make_spec(name="a", capacity=8, backend=backend))
    b = tables.create(make_spec(name="b", capacity=8, backend=backend))
    a.extend(rows(0, 8))
    b.extend(rows(100, 8))
    assert a.read(torch.arange(8))["id"].tolist() == list(range(8))
    assert b.read(torch.arange(8))["id"].tolist() == list(range(100, 108))


def test_create_from_a_schema_path(tmp_path: Path, tables) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(make_spec(capacity=4).to_yaml())
    table = tables.track(Table.create(path, root=tmp_path / "data"))
    assert table.spec == make_spec(capacity=4)


@pytest.mark.parametrize("index", [[8], [-1], [0, 3, 9]])
def test_read_rejects_slots_outside_the_table(backend: dict, tables, index: list[int]) -> None:
    table = tables.create(make_spec(capacity=8, backend=backend))
    table.extend(rows(0, 8))
    with pytest.raises(InvalidRequest, match=r"index -?\d+ outside \[0, 8\)") as info:
        table.read(torch.tensor(index))
    assert info.value.field == "index"


def test_read_of_a_closed_table_fails(backend: dict, tables) -> None:
    table = tables.create(make_spec(capacity=8, backend=backend))
    table.extend(rows(0, 8))
    table.destroy()
    with pytest.raises(TableClosed, match="closed"):
        table.read(torch.tensor([0]))


def test_a_closed_table_raises_table_closed_not_empty(backend: dict, tables) -> None:
    """A closed table is not an empty one: extend, sample and read say it is closed."""
    table = tables.create(make_spec(name="gone", capacity=8, backend=backend))
    table.extend(rows(0, 8))  # full: an EmptyTableError would be a lie
    table.close()
    calls = {
        "extend": lambda: table.extend(rows(8, 2), timeout=0),
        "sample": lambda: table.sample(2, timeout=0),
        "read": lambda: table.read(torch.tensor([0])),
    }
    for what, call in calls.items():
        with pytest.raises(TableClosed, match="'gone' is closed") as info:
            call()
        assert not isinstance(info.value, EmptyTableError), what
        assert info.value.table == "gone", what


def test_small_and_large_gathers_read_the_same_rows(backend: dict, tables) -> None:
    """A gather of a few rows (a copy a row and field on the tensor backends: memmove into
    fresh buffers, memoryview slices into a target) and one of many (a torch call a field)
    read the same bits, repeats and the last slot included, into fresh buffers and into
    reused targets alike; a row outside the table is refused before anything is copied."""
    table = tables.create(make_spec(capacity=32, backend=backend))
    data = rows(0, 32)
    table.extend(data)
    for index in ([31], [0, 31, 0], list(range(8)), list(range(9)), [5] * 20):
        idx = torch.tensor(index, dtype=torch.int64)
        got = table.read(idx)
        assert got["id"].tolist() == index
        assert_bitwise_equal(got, data[idx], FIELDS)
    for n in (1, 2, 8, 9):
        target = table.target(table.sample(n).clone(), n)
        for _ in range(20):
            batch = table.sample(n, out=target)
            assert_consistent(batch)
            assert torch.equal(batch["index"], batch["id"])  # slot i holds item i here
            assert_bitwise_equal(batch, data[batch["index"]], FIELDS)
        index = [31, 0, 31][:n] + [7] * max(0, n - 3)
        table.backend.gather_rows(index, target.bufs, target.row_bytes)
        assert target.bufs[("id",)].tolist() == index
        assert_bitwise_equal(TensorDict(target.bufs, [n]), data[torch.tensor(index)], FIELDS)
    if backend["kind"] in ("memory", "shared", "memmap"):
        target = table.target(table.sample(2).clone(), 2)
        out = table.backend.empty(2)
        for v in [*out.values(), *target.bufs.values()]:  # uninitialized memory may hold NaN
            v.zero_()
        before = {k: v.clone() for k, v in out.items()}
        with pytest.raises(IndexError, match="outside"):
            table.backend.gather(torch.tensor([0, 32]), out)
        with pytest.raises(IndexError, match="outside"):
            table.backend.gather_rows([0, -1], target.bufs, target.row_bytes)
        assert all(torch.equal(out[k], before[k]) for k in out)
        assert all(torch.equal(target.bufs[k], before[k]) for k in out)


def test_every_backend_says_whether_its_rows_are_there(backend: dict, tables) -> None:
    """What the service asks of any backend (typed on the base, no duck typing): its state,
    a probe, and the server its rows live in (a Redis table's, whose timeout gates calls)."""
    table = tables.create(make_spec(capacity=8, backend=backend))
    store = table.backend
    assert store.probe() == store.state == "ok"
    connection = store.connection
    assert (connection is not None) == (backend["kind"] == "redis")
    if connection is not None:
        assert connection.name == "default" and connection.timeout > 0
