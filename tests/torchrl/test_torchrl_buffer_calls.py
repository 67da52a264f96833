"""TDReplayBuffer against a real server, next to TorchRL's own buffer: sample transforms,
``rb[index]`` in every form TorchRL takes, and ``update_priority`` as TorchRL's accepts it."""

from __future__ import annotations

import re
import uuid
from typing import Any

import numpy as np
import pytest
import torch
from parity_kit import ALPHA, BETA, FIELDS, rows
from tensordict import TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, TensorDictMaxValueWriter, TensorDictReplayBuffer
from torchrl.envs import ExcludeTransform, SelectTransform

from tdreplay.client import InvalidRequest, TableNotFound
from tdreplay.torchrl import TDReplayBuffer


def ours_for(server: Any, sampler: str = "uniform", **options: Any) -> TDReplayBuffer:
    block: dict[str, Any] = {"kind": sampler}
    if sampler == "prioritized":
        block.update(alpha=ALPHA, beta=BETA)
    create = {"capacity": 64, "backend": "memory", "sampler": block}
    name = f"calls_{uuid.uuid4().hex[:8]}"
    return TDReplayBuffer(server.url, name, create=create, timeout=5.0, **options)


def keys_of(td: TensorDictBase) -> set[Any]:
    return set(td.keys(include_nested=True, leaves_only=True))


@pytest.mark.parametrize(
    "make",
    [lambda: SelectTransform("observation", "id"), lambda: ExcludeTransform("observation")],
    ids=["select", "exclude"],
)
def test_a_sample_transform_sees_the_rows_and_index_is_set_after_it(server: Any, make: Any) -> None:
    """TorchRL transforms the sampled rows, then sets ``index`` (and ``priority_weight``)
    on what the transform returned: a transform that selects keys keeps them, and the
    loss's ``td_error`` goes back with ``update_tensordict_priority``."""
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(64), batch_size=8)
    ours = ours_for(server, "prioritized", batch_size=8)
    for rb in (theirs, ours):
        rb.append_transform(make())
        rb.extend(rows(0, 20))
    a, b = theirs.sample(), ours.sample()
    assert a.get("index", None) is not None
    # ours adds priority_weight (prioritized) and sample_info, as documented
    added = {"priority_weight"} | {k for k in keys_of(b) if k[:1] == ("sample_info",)}
    assert keys_of(b) - added == keys_of(a)
    assert b["index"].shape == (8,) and b["priority_weight"].shape == (8,)
    b["td_error"] = torch.full((8,), 3.0)
    ours.update_tensordict_priority(b)
    after = ours.sample(64)
    updated = torch.isin(after["index"], b["index"])
    assert torch.all(after["sample_info", "priority"][updated] == 3.0)


@pytest.mark.parametrize(
    "index",
    [
        (torch.tensor([1, 2]),),  # a SliceSampler's index is a one-tuple
        np.int64(3),
        torch.tensor(3),
        torch.tensor([[0, 1], [2, 3]]),
        np.array([1, 2]),
        torch.arange(20) < 3,  # a mask
        torch.tensor([-1, -2]),
        [4, 5],
        7,
        -1,
        slice(2, 9, 3),
    ],
    ids=repr,
)
def test_items_by_every_index_form_as_torchrl_reads_them(server: Any, index: Any) -> None:
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(64))
    ours = ours_for(server)
    for rb in (theirs, ours):
        rb.extend(rows(0, 20))
    a, b = theirs[index], ours[index]
    assert a.batch_size == b.batch_size
    for key in FIELDS:
        assert torch.equal(a.get(key), b.get(key)), key


def test_update_priority_takes_one_number_for_all_items(server: Any) -> None:
    """TorchRL's ``update_priority(index, priority)``: ``priority`` a number or one per item."""
    ours = ours_for(server, "prioritized")
    ours.extend(rows(0, 20))
    assert ours.update_priority(torch.arange(20), 2.5) == 20
    assert ours.update_priority(torch.tensor([3, 4]), torch.tensor(7.0)) == 2
    batch = ours.sample(64)
    expected = torch.where(torch.isin(batch["index"], torch.tensor([3, 4])), 7.0, 2.5)
    assert torch.equal(batch["sample_info", "priority"], expected)


def ranked(values: list[float], start: int) -> TensorDict:
    """Rows with a ``score`` (the max_value writer's key) and a unique ``id``."""
    n = len(values)
    return TensorDict({"id": torch.arange(start, start + n), "score": torch.tensor(values)}, [n])


