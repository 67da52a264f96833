from __future__ import annotations

from typing import Any

import pytest
import torch
from tensordict import TensorDict, tensorclass
from testkit import unique

from tdreplay.client import ReplayClient, from_fields, to_tensorclass
from tdreplay.codec import decode, encode

FIELDS = {
    "observation": {"shape": [4], "dtype": "float32"},
    "action": {"shape": [], "dtype": "int64"},
    "next.reward": {"shape": [1], "dtype": "float32"},
    "next.done": {"shape": [1], "dtype": "bool"},
}


def sampled(n: int = 3) -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(n, 4),
            "action": torch.arange(n),
            "next": {"reward": torch.ones(n, 1), "done": torch.zeros(n, 1, dtype=torch.bool)},
            "index": torch.arange(n),
            "sample_info": {
                "priority": torch.ones(n),
                "weight": torch.ones(n),
                "times_sampled": torch.ones(n, dtype=torch.int64),
                "key": torch.arange(n),
            },
        },
        [n],
    )


def test_generated_class_reads_samples_and_builds_rows() -> None:
    Cartpole = from_fields("cart_pole", FIELDS)
    assert Cartpole.__name__ == "CartPole"
    td = sampled()
    batch = to_tensorclass(td, Cartpole)
    assert type(batch.next).__name__ == "CartPoleNext"
    assert torch.equal(batch.observation, td["observation"])
    assert torch.equal(batch.sample_info.weight, td["sample_info", "weight"])
    assert batch.index.tolist() == [0, 1, 2]
    # the same class builds rows to send: index and sample info are optional
    rows = to_tensorclass(sampled(2).exclude("index", "sample_info"), Cartpole)
    assert rows.index is None and rows.sample_info is None
    back = decode(encode(rows))
    assert {".".join(k) if isinstance(k, tuple) else k for k in back.keys(True, True)} == set(
        FIELDS
    )


@tensorclass
class Transition:
    observation: torch.Tensor
    action: torch.Tensor
    next: TensorDict


def test_callers_class_drops_sample_keys() -> None:
    t = to_tensorclass(sampled(), Transition)
    assert isinstance(t, Transition) and t.batch_size == torch.Size([3])
    assert isinstance(t.next, TensorDict)


def test_mismatches_are_reported() -> None:
    @tensorclass
    class Narrow:
        observation: torch.Tensor

    narrow = to_tensorclass(sampled(), Narrow)  # a view: other keys are left out
    assert narrow.observation.shape == (3, 4)

    @tensorclass
    class Wide:
        observation: torch.Tensor
        action: torch.Tensor
        next: TensorDict
        extra: torch.Tensor

    with pytest.raises(ValueError, match="extra"):
        to_tensorclass(sampled(), Wide)
    with pytest.raises(TypeError):
        to_tensorclass(sampled(), dict)


# Field names that are TensorDict / tensorclass attributes, on real tables. The class is
# made with tensordict's ``shadow=True`` where the field then works (it shadows the
# attribute: ``batch.shape`` is the field); a name the class cannot take is refused
# naming the field and the way out (the batch as a TensorDict).
SHADOWED = ["shape", "keys", "items", "get", "dtype", "names", "grad", "numel", "ndim", "is_locked"]
REFUSED = ["to", "device", "self", "next.batch_size"]


def _table(client: ReplayClient, field: str) -> str:
    name = unique("tc")
    fields = {field: {"shape": [], "dtype": "int64"}, "obs": {"shape": [2], "dtype": "float32"}}
    client.create_table(
        {"name": name, "capacity": 8, "backend": {"kind": "memory"}, "fields": fields}
    )
    x = torch.arange(8)
    rows = TensorDict({"obs": x[:, None].float().expand(8, 2).clone()}, [8])
    rows.set(tuple(field.split(".")), x * 10)
    client.extend(name, rows)
    return name


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


@pytest.mark.parametrize("field", SHADOWED)
def test_a_field_named_like_a_tensordict_attribute_shadows_it(
    client: ReplayClient, field: str
) -> None:
    table = _table(client, field)
    Cls = client.tensorclass(table)
    batch = client.sample(table, 4, as_cls=Cls)
    assert type(batch) is Cls and batch.batch_size == torch.Size([4])
    value = getattr(batch, field)
    assert torch.equal(value, batch.obs[:, 0].long() * 10)  # the field, not the attribute
    assert torch.equal(batch.index, batch.obs[:, 0].long())
    part = batch[1:3].clone().to("cpu")
    assert type(part) is Cls and torch.equal(getattr(part, field), value[1:3])
    assert torch.equal(part._tensordict[field], value[1:3])
    for b in client.loader(table, 4, num_batches=2, as_cls=Cls):
        assert type(b) is Cls and torch.equal(getattr(b, field), b.obs[:, 0].long() * 10)


@pytest.mark.parametrize("field", REFUSED)
def test_a_field_the_class_cannot_take_is_refused_naming_it(
    client: ReplayClient, field: str
) -> None:
    table = _table(client, field)
    with pytest.raises(ValueError, match=f"field '{field}'.*TensorDict") as err:
        client.tensorclass(table)
    assert "shadow" not in str(err.value)  # no advice the caller cannot take
    batch = client.sample(table, 4)  # the way out: the batch as a TensorDict
    assert torch.equal(batch[tuple(field.split("."))], batch["obs"][:, 0].long() * 10)
