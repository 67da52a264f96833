"""The sync client against a real server: every dtype, views, errors, priorities, persistence."""

from __future__ import annotations

import io
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from tensordict import TensorDict, TensorDictBase, tensorclass
from testkit import make_rows, schema_fields, unique

from tdreplay.client import (
    InvalidRequest,
    RateLimitTimeout,
    ReplayClient,
    SchemaError,
    TableExists,
    TableNotFound,
)


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


def new_table(
    client: ReplayClient, fields: dict[str, Any], capacity: int = 64, **extra: Any
) -> str:
    name = unique("t")
    client.create_table(
        {
            "name": name,
            "capacity": capacity,
            "backend": {"kind": "memory"},
            "fields": fields,
            **extra,
        }
    )
    return name


def expected_rows(
    data: TensorDictBase, index: torch.Tensor, sampled: torch.Tensor
) -> TensorDictBase:
    """The inserted rows at the sampled slots."""
    position = {int(s): i for i, s in enumerate(index.tolist())}
    return data[torch.tensor([position[int(s)] for s in sampled])]


def assert_same(batch: TensorDictBase, expected: TensorDictBase) -> None:
    for key in expected.keys(include_nested=True, leaves_only=True):
        got, want = batch.get(key), expected.get(key)
        assert got.dtype == want.dtype and got.shape == want.shape, key
        assert torch.equal(got, want), key


@pytest.mark.parametrize("schema", ["cartpole", "atari", "robot"])
def test_every_dtype_round_trips(client: ReplayClient, schema: str) -> None:
    fields = schema_fields(schema)
    name = new_table(client, fields, capacity=48)
    data = make_rows(fields, 40, seed=1)
    index = client.extend(name, data)
    assert sorted(index.tolist()) == list(range(40))
    batch = client.sample(name, 32)
    assert isinstance(batch, TensorDict) and batch.batch_size == torch.Size([32])
    assert batch["index"].dtype == torch.int64
    assert set(batch["sample_info"].keys()) == {"priority", "weight", "times_sampled", "key"}
    assert_same(batch, expected_rows(data, index, batch["index"]))
    info = client.info(name)
    assert info["size"] == 40 and info["capacity"] == 48
    assert set(info["fields"]) == set(fields)


def test_single_steps_and_grids_are_reshaped(client: ReplayClient) -> None:
    fields = schema_fields("cartpole")
    name = new_table(client, fields)
    step = make_rows(fields, 1)[0]  # batch []
    assert client.extend(name, step).tolist() == [0]
    grid = make_rows(fields, 6).reshape(2, 3)  # [envs, time]
    assert client.extend(name, grid).tolist() == [1, 2, 3, 4, 5, 6]


def test_generated_tensorclass(client: ReplayClient) -> None:
    fields = schema_fields("cartpole")
    name = new_table(client, fields)
    data = make_rows(fields, 10)
    index = client.extend(name, data)
    Cls = client.tensorclass(name)
    assert client.tensorclass(name) is Cls  # cached
    batch = client.sample(name, 8, as_cls=Cls)
    assert type(batch) is Cls
    assert batch.next.reward.shape == (8, 1) and batch.collector.traj_ids.dtype == torch.int64
    assert_same(batch._tensordict, expected_rows(data, index, batch.index))
    # the generated class also builds rows to send
    rows = client.sample(name, 4, as_cls=Cls)
    rows.index = None
    rows.sample_info = None
    assert client.extend(name, rows).tolist() == [10, 11, 12, 13]


@tensorclass
class Transition:
    observation: torch.Tensor
    action: torch.Tensor
    next: TensorDict


def test_callers_tensorclass(client: ReplayClient) -> None:
    fields = {
        "observation": {"shape": [4], "dtype": "float32"},
        "action": {"shape": [], "dtype": "int64"},
        "next.reward": {"shape": [1], "dtype": "float32"},
    }
    name = new_table(client, fields)
    client.extend(name, make_rows(fields, 5))
    batch = client.sample(name, 3, as_cls=Transition)
    assert isinstance(batch, Transition) and batch.next["reward"].shape == (3, 1)


