"""Where a TorchRL user would find ``TDReplayBuffer`` differ: the same calls on TorchRL's
in-process ``TensorDictReplayBuffer`` and on the adapter, over a real server, compared.

Each test is a gap the differential run found: what TorchRL returns (or refuses) is the
reference, and the adapter either matches it or refuses by name, saying what to use.
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest
import torch
from parity_kit import rows
from torchrl.data import (
    LazyTensorStorage,
    RandomSampler,
    SamplerWithoutReplacement,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)

from tdreplay.client import SchemaError
from tdreplay.torchrl import TDReplayBuffer


def ours_for(server: Any, capacity: int = 16, **create: Any) -> Any:
    name = f"fidelity_{uuid.uuid4().hex[:8]}"
    options = {"capacity": capacity, "backend": "memory", **create}
    return lambda **kw: TDReplayBuffer(server.url, name, create=options, timeout=5.0, **kw)


@pytest.mark.parametrize("include_info", [False, True])
def test_include_info_as_torchrl(server: Any, include_info: bool) -> None:
    """TorchRL's ``sample(include_info=...)``: warned of, and ``False`` sets no info in the
    batch (``return_info`` still returns it); the adapter refused the keyword. (TorchRL's
    batch holds an ``index`` either way: its storage keeps the column extend wrote.)"""
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(16), batch_size=4)
    with ours_for(server)(batch_size=4) as ours:
        for rb in (theirs, ours):
            rb.extend(rows(0, 8))
        got = {}
        for side, rb in (("theirs", theirs), ("ours", ours)):
            with pytest.warns(UserWarning, match="include_info is going to be deprecated"):
                batch, info = rb.sample(include_info=include_info, return_info=True)
            got[side] = (set(batch.exclude("index").keys()), sorted(info))
            assert info["index"].shape == (4,)
        added = {"sample_info"} if include_info else set()  # ours: the documented extra
        assert got["ours"] == (got["theirs"][0] | added, got["theirs"][1])
        with pytest.warns(UserWarning):
            assert ("index" in ours.sample(include_info=include_info).keys()) is include_info  # noqa: SIM118


def test_iteration_over_a_without_replacement_table_ends_with_the_epoch(server: Any) -> None:
    """``for batch in rb`` over TorchRL's ``SamplerWithoutReplacement(drop_last=True)`` ends
    after one epoch of whole batches, none repeating an item; the adapter's never ended."""
    theirs = TensorDictReplayBuffer(
        storage=LazyTensorStorage(16),
        sampler=SamplerWithoutReplacement(drop_last=True),
        batch_size=3,
    )
    with ours_for(server, sampler="without_replacement")(batch_size=3) as ours:
        for rb in (theirs, ours):
            rb.extend(rows(0, 8))
        got = {}
        for side, rb in (("theirs", theirs), ("ours", ours)):
            ids = []
            for batch in rb:
                ids += batch["id"].tolist()
                assert len(ids) <= 8, f"{side}: the iteration runs past one epoch"
            got[side] = ids
        assert len(got["ours"]) == len(got["theirs"]) == 6
        assert len(set(got["ours"])) == 6  # no item twice within the epoch


@pytest.mark.parametrize(
    ("argument", "alternative"),
    [
        ({"sampler": RandomSampler()}, "create={'sampler'"),
        ({"storage": LazyTensorStorage(8)}, "create={'capacity'"),
        ({"writer": TensorDictMaxValueWriter(rank_key="r")}, "'max_value'"),
        ({"alpha": 0.7}, "'alpha': ..."),
        ({"collate_fn": lambda td: td}, "transform="),
        ({"generator": torch.Generator()}, "serve --seed"),
        ({"dim_extend": 1}, "B \\* T rows"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else "",
)
def test_torchrl_constructor_arguments_are_refused_by_name(
    server: Any, argument: dict[str, Any], alternative: str
) -> None:
    """TorchRL's own constructor arguments reached the client as unknown keywords (``got an
    unexpected keyword argument``); each is refused naming itself and what to use."""
    (name,) = argument
    with pytest.raises(TypeError, match=rf"does not take TorchRL's {name}=: .*{alternative}"):
        TDReplayBuffer(server.url, "any", **argument)


def test_a_max_value_batch_above_the_capacity_keeps_its_largest_as_torchrl(server: Any) -> None:
    """More rows than a max_value table holds: TorchRL's writer keeps the batch's largest and
    answers -1 for the others; the adapter wrote it in ring pieces, so rows the next piece
    displaced were answered slots that now hold other rows."""
    score = torch.tensor([3.0, 1.0, 4.0, 1.0, 5.0, 9.0])
    data = rows(0, 6).set("score", score)
    theirs = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictMaxValueWriter(rank_key="score")
    )
    make = ours_for(server, capacity=4, writer={"kind": "max_value", "key": "score"})
    with make() as ours:
        a, b = ours.extend(data.clone()), theirs.extend(data.clone())
        assert (a == -1).tolist() == (b == -1).tolist() == [False, True, False, True, False, False]
        kept = a >= 0
        assert ours[a[kept]]["id"].tolist() == data["id"][kept].tolist()  # each slot its row
        assert sorted(ours[:]["score"].tolist()) == sorted(theirs[:]["score"].tolist())
        with pytest.raises(SchemaError, match="score"):  # the key it ranks by, named
            ours.extend(rows(6, 6))


@pytest.mark.parametrize("create", [True, False], ids=["create", "existing_table"])
def test_non_tensor_data_is_named_not_dropped_silently(server: Any, create: bool) -> None:
    """TorchRL's storage keeps non-tensor data (``set_non_tensor``) and samples it; a table
    holds tensors only. It was left out without a word; now the warning names it."""
    data = rows(0, 4)
    data.set_non_tensor("name", "hello")
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(8), batch_size=2)
    theirs.extend(data.clone())
    assert "name" in theirs.sample().keys()  # noqa: SIM118
    with ours_for(server, capacity=8)(batch_size=2) as ours:
        if not create:
            ours.extend(rows(0, 4))
        with pytest.warns(UserWarning, match=r"does not declare \['name'\].*non-tensor"):
            ours.extend(data.clone())
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once per set of keys, as for any other key
            ours.extend(data.clone())
        assert "name" not in ours.sample().keys()  # noqa: SIM118


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_strict_refuses_non_tensor_data_by_name(server: Any, transport: str) -> None:
    """``strict=True`` sends every key and lets the server refuse the undeclared ones; the
    wire carries tensors only, so non-tensor data went missing without a word."""
    data = rows(0, 4)
    data.set_non_tensor(("next", "label"), "hello")
    with ours_for(server, capacity=8)(strict=True, transport=transport) as ours:
        ours.extend(rows(0, 4))
        with pytest.raises(SchemaError, match=r"non-tensor data \['next.label'\]"):
            ours.extend(data)
        assert (len(ours), ours.write_count) == (4, 4)  # nothing written
