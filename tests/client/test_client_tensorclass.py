from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict, tensorclass

from tdreplay.client import from_fields, to_tensorclass
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