def test_extend_into_a_max_value_table_answers_minus_one_for_dropped_rows(server: Any) -> None:
    """TorchRL's ``TensorDictMaxValueWriter`` answers -1 for the rows it drops; the slot of
    every kept row holds that row (ties included), and its priority update skips the -1s."""
    theirs = TensorDictReplayBuffer(
        storage=LazyTensorStorage(4), writer=TensorDictMaxValueWriter(rank_key="score")
    )
    create = {
        "capacity": 4,
        "backend": "memory",
        "writer": {"kind": "max_value", "key": "score"},
        "sampler": {"kind": "prioritized", "alpha": ALPHA, "beta": BETA},
    }
    ours = TDReplayBuffer(server.url, f"calls_{uuid.uuid4().hex[:8]}", create=create)
    start = 0
    for values in ([1.0, 2.0, 3.0, 4.0], [0.5, 5.0, 0.1], [9.0, 0.0, 6.0]):
        data = ranked(values, start)
        a, b = theirs.extend(data.clone()), ours.extend(data.clone())
        assert torch.equal(a < 0, b < 0), (values, a, b)
        start += len(values)
    assert sorted(theirs[:]["score"].tolist()) == sorted(ours[:]["score"].tolist())
    ties = ranked([5.5, 5.5, 5.5], start)  # two of the three beat the 4.0 and the 5.0
    ties["td_error"] = torch.tensor([1.0, 2.0, 3.0])
    slots = ours.extend(ties)
    kept = slots >= 0
    assert kept.tolist() == [True, True, False]  # of equal values, the earlier rows
    assert torch.equal(ours[slots[kept]]["id"], ties["id"][kept])
    batch = ours.sample(64)
    mine = torch.isin(batch["id"], ties["id"][kept])
    assert torch.equal(batch["sample_info", "priority"][mine], batch["id"][mine] - start + 1.0)
    assert ours.update_priority(slots, 2.0) == 2
    assert ours.extend(ranked([0.0], start + 3)).tolist() == [-1]  # none kept (over shm too)


