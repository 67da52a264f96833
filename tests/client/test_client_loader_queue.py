"""A loader over a fifo or lifo table, left early: what it took from the queue."""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import LoaderIterator, ReplayClient

N, B = 64, 8


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


def queue_table(client: ReplayClient, kind: str) -> str:
    name = unique(kind)
    client.create_table(
        {
            "name": name,
            "capacity": N,
            "backend": {"kind": "memory"},
            "sampler": {"kind": kind},
            "fields": {"x": {"shape": [], "dtype": "int64"}},
        }
    )
    client.extend(name, TensorDict({"x": torch.arange(N)}, [N]))
    return name


def leave_after(it: LoaderIterator, batches: int, ahead: int = 0) -> list[int]:
    """Take ``batches`` batches, let the fetchers fill ``ahead`` more, leave the pass, and
    wait for its fetchers to end."""
    seen = [x for _ in range(batches) for x in next(it)["x"].tolist()]
    deadline = time.monotonic() + 30
    while it._pipe._ready.qsize() < ahead and time.monotonic() < deadline:
        time.sleep(0.01)  # the learner at work on its batch: prefetch batches come
    it.close()
    for t in it._pipe.threads:
        t.join(30)
        assert not t.is_alive()
    return seen


@pytest.mark.parametrize("kind", ["fifo", "lifo"])
def test_by_default_a_queue_table_loses_nothing_to_an_early_exit(
    client: ReplayClient, kind: str
) -> None:
    table = queue_table(client, kind)
    seen = leave_after(iter(client.loader(table, B)), 2)
    # only what the learner got left the queue (prefetch 4 took 4 more batches before)
    assert client.info(table)["size"] == N - len(seen)
    rest = client.sample(table, N - len(seen))["x"].tolist()
    assert sorted(seen + rest) == list(range(N))


def test_a_queue_loader_with_prefetch_takes_exactly_that_many_more(client: ReplayClient) -> None:
    table = queue_table(client, "fifo")
    seen = leave_after(iter(client.loader(table, B, prefetch=2)), 1, ahead=2)
    assert seen == list(range(B))
    assert client.info(table)["size"] == N - B - 2 * B  # the batch seen, and 2 ahead
    assert client.sample(table, 8)["x"].tolist() == list(range(3 * B, 4 * B))


def test_a_replay_table_still_samples_ahead(client: ReplayClient) -> None:
    table = unique("uniform")
    client.create_table(
        {
            "name": table,
            "capacity": N,
            "backend": {"kind": "memory"},
            "fields": {"x": {"shape": [], "dtype": "int64"}},
        }
    )
    client.extend(table, TensorDict({"x": torch.arange(N)}, [N]))
    it = iter(client.loader(table, B))
    next(it)
    assert len(it._pipe.threads) == 4  # the default prefetch
    it.close()


def test_prefetch_zero_cannot_stream(client: ReplayClient) -> None:
    with pytest.raises(ValueError, match="prefetch=0"):
        client.loader("any", B, prefetch=0, stream=True)
