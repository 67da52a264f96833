"""A sample of an empty table comes back as ``EmptyTableError`` on every door: the class the
table raised, answered with 429 (it is a ``RateLimitTimeout``, so ``except RateLimitTimeout``
still catches it), raised again by the client over HTTP and shared memory, sync and async."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from testkit import make_rows, schema_fields, unique

from tdreplay.client import AsyncReplayClient, EmptyTableError, RateLimitTimeout, ReplayClient

FIELDS = schema_fields("cartpole")


def new_table(client: ReplayClient, **rate_limiter: Any) -> str:
    name = unique("empty")
    client.create_table(
        {
            "name": name,
            "capacity": 8,
            "backend": {"kind": "memory"},
            "fields": FIELDS,
            "rate_limiter": rate_limiter or {"min_size_to_sample": 1},
        }
    )
    return name


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_sample_of_an_empty_table_raises_empty_table_error(server: Any, transport: str) -> None:
    client = ReplayClient(server.url, transport=transport)
    name = new_table(client, min_size_to_sample=2)
    for timeout in (0, 0.05):
        with pytest.raises(EmptyTableError, match=f"table '{name}' holds no item") as info:
            client.sample(name, 2, timeout=timeout)
        assert isinstance(info.value, RateLimitTimeout)
        assert (info.value.status, info.value.table) == (429, name)
    client.extend(name, make_rows(FIELDS, 1))  # one item, two needed: held back, not empty
    with pytest.raises(RateLimitTimeout) as held:
        client.sample(name, 2, timeout=0)
    assert type(held.value) is RateLimitTimeout


def test_the_async_client_raises_it_too(server: Any) -> None:
    name = new_table(ReplayClient(server.url))

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            with pytest.raises(EmptyTableError) as info:
                await client.sample(name, 1, timeout=0)
            assert info.value.status == 429

    asyncio.run(main())


@pytest.mark.parametrize("stream", [False, True], ids=["samples", "stream"])
def test_a_loader_of_an_empty_table_raises_it(server: Any, stream: bool) -> None:
    """The loader's samples and its stream (the server's ``/stream`` route) decide it where a
    sample does: an empty table is ``EmptyTableError``, one held back is ``RateLimitTimeout``."""
    client = ReplayClient(server.url)
    name = new_table(client, min_size_to_sample=2)
    for timeout in (0, 0.05):
        batches = iter(client.loader(name, batch_size=2, timeout=timeout, stream=stream))
        with pytest.raises(EmptyTableError, match=f"table '{name}' holds no item") as info:
            next(batches)
        assert (info.value.status, info.value.table) == (429, name)
        batches.close()
    client.extend(name, make_rows(FIELDS, 1))  # one item, two needed: held back, not empty
    batches = iter(client.loader(name, batch_size=2, timeout=0, stream=stream))
    with pytest.raises(RateLimitTimeout) as held:
        next(batches)
    assert type(held.value) is RateLimitTimeout
    batches.close()


@pytest.mark.parametrize("stream", [False, True], ids=["samples", "stream"])
def test_a_loader_that_empties_its_table_raises_it(server: Any, stream: bool) -> None:
    """A queue's loader takes every item: the batch after the last is ``EmptyTableError``
    (the stream ends early, and the stream opened next is refused as a sample is)."""
    client = ReplayClient(server.url)
    name = unique("queue")
    client.create_table(
        {"name": name, "capacity": 8, "backend": {"kind": "memory"}, "fields": FIELDS,
         "sampler": {"kind": "fifo"}}
    )  # fmt: skip
    client.extend(name, make_rows(FIELDS, 4))
    batches = iter(client.loader(name, batch_size=2, timeout=0.05, stream=stream))
    assert [len(next(batches)) for _ in range(2)] == [2, 2]
    with pytest.raises(EmptyTableError, match=f"table '{name}' holds no item"):
        next(batches)
    batches.close()
