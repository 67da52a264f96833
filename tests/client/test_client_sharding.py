"""One client over two real servers: inserts spread, samples in proportion to sizes."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import free_port, unique

from tdreplay.client import (
    AsyncReplayClient,
    ConnectionFailed,
    RateLimitTimeout,
    ReplayClient,
    RetryPolicy,
)

FIELDS = {"x": {"shape": [], "dtype": "int64"}}


@pytest.fixture(scope="module")
def servers(server: Any, live_server: Any) -> list[Any]:
    return [server, live_server()]


def rows(start: int, n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


def create(client: ReplayClient, **extra: Any) -> str:
    name = unique("sh")
    spec = {"name": name, "capacity": 4096, "backend": {"kind": "memory"}, "fields": FIELDS}
    client.create_table({**spec, **extra})
    return name


def test_inserts_round_robin_and_samples_by_size(servers: list[Any]) -> None:
    client = ReplayClient([s.url for s in servers], shard_refresh=0.0)
    singles = [ReplayClient(s.url) for s in servers]
    name = create(client)
    assert client.info(name)["capacity"] == 2 * 4096
    # 6 inserts alternate between the servers: 3 x 100 rows on one, 3 x 300 on the other
    for k in range(6):
        n = 100 if k % 2 == 0 else 300
        index = client.extend(name, rows(k * 1000, n))
        assert (index % 2 == k % 2).all()  # the server is encoded in the index
    assert [s.info(name)["size"] for s in singles] == [300, 900]
    info = client.info(name)
    assert info["size"] == 1200 and [i["size"] for i in info["shards"]] == [300, 900]
    batch = client.sample(name, 4000)
    server = batch["index"] % 2
    share = server.float().mean().item()
    assert 0.70 < share < 0.80  # 900 / 1200
    # every row is the row that was inserted at that slot of that server
    for s in (0, 1):
        slots = batch["index"][server == s] // 2
        got = batch["x"][server == s]
        direct = singles[s].sample(name, 2000)
        table = dict(zip(direct["index"].tolist(), direct["x"].tolist(), strict=True))
        for slot, x in zip(slots.tolist(), got.tolist(), strict=True):
            if slot in table:
                assert table[slot] == x


def test_priorities_go_to_their_server(servers: list[Any]) -> None:
    client = ReplayClient([s.url for s in servers], shard_refresh=0.0)
    name = create(client, sampler={"kind": "prioritized", "alpha": 1.0})
    a = client.extend(name, rows(0, 8))
    b = client.extend(name, rows(100, 8))
    priority = torch.full((16,), 1e-6)
    target = torch.cat([a, b])
    priority[3] = priority[12] = 1e6
    client.update_priority(name, target, priority)
    batch = client.sample(name, 512)
    hits = set(batch["index"].tolist())
    assert {int(target[3]), int(target[12])} <= hits
    top = (batch["index"] == target[3]) | (batch["index"] == target[12])
    assert top.float().mean() > 0.95


def test_keys_go_with_their_indices(servers: list[Any]) -> None:
    client = ReplayClient([s.url for s in servers], shard_refresh=0.0)
    name = create(client, capacity=32, sampler={"kind": "prioritized", "alpha": 1.0})
    client.extend(name, rows(0, 32))
    client.extend(name, rows(100, 32))
    batch = client.sample(name, 32)  # at most 32 from either server: its capacity
    index, key = batch["index"], batch["sample_info", "key"]
    assert set((index % 2).tolist()) == {0, 1}
    # keys are per server: each server numbered its own 32 inserts 1..32
    assert torch.equal(key, batch["x"] % 100 + 1)
    assert client.update_priority(name, index, torch.full((32,), 3.0), key=key) == 32
    # server 0 is overwritten whole, server 1 only in slot 0 (the next inserts in turn)
    client.extend(name, rows(200, 32))
    assert client.extend(name, rows(300, 1)).tolist() == [0 * 2 + 1]
    stale = int(((index % 2 == 0) | (index // 2 == 0)).sum())
    assert client.update_priority(name, index, torch.full((32,), 4.0), key=key) == 32 - stale
    after = ReplayClient(servers[1].url).sample(name, 32)
    fresh = after["index"] == 0
    assert (after["sample_info", "priority"][fresh] == 3.0).all()  # new: the max seen at insert
    sampled = torch.isin(after["index"], index[index % 2 == 1] // 2)
    assert (after["sample_info", "priority"][~fresh & sampled] == 4.0).all()
    # async twin: the same routing, the same count
    import asyncio

    async def update() -> int:
        async with AsyncReplayClient([s.url for s in servers]) as aclient:
            return await aclient.update_priority(name, index, torch.ones(32), key=key)

    assert asyncio.run(update()) == 32 - stale


def test_async_sharded(servers: list[Any]) -> None:
    import asyncio

    sync = ReplayClient([s.url for s in servers])
    name = create(sync)

    async def main() -> None:
        client = AsyncReplayClient([s.url for s in servers], shard_refresh=0.0)
        for k in range(4):
            await client.extend(name, rows(k * 10, 10))
        info = await client.info(name)
        assert [i["size"] for i in info["shards"]] == [20, 20]
        batch = await client.sample(name, 64)
        assert set((batch["index"] % 2).tolist()) == {0, 1}
        await client.aclose()

    asyncio.run(main())
    paths = sync.checkpoint(name, f"checkpoints/ck/{name}")
    assert isinstance(paths, list) and len(paths) == 2
    sync.extend(name, rows(0, 5))
    assert sync.restore(name, f"checkpoints/ck/{name}")["size"] == 40


def test_from_statefulset_names_the_pods_in_order(tmp_path: Any) -> None:
    import pickle

    ns = tmp_path / "namespace"
    ns.write_text("rl-team\n")
    client = ReplayClient.from_statefulset(
        "tdreplay", 3, namespace_file=ns, port=9000, token="t0ken"
    )
    assert client.urls == tuple(
        f"http://tdreplay-{i}.tdreplay.rl-team.svc.cluster.local:9000" for i in range(3)
    )
    assert client.settings.token == "t0ken"
    assert pickle.loads(pickle.dumps(client)).urls == client.urls
    outside = ReplayClient.from_statefulset(namespace_file=tmp_path / "absent")
    assert outside.urls == ("http://tdreplay-0.tdreplay.default.svc.cluster.local:8000",)
    aio = AsyncReplayClient.from_statefulset("replay", 2, namespace="a", service="hl")
    assert aio.urls[1] == "http://replay-1.hl.a.svc.cluster.local:8000"
    for bad in ({"replicas": 0}, {"name": "Bad_Name"}, {"port": 70000}, {"namespace": "a.b"}):
        with pytest.raises(ValueError):
            ReplayClient.from_statefulset(**{"namespace": "x", **bad})


def test_an_extend_whose_server_died_holding_it_goes_to_no_other(
    server: Any, live_server: Any
) -> None:
    """A sharded extend is held by its server's rate limiter when the server is killed: the
    request reached it. The client's retries of that call are then refused (nothing listens
    any more), but the call must still say it may have been sent and must not go to the
    other server (a real crash after the insert would have stored it twice)."""
    victim = live_server()
    urls = [victim.url, server.url]
    limiter = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 1.0}
    name = create(ReplayClient(urls), rate_limiter=limiter)
    direct = ReplayClient(victim.url)
    with pytest.raises(RateLimitTimeout):  # fill the victim until an insert waits
        for k in range(10):
            direct.extend(name, rows(k, 1), timeout=0.05)
    client = ReplayClient(urls, transport="http", retry=RetryPolicy(deadline=1.0))
    failed: list[BaseException] = []

    def write() -> None:
        try:
            client.extend(name, rows(1000, 1), timeout=30)  # the first extend: the victim's
        except BaseException as err:
            failed.append(err)

    writer = threading.Thread(target=write)
    writer.start()
    deadline = time.monotonic() + 10
    while direct.info(name)["waiting"]["insert"] == 0:  # the request is in the server
        assert time.monotonic() < deadline, "the extend never reached its server"
        time.sleep(0.05)
    victim.proc.send_signal(signal.SIGKILL)
    victim.proc.wait(10)
    writer.join(30)
    assert len(failed) == 1 and isinstance(failed[0], ConnectionFailed), failed
    assert failed[0].sent, failed[0]
    assert ReplayClient(server.url).info(name)["size"] == 0, "the extend went to another server"


def test_a_sharded_extend_keeps_the_minus_one_of_a_row_a_max_value_table_dropped(
    servers: list[Any],
) -> None:
    # the server answers each row's slot, -1 for a dropped row: the client encodes the
    # server in the slots, never in the -1 (-1 * 2 + 1 would name slot 0 of server 1)
    client = ReplayClient([s.url for s in servers], shard_refresh=0.0)
    name = create(client, capacity=4, writer={"kind": "max_value", "key": "x"})
    for k in range(2):  # both servers full: values 100.. and 200..
        client.extend(name, rows(100 * (k + 1), 4))
    for _ in range(2):  # one extend to each server
        index = client.extend(name, rows(0, 3))  # below every minimum: all dropped
        assert index.tolist() == [-1, -1, -1]
    index = client.extend(name, rows(1000, 2))  # above: both kept, the server encoded
    assert (index >= 0).all() and len(set((index % 2).tolist())) == 1
    got = client.read(name, index.tolist())
    assert got["x"].tolist() == [1000, 1001]


def test_a_down_servers_turn_is_shared_by_the_others(servers: list[Any]) -> None:
    """With one of three servers down, its turn of extends went to the server after it in
    the ring every time: 2 of 3 extends on one server (700 / 300 rows of 1,000), which then
    filled and evicted at twice the other's rate. Now the servers that are up take turns."""
    urls = [servers[0].url, servers[1].url, f"http://127.0.0.1:{free_port()}"]  # none there
    name = create(ReplayClient(urls[:2]))
    client = ReplayClient(urls, transport="http", shard_refresh=60.0, connect_timeout=1.0)
    for k in range(10):
        client.extend(name, rows(k * 100, 100))
    assert [ReplayClient(u).info(name)["size"] for u in urls[:2]] == [500, 500]
    assert client.info(name)["size"] == 1000
