"""Slots and keys a caller names (``update_priority``, ``remove``, ``read``): one rule, the
contract's (``codec.indices.SlotIndex``), on both sides, before anything changes.

A float (0.5 would be slot 0: the wrong item updated or removed), a bool (``True`` would
be slot 1), a string, a negative or a too large number is an ``InvalidRequest`` naming
``index`` or ``key``; the client refuses it before sending, the server as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import InvalidRequest, ReplayClient

BAD = {
    "float tensor": torch.tensor([0.5]),
    "integral float tensor": torch.tensor([1.0]),
    "float list": [0.5],
    "float array": np.array([1.5]),
    "bool list": [True],
    "bool tensor": torch.tensor([True]),
    "2**63": [2**63],
    "huge": [10**30],
    "string": ["a"],
    "numeric string": ["1"],
    "negative": [-1],
    "None": [None],
}


def new_table(client: ReplayClient) -> str:
    name = unique("ix")
    client.create_table(
        {
            "name": name,
            "capacity": 64,
            "backend": {"kind": "memory"},
            "fields": {"x": {"shape": [], "dtype": "int64"}},
            "sampler": {"kind": "prioritized", "alpha": 1.0, "beta": 1.0},
        }
    )
    client.extend(name, TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    client.update_priority(name, [0, 1, 2, 3], [1.0, 2.0, 3.0, 4.0])
    return name


def priorities(client: ReplayClient, name: str) -> dict[int, float]:
    batch = client.sample(name, 64)
    return {
        int(i): float(p)
        for i, p in zip(batch["index"], batch["sample_info", "priority"], strict=True)
    }


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_bad_slots_and_keys_are_refused_and_change_nothing(server: Any, transport: str) -> None:
    client = ReplayClient(server.url, transport=transport)
    name = new_table(client)
    before = priorities(client, name)
    assert set(before) == {0, 1, 2, 3}
    calls: dict[str, tuple[str, Callable[[Any], Any]]] = {
        "update_priority": ("index", lambda bad: client.update_priority(name, bad, [9.0])),
        "remove": ("index", lambda bad: client.remove(name, bad)),
        "read": ("index", lambda bad: client.read(name, bad)),
        "update_priority key": (
            "key",
            lambda bad: client.update_priority(name, [0], [9.0], key=bad),
        ),
        "remove key": ("key", lambda bad: client.remove(name, [0], key=bad)),
    }
    for what, bad in BAD.items():
        for call, (field, run) in calls.items():
            with pytest.raises(InvalidRequest) as caught:
                run(bad)
            got = caught.value.field or ""
            assert got.split(".")[0] == field, (what, call, got)
    assert client.info(name)["size"] == 4
    assert priorities(client, name) == before
    # good slots still work, as tensors, arrays, lists and nested lists
    assert client.update_priority(name, np.array([0, 1]), torch.tensor([5.0, 6.0])) == 2
    assert client.read(name, [[2], [3]])["x"].tolist() == [2, 3]
    assert client.remove(name, torch.tensor([3]), key=None) == 1
    assert client.update_priority(name, [0], [7.0], key=[10**6]) == 0  # a stale key: skipped


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_bool_or_a_string_is_no_priority(server: Any, transport: str) -> None:
    """A priority is a number: ``True`` (a bool tensor, a bool list) or ``"1"`` is refused,
    naming ``priority``, by the client before sending and by the server; it was 1.0."""
    client = ReplayClient(server.url, transport=transport)
    name = new_table(client)
    before = priorities(client, name)
    for bad in ([True], torch.tensor([True]), ["1"]):
        with pytest.raises(InvalidRequest) as caught:
            client.update_priority(name, [0], bad)
        assert (caught.value.field or "").split(".")[0] == "priority", bad
    for body in ({"index": [0], "priority": [True]}, {"index": [0], "priority": ["1"]}):
        status, _, answer = server.request(
            "POST", f"/v1/tables/{name}/update_priority", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        assert status == 400 and json.loads(answer)["field"].startswith("priority"), answer
    assert priorities(client, name) == before


@pytest.mark.parametrize("index", [[True], ["1"], [1.0], [0.5]])
def test_the_server_refuses_them_too(server: Any, index: list[Any]) -> None:
    name = new_table(ReplayClient(server.url))
    for op, body in (
        ("update_priority", {"index": index, "priority": [9.0]}),
        ("remove", {"index": index}),
        ("read", {"index": index}),
        ("update_priority", {"index": [0], "priority": [9.0], "key": index}),
    ):
        status, _, answer = server.request(
            "POST",
            f"/v1/tables/{name}/{op}",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        assert status == 400, (op, body, answer)
        assert json.loads(answer)["type"] == "InvalidRequest"
    assert ReplayClient(server.url).info(name)["size"] == 4