def test_update_priority_of_mismatched_empty_or_dropped_rows(server: Any) -> None:
    """Lengths that differ are the contract's ``InvalidRequest`` naming them (it was torch's
    ``shape '[4, -1]' is invalid``), nothing changed; no index is nothing to do, as TorchRL's
    (it was a reshape error); a -1 (a dropped row) leaves its key out too (it was '1 indices
    but 2 keys'); a priority per item shaped ``[N, 1]`` is one per item."""
    ours = ours_for(server, "prioritized")
    ours.extend(rows(0, 4))
    ours.update_priority(torch.arange(4), 1.0)
    with pytest.raises(ValueError, match="4 indices but 3 priorities"):
        ours.update_priority(torch.arange(4), torch.tensor([2.0, 3.0, 4.0]))
    with pytest.raises(ValueError, match="2 indices but 3 keys"):
        ours.update_priority(torch.arange(2), 2.0, key=torch.arange(3))
    assert ours[torch.arange(4)].batch_size == (4,)
    assert ours.sample(64)["sample_info", "priority"].eq(1.0).all()  # nothing changed
    assert ours.update_priority(torch.tensor([], dtype=torch.int64), torch.tensor([])) == 0
    batch = ours.sample(4)
    index, key = batch["index"][:2], batch["sample_info", "key"][:2]
    assert (
        ours.update_priority(
            torch.cat([torch.tensor([-1]), index]), 5.0, key=torch.cat([torch.tensor([99]), key])
        )
        == 2
    )
    assert ours.update_priority(torch.arange(4), torch.full((4, 1), 3.0)) == 4
    assert ours.sample(64)["sample_info", "priority"].eq(3.0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
def test_extend_with_a_bad_priority_writes_nothing(server: Any, bad: float) -> None:
    """A ``td_error`` that is NaN, infinite or negative is the table's ``InvalidRequest``
    before any row goes (the rows were written, then their priority update refused)."""
    ours = ours_for(server, "prioritized")
    ours.extend(rows(0, 4))
    data = rows(4, 3)
    data["td_error"] = torch.tensor([1.0, bad, 2.0])
    with pytest.raises(InvalidRequest, match="priorities must be finite and >= 0"):
        ours.extend(data)
    assert len(ours) == 4 and ours.write_count == 4
    data["td_error"] = torch.tensor([1.0, 3.0, 2.0])
    assert ours.extend(data).tolist() == [4, 5, 6]


@pytest.mark.timeout(20)  # before: one draw of the capacity after another, for ever
def test_a_sample_past_the_contracts_most_is_refused_before_it_is_split(server: Any) -> None:
    """``sample(n)`` above the capacity is drawn in pieces; a size no sample may have (the
    contract's 2**31 items at most) was split too, 10**12 / 64 requests, where the client's
    own ``sample`` refuses it at once. Now the same ``InvalidRequest``, before any draw."""
    ours = ours_for(server)
    ours.extend(rows(0, 4))
    for n in (10**12, 0, 2.5):
        with pytest.raises(InvalidRequest, match="batch_size"):
            ours.sample(n)
    assert ours.stats()["sample_count"] == 0
    assert ours.sample(100).batch_size == (100,)  # above the capacity: still drawn in pieces


def test_empty_before_the_first_write_of_a_create_buffer(server: Any) -> None:
    """TorchRL's ``empty()`` of a lazy storage not yet written is nothing to do; here it was
    ``TableNotFound`` (the table is made by the first extend). A buffer without ``create=``
    still names a missing table."""
    theirs = TensorDictReplayBuffer(storage=LazyTensorStorage(64))
    ours = ours_for(server)
    theirs.empty()
    ours.empty()
    assert len(ours) == len(theirs) == 0
    assert ours.extend(rows(0, 3)).tolist() == theirs.extend(rows(0, 3)).tolist()
    ours.empty()
    assert len(ours) == 0
    with pytest.raises(TableNotFound):
        TDReplayBuffer(server.url, f"calls_{uuid.uuid4().hex[:8]}").empty()


def test_return_info_takes_a_batch_whose_shape_a_transform_changed(server: Any) -> None:
    """A transform that reshapes the batch leaves no room for ``index`` in it: the error says
    to pass ``sample(return_info=True)``, which raised the same error. Now the info comes
    apart (``sample_info`` with it) and the batch keeps the transform's shape."""
    ours = ours_for(server, "prioritized")
    ours.extend(rows(0, 8))
    ours.append_transform(lambda td: td.reshape(2, 2))
    with pytest.raises(RuntimeError, match="return_info=True"):
        ours.sample(4)
    batch, info = ours.sample(4, return_info=True)
    assert batch.batch_size == (2, 2) and "sample_info" not in batch
    assert torch.equal(batch["id"].reshape(-1), info["index"])  # row i went to slot i
    assert info["priority_weight"].shape == info["sample_info"]["key"].shape == (4,)
    assert ours.update_priority(info["index"], 2.0, key=info["sample_info"]["key"]) == 4


def test_load_state_dict_of_another_table_names_both(server: Any) -> None:
    """Another buffer's state was refused as 'not a state_dict() ... expected {'table': ...,
    'archives': [...]}', the very layout it had; now both tables are named. Nothing changes."""
    a, b = ours_for(server), ours_for(server)
    a.extend(rows(0, 3))
    b.extend(rows(0, 2))
    with pytest.raises(ValueError, match=f"of table '{a.table}', not of '{b.table}'"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="expected"):
        b.load_state_dict({"table": b.table})
    assert len(b) == 2


@pytest.mark.parametrize(
    "archive, got",
    [
        (torch.tensor([1.5, 300.0]), "torch.float32 tensor of shape [2]"),
        (torch.arange(1000), "torch.int64 tensor of shape [1000]"),
        (torch.zeros(2, 512, dtype=torch.uint8), "torch.uint8 tensor of shape [2, 512]"),
        ("abc", "a str"),
    ],
)
def test_load_state_dict_refuses_an_archive_that_is_not_its_bytes(
    server: Any, archive: Any, got: str
) -> None:
    """A float or int64 archive was cast to uint8 (300.0 became 44) and sent: the server
    answered that the bytes were no tar archive, not what was wrong with the state; a str
    raised torch's 'new(): invalid data type'. Now it is named before anything is sent."""
    rb = ours_for(server)
    rb.extend(rows(0, 2))
    with pytest.raises(ValueError, match=rf"archives\[0\] is (a )?{re.escape(got)}"):
        rb.load_state_dict({"table": rb.table, "archives": [archive]})
    assert len(rb) == 2