def test_errors_are_typed(client: ReplayClient) -> None:
    fields = schema_fields("cartpole")
    name = new_table(client, fields, rate_limiter={"min_size_to_sample": 50})
    data = make_rows(fields, 4)
    with pytest.raises(SchemaError) as err:
        client.extend(name, data.exclude(("next", "reward")))
    assert err.value.field == "next.reward" and err.value.status == 422
    bad = data.clone()
    bad.set("observation", bad["observation"].double())
    with pytest.raises(SchemaError) as err:
        client.extend(name, bad)
    assert err.value.field == "observation"
    assert client.info(name)["size"] == 0  # nothing was written
    with pytest.raises(TableNotFound) as nf:
        client.sample(unique("missing"), 4)
    assert nf.value.status == 404 and "missing" in str(nf.value)
    with pytest.raises(TableExists):
        client.create_table({"name": name, "capacity": 4, "fields": fields})
    client.extend(name, data)
    with pytest.raises(RateLimitTimeout):
        client.sample(name, 4, timeout=0.1)
    with pytest.raises(InvalidRequest):
        client.sample(name, 0, timeout=0.1)
    with pytest.raises(SchemaError):
        client.create_table({"name": unique("bad"), "capacity": 0, "fields": fields})


def test_update_priority(client: ReplayClient) -> None:
    fields = {"x": {"shape": [], "dtype": "int64"}}
    name = new_table(client, fields, sampler={"kind": "prioritized", "alpha": 1.0, "beta": 0.4})
    index = client.extend(name, TensorDict({"x": torch.arange(16)}, [16]))
    priority = torch.full((16,), 1e-6)
    priority[3] = 1e6
    client.update_priority(name, index, priority)
    batch = client.sample(name, 64)
    assert (batch["index"] == index[3]).float().mean() > 0.95
    assert batch["sample_info", "weight"].dtype == torch.float32


def test_update_priority_with_keys(client: ReplayClient) -> None:
    """A learner's update skips the slots a collector overwrote since the sample."""
    fields = {"x": {"shape": [], "dtype": "int64"}}
    name = new_table(client, fields, capacity=8, sampler={"kind": "prioritized", "alpha": 1.0})
    client.extend(name, TensorDict({"x": torch.arange(8)}, [8]))
    Cls = client.tensorclass(name)
    batch = client.sample(name, 8, as_cls=Cls)  # the generated class holds the key too
    assert torch.equal(batch.sample_info.key, batch.x + 1)  # item i's ordinal is i + 1
    client.extend(name, TensorDict({"x": torch.arange(8, 16)}, [8]))  # every slot overwritten
    assert (
        client.update_priority(name, batch.index, torch.full((8,), 5.0), key=batch.sample_info.key)
        == 0
    )
    after = client.sample(name, 8)
    assert (after["sample_info", "priority"] == 1.0).all()
    assert torch.equal(after["sample_info", "key"], after["x"] + 1)
    # the fresh keys apply; no keys: the old behaviour, whatever the slot holds now
    assert (
        client.update_priority(
            name, after["index"][:3], torch.ones(3), key=after["sample_info", "key"][:3]
        )
        == 3
    )
    assert client.update_priority(name, batch.index, torch.full((8,), 5.0)) == 8
    for got in client.loader(name, 4, num_batches=2, as_cls=Cls):
        assert torch.equal(got.sample_info.key, got.x + 1)
    with pytest.raises(ValueError, match="keys"):
        client.update_priority(name, batch.index, torch.ones(8), key=batch.sample_info.key[:2])


def test_checkpoint_restore_export(client: ReplayClient, tmp_path: Any) -> None:
    fields = {"x": {"shape": [2], "dtype": "float32"}, "y": {"shape": [], "dtype": "int64"}}
    name = new_table(client, fields)
    data = TensorDict({"x": torch.randn(6, 2), "y": torch.arange(6)}, [6])
    client.extend(name, data)
    path = client.checkpoint(name, f"checkpoints/ck/{name}")
    assert isinstance(path, str)
    client.extend(name, data)
    assert client.info(name)["size"] == 12
    assert client.restore(name, path)["size"] == 6
    blob = client.export(name, "parquet")
    table = pq.read_table(io.BytesIO(blob))
    assert table.num_rows == 6 and sorted(table.column("y").to_pylist()) == list(range(6))
    out = client.export(name, "csv", dest=tmp_path / "t.csv")
    assert out.read_text().count("\n") >= 6
    assert isinstance(client.export(name, "parquet", path=f"exports/{name}.parquet"), str)
    names = [t["name"] for t in client.tables()]
    assert name in names
    client.delete_table(name)
    with pytest.raises(TableNotFound):
        client.info(name)
