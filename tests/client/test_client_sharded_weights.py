"""Importance weights of a prioritized table sharded over two real servers, over either door.

A sharded sample draws each item from server ``s`` with probability ``N_s / N`` (the
split goes by size), then item ``i`` there with ``leaf_i / T_s`` (``leaf = (p + eps)^alpha``,
``T_s`` the server's sum): ``P(i) = N_s leaf_i / (N T_s)``. Its weights are TorchRL's
over the union, ``(N P(i))^-beta`` divided by the largest over every item of every
server. The reference is one in-process table holding the union whose priorities give
each item that probability: its own sampler's weights, compared item by item.
"""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import ReplayClient
from tdreplay.storage import Table, TableSpec

FIELDS = {"x": {"shape": [], "dtype": "int64"}}
EPS = 1e-6


@pytest.fixture(scope="module")
def servers(server: Any, live_server: Any) -> list[Any]:
    return [server, live_server()]


def spec(name: str, alpha: float, beta: float, capacity: int = 512) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "backend": {"kind": "memory"},
        "fields": FIELDS,
        "sampler": {"kind": "prioritized", "alpha": alpha, "beta": beta, "eps": EPS},
    }


def fill(servers: list[Any], alpha: float, beta: float, shards: list[list[float]]) -> str:
    """A table on each server holding ``shards[s]``'s priorities; item ``x`` is
    ``1000 * s + k`` for the ``k``-th item of server ``s``."""
    name = unique("w")
    for s, (server, prios) in enumerate(zip(servers, shards, strict=True)):
        one = ReplayClient(server.url, transport="http")
        one.create_table(spec(name, alpha, beta))
        n = len(prios)
        index = one.extend(name, TensorDict({"x": torch.arange(n) + 1000 * s}, [n]))
        assert one.update_priority(name, index, torch.tensor(prios, dtype=torch.float64)) == n
        one.close()
    return name


def union_weights(shards: list[list[float]], alpha: float, beta: float) -> dict[int, float]:
    """Each item's weight by ``x``, from one in-process table holding the union."""
    leaves = [(torch.tensor(p, dtype=torch.float64) + EPS) ** alpha for p in shards]
    # the probability each item is drawn with, sharded: N_s leaf_i / (N T_s)
    prob = torch.cat([len(leaf) * leaf / leaf.sum() for leaf in leaves])
    prob = prob / prob.sum()
    xs = torch.cat([torch.arange(len(p)) + 1000 * s for s, p in enumerate(shards)])
    n = len(xs)
    with tempfile.TemporaryDirectory() as root:
        table = Table.create(TableSpec.model_validate(spec("union", alpha, beta, n)), root=root)
        try:
            index = table.extend(TensorDict({"x": xs}, [n]))
            # priorities whose leaves are proportional to those probabilities
            table.update_priority(index, (prob * n) ** (1 / alpha) - EPS)
            got: dict[int, float] = {}
            for _ in range(1000):  # until every item was drawn
                if len(got) == n:
                    break
                batch = table.sample(n)
                got.update(
                    zip(batch["x"].tolist(), batch["sample_info", "weight"].tolist(), strict=True)
                )
        finally:
            table.close()
    return got


def sharded_weights(client: ReplayClient, name: str, n: int, batch: int = 64) -> dict[int, float]:
    """Each item's weight by ``x``, as ``client`` samples them (until all ``n`` are seen)."""
    got: dict[int, float] = {}
    for _ in range(2560 // batch):
        sample = client.sample(name, batch)
        weights = sample["sample_info", "weight"].tolist()
        for x, w in zip(sample["x"].tolist(), weights, strict=True):
            assert got.setdefault(x, w) == pytest.approx(w, abs=1e-6)  # one weight an item
        if len(got) == n:
            break
    return got


def sharded(servers: list[Any], transport: str, refresh: float = 0.0) -> ReplayClient:
    client = ReplayClient([s.url for s in servers], transport=transport, shard_refresh=refresh)
    assert client.transport == transport  # "shm": strict, no server answered over HTTP
    return client


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_weights_are_normalised_over_every_server(servers: list[Any], transport: str) -> None:
    # server A: all priority 1; server B: half 1, half 10 (alpha = beta = 1)
    shards = [[1.0] * 8, [1.0] * 4 + [10.0] * 4]
    name = fill(servers, 1.0, 1.0, shards)
    got = sharded_weights(sharded(servers, transport), name, 16)
    want = union_weights(shards, 1.0, 1.0)
    assert set(got) == set(want)
    for x, w in got.items():
        assert w == pytest.approx(want[x], abs=1e-5), x
    a, b1, b10 = got[0], got[1000], got[1007]
    assert (a, b1, b10) == pytest.approx((1 / 5.5, 1.0, 0.1), abs=1e-5)


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_random_priorities_and_sizes(servers: list[Any], transport: str) -> None:
    gen = torch.Generator().manual_seed(7)
    shards = [
        (torch.rand(13, generator=gen) * 5).tolist(),
        (torch.rand(29, generator=gen) ** 3 * 40 + 0.2).tolist(),
    ]
    name = fill(servers, 0.7, 0.6, shards)
    got = sharded_weights(sharded(servers, transport), name, 42)
    want = union_weights(shards, 0.7, 0.6)
    assert set(got) <= set(want) and len(got) > 30  # a few rare items may go undrawn
    assert {x // 1000 for x in got} == {0, 1}
    for x, w in got.items():
        assert w == pytest.approx(want[x], abs=1e-5), x


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_batch_from_one_server_is_normalised_over_both(
    servers: list[Any], transport: str
) -> None:
    # one item a sample: drawn from one server, normalised by the other's too
    shards = [[1.0] * 8, [1.0] * 4 + [10.0] * 4]
    name = fill(servers, 1.0, 1.0, shards)
    got = sharded_weights(sharded(servers, transport, refresh=60.0), name, 16, batch=1)
    want = union_weights(shards, 1.0, 1.0)
    assert {x // 1000 for x in got} == {0, 1}
    for x, w in got.items():
        assert w == pytest.approx(want[x], abs=1e-5), x


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_weights_follow_priorities_changed_since_the_sizes_were_read(
    servers: list[Any], transport: str
) -> None:
    shards = [[1.0] * 8, [1.0] * 4 + [10.0] * 4]
    name = fill(servers, 1.0, 1.0, shards)
    client = sharded(servers, transport, refresh=60.0)
    client.sample(name, 64)  # the servers' sizes (and infos) read, kept for a minute
    # server B's items all priority 10 but one at 0.5: its largest weight grows from 5.5
    # to 17.6; the sizes the client keeps are still right, B's info it read is not
    shards[1] = [0.5] + [10.0] * 7
    one = ReplayClient(servers[1].url, transport="http")
    assert one.update_priority(name, torch.arange(8), torch.tensor(shards[1])) == 8
    got = sharded_weights(client, name, 16)
    want = union_weights(shards, 1.0, 1.0)
    assert {x // 1000 for x in got} == {0, 1}
    for x, w in got.items():
        assert w == pytest.approx(want[x], abs=1e-5), x
