"""The loader against a real server: prefetch, buffer reuse, keep, stream, DataLoader workers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique
from torch.utils.data import DataLoader, IterableDataset

from tdreplay.client import Loader, ReplayClient, TableNotFound
from tdreplay.client.shm import ShmLink

FIELDS = {
    "x": {"shape": [], "dtype": "int64"},
    "obs": {"shape": [64], "dtype": "float32"},
    "done": {"shape": [1], "dtype": "bool"},
}


@pytest.fixture(scope="module")
def client(server: Any) -> ReplayClient:
    return ReplayClient(server.url, timeout=30)


@pytest.fixture(scope="module")
def table(client: ReplayClient) -> str:
    name = unique("loader")
    client.create_table(
        {"name": name, "capacity": 256, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    x = torch.arange(256)
    rows = TensorDict(
        {"x": x, "obs": x[:, None].float().expand(256, 64).clone(), "done": (x % 7 == 0)[:, None]},
        [256],
    )
    client.extend(name, rows)
    return name


def check(batch: TensorDict) -> None:
    x = batch["x"]
    assert torch.equal(batch["obs"], x[:, None].float().expand(-1, 64))
    assert torch.equal(batch["done"], (x % 7 == 0)[:, None])
    assert torch.equal(batch["index"], x)  # row i went to slot i


def test_loader_yields_num_batches_and_reuses_buffers(client: ReplayClient, table: str) -> None:
    loader = client.loader(table, 32, prefetch=2, num_batches=12)
    assert isinstance(loader, IterableDataset)
    it = iter(loader)
    pointers = set()
    n = 0
    for batch in it:
        check(batch)  # valid until the next batch is taken
        pointers.add(batch["obs"].untyped_storage().data_ptr())
        n += 1
    assert n == 12 and it.batches == 12
    # 12 batches went through at most prefetch + 1 receive buffers (the first
    # answers of each buffer arrive before it is sized: one fresh buffer each)
    assert len(pointers) <= 2 * (2 + 1)
    assert it.wait_s >= 0.0


def test_keep_gives_batches_their_own_memory(client: ReplayClient, table: str) -> None:
    batches = list(client.loader(table, 16, prefetch=2, num_batches=6, keep=True))
    assert len(batches) == 6
    for b in batches:
        check(b)
    assert len({b["obs"].untyped_storage().data_ptr() for b in batches}) == 6


def share_or_take_gradients(batches: Iterable[TensorDict]) -> None:
    """Check each batch, then move it to shared memory or take a gradient of it, by turns:
    each next batch must be right, new rows (16 of 256), and free of that gradient."""
    seen: list[torch.Tensor] = []
    for i, batch in enumerate(batches):
        check(batch)
        obs = batch["obs"]
        assert not obs.requires_grad and obs.grad is None
        assert not any(torch.equal(batch["x"], x) for x in seen)  # 16 of 256 rows: new ones
        seen.append(batch["x"].clone())
        if i % 2:
            batch.share_memory_()
        else:
            obs.requires_grad_()
            obs.sum().backward()


def test_a_learner_that_shares_a_batch_or_takes_its_gradient_gets_fresh_batches_after(
    client: ReplayClient, table: str
) -> None:
    # over shm a buffer's column views are kept from batch to batch; a learner that moves
    # a batch to shared memory (share_memory_(), as a torch.multiprocessing queue does) or
    # takes the gradient of a batch's tensor must not find the same bytes (a batch again),
    # or that gradient, in the later batches of that buffer
    share_or_take_gradients(client.loader(table, 16, prefetch=1, num_batches=24))
    assert isinstance(client._driver.links[0], ShmLink)  # the same-host transport carried them


def test_a_caller_that_shares_a_leased_sample_or_takes_its_gradient_gets_fresh_samples_after(
    client: ReplayClient, table: str
) -> None:
    # ReplayClient.sample over shm views the thread's leased slot, whose column tensors are
    # kept from call to call: the same rule as the loader's buffers
    share_or_take_gradients(client.sample(table, 16) for _ in range(24))
    assert isinstance(client._driver.links[0], ShmLink)


def test_as_cls_and_device(client: ReplayClient, table: str) -> None:
    Cls = client.tensorclass(table)
    for batch in client.loader(table, 8, num_batches=2, as_cls=Cls, device="cpu"):
        assert type(batch) is Cls and batch.obs.device.type == "cpu"


def test_stream_route(client: ReplayClient, table: str) -> None:
    batches = [b.clone() for b in client.loader(table, 8, num_batches=5, stream=True)]
    assert len(batches) == 5
    for b in batches:
        assert b.batch_size == torch.Size([8])
        check(b)


def test_errors_stop_the_loader(client: ReplayClient) -> None:
    it = iter(client.loader(unique("missing"), 8, prefetch=2))
    with pytest.raises(TableNotFound):
        next(it)
    with pytest.raises(StopIteration):
        next(it)


def test_loader_needs_sane_arguments(client: ReplayClient, table: str) -> None:
    with pytest.raises(ValueError):
        client.loader(table, 8, prefetch=-1)
    with pytest.raises(ValueError):
        Loader(ReplayClient([client.urls[0], client.urls[0]]), table, 8, stream=True)


def test_dataloader_workers_reconnect(client: ReplayClient, table: str) -> None:
    loader = client.loader(table, 16, num_batches=3)
    dl = loader.dataloader(num_workers=1, multiprocessing_context="spawn")
    assert isinstance(dl, DataLoader)
    got = list(dl)
    assert len(got) == 3
    for b in got:
        check(b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_staging(client: ReplayClient, table: str) -> None:  # pragma: no cover - GPU hosts
    side_results = []
    for batch in client.loader(table, 32, prefetch=3, num_batches=20, device="cuda"):
        assert batch["obs"].is_cuda
        side_results.append(batch["x"].sum())  # consumed on the current stream
        check(batch.cpu())
    torch.cuda.synchronize()
    assert len(side_results) == 20


def test_breaking_out_stops_the_fetchers(client: ReplayClient, table: str) -> None:
    import gc
    import threading

    before = {t for t in threading.enumerate() if t.name.startswith("tdreplay-loader")}
    for batch in client.loader(table, 8, prefetch=3):  # endless
        check(batch)
        break
    gc.collect()  # the dropped iterator's finalizer stops its threads
    mine = [
        t for t in threading.enumerate() if t.name.startswith("tdreplay-loader") and t not in before
    ]
    for t in mine:
        t.join(10)
    assert not any(t.is_alive() for t in mine)


@pytest.mark.parametrize("stream", [False, True])
def test_no_data_in_time_is_a_rate_limit_timeout(client: ReplayClient, stream: bool) -> None:
    from tdreplay.client import RateLimitTimeout

    name = unique("starved")
    client.create_table(
        {
            "name": name,
            "capacity": 8,
            "backend": {"kind": "memory"},
            "fields": FIELDS,
            "rate_limiter": {"min_size_to_sample": 8},
        }
    )
    it = iter(client.loader(name, 4, prefetch=1, timeout=0.1, stream=stream))
    with pytest.raises(RateLimitTimeout):
        next(it)


def test_a_stream_of_num_batches_samples_no_more_than_that(client: ReplayClient) -> None:
    """``stream=True, num_batches=k`` asks the server for k batches: once they came, it opened
    another stream whose first batch the server sampled and the loader dropped, 4 items of a
    fifo table lost (each item goes out once)."""
    name = unique("fifo_stream")
    client.create_table(
        {
            "name": name,
            "capacity": 64,
            "backend": {"kind": "memory"},
            "fields": {"x": {"shape": [], "dtype": "int64"}},
            "sampler": {"kind": "fifo"},
        }
    )
    client.extend(name, TensorDict({"x": torch.arange(64)}, [64]))
    it = iter(client.loader(name, 4, num_batches=2, prefetch=1, stream=True))
    got = torch.cat([next(it)["x"].clone() for _ in range(2)])
    (fetcher,) = it._pipe.threads
    fetcher.join(5)  # its pass is over: it ends (it waited for a credit with a third batch)
    it.close()
    fetcher.join(30)
    assert got.tolist() == list(range(8))
    assert client.info(name)["size"] == 56
