"""The loader's arguments, checked once when it is made (sync and async), and its ``len``."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import AsyncReplayClient, InvalidRequest, ReplayClient

FIELDS = {"x": {"shape": [], "dtype": "int64"}}


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


@pytest.fixture(scope="module")
def table(client: ReplayClient) -> str:
    name = unique("args")
    client.create_table(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    client.extend(name, TensorDict({"x": torch.arange(64)}, [64]))
    return name


BAD = [
    ({"prefetch": 2.5}, "prefetch"),
    ({"prefetch": "4"}, "prefetch"),
    ({"prefetch": True}, "prefetch"),
    ({"prefetch": -1}, "prefetch"),
    ({"prefetch": 65}, "prefetch"),  # each a thread: at most 64
    ({"num_batches": -1}, "num_batches"),
    ({"num_batches": 0}, "num_batches"),
    ({"num_batches": 2.5}, "num_batches"),
    ({"num_batches": "many"}, "num_batches"),
    ({"timeout": -1.0}, "timeout"),
]


@pytest.mark.parametrize(("kwargs", "name"), BAD)
def test_a_bad_argument_is_refused_when_the_loader_is_made(
    client: ReplayClient, table: str, kwargs: dict[str, Any], name: str
) -> None:
    with pytest.raises(InvalidRequest, match=f"^{name}: ") as err:
        client.loader(table, 8, **kwargs)
    assert err.value.field == name

    async def make() -> None:
        async with AsyncReplayClient(client.urls[0]) as aclient:
            aclient.loader(table, 8, **kwargs)

    with pytest.raises(InvalidRequest, match=f"^{name}: "):
        asyncio.run(make())


def test_prefetch_above_its_maximum_is_refused_naming_it(client: ReplayClient, table: str) -> None:
    with pytest.raises(InvalidRequest, match=r"^prefetch: .*64") as err:
        client.loader(table, 8, prefetch=10_000)
    assert err.value.field == "prefetch"
    client.loader(table, 8, prefetch=64)  # the maximum itself is taken


@pytest.mark.parametrize("batch_size", [0, -3, 2.5, "many", 1 << 40])
def test_a_bad_batch_size_follows_the_contracts_rule(
    client: ReplayClient, table: str, batch_size: Any
) -> None:
    with pytest.raises(InvalidRequest, match=r"^batch_size: ") as err:
        client.loader(table, batch_size)
    assert err.value.field == "batch_size"


def test_as_cls_that_is_no_tensorclass_is_refused_when_the_loader_is_made(
    client: ReplayClient, table: str
) -> None:
    with pytest.raises(TypeError, match="as_cls must be a @tensorclass, got <class 'int'>"):
        client.loader(table, 8, as_cls=int)


def test_len_is_num_batches_and_a_dataloader_of_workers_yields_that_many(
    client: ReplayClient, table: str
) -> None:
    assert len(client.loader(table, 8, num_batches=5)) == 5
    endless = client.loader(table, 8)
    with pytest.raises(TypeError, match="num_batches"):
        len(endless)
    assert endless  # truthy all the same
    # torch trusts an IterableDataset's len: each worker runs its share of the batches
    dl = client.loader(table, 8, num_batches=5).dataloader(
        num_workers=2, multiprocessing_context="spawn"
    )
    assert len(dl) == 5
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Length of IterableDataset ... was reported to be 5"
        got = list(dl)
    assert len(got) == 5
    assert all(b.batch_size == torch.Size([8]) for b in got)
