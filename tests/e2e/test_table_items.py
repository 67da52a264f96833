"""A table's items as a whole and one by one, against real servers: emptying it (clear),
reading items by slot (read), removing sampled items (remove)."""

from __future__ import annotations

import signal
import threading
from typing import Any

import pytest
import torch
from test_shm import spec
from test_shm_attacks import raw, read
from testkit import rows

from tdreplay.client import InvalidRequest, ReplayClient, ServerError, TableNotFound
from tdreplay.codec.shm import frame


@pytest.mark.parametrize("backend", ["memmap", "memory"])
def test_clear_empties_the_table_and_keeps_its_schema(live_server: Any, backend: str) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    created = client.create_table(
        {**spec("c", {"kind": "prioritized"}, capacity=32), "backend": {"kind": backend}}
    )
    client.extend("c", rows(0, 20))
    client.sample("c", 4)
    info = client.clear("c")
    assert info["size"] == info["inserts"] == info["samples"] == 0
    assert info["fields"] == created["fields"] and info["sampler"]["kind"] == "prioritized"
    assert client.extend("c", rows(100, 3)).tolist() == [0, 1, 2]  # a fresh ring
    assert set(client.sample("c", 8)["id"].tolist()) <= {100, 101, 102}
    with pytest.raises(TableNotFound):
        client.clear("nope")


def test_clears_at_once_each_empty_the_table(live_server: Any) -> None:
    """Two learners clearing one table at once: each clear waits for the one under way
    (a second used to be a 409 TableExists, 'table already exists')."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(
        {**spec("m", {"kind": "uniform"}, capacity=4096), "backend": {"kind": "memmap"}}
    )
    client.extend("m", rows(0, 20))
    answers: list[Any] = []

    def clear() -> None:
        try:
            answers.append(ReplayClient(server.url, transport="http").clear("m")["size"])
        except BaseException as err:
            answers.append(err)

    threads = [threading.Thread(target=clear) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert answers == [0] * 6
    assert client.info("m")["size"] == 0


def test_a_call_waiting_on_a_cleared_table_ends_with_a_clear_answer(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(
        {**spec("w", {"kind": "uniform"}, capacity=64), "rate_limiter": {"min_size_to_sample": 50}}
    )
    client.extend("w", rows(0, 10))
    got: list[BaseException] = []

    def wait() -> None:
        try:
            ReplayClient(server.url, transport="http").sample("w", 4, timeout=30)
        except BaseException as err:
            got.append(err)

    waiter = threading.Thread(target=wait)
    waiter.start()
    for _ in range(200):  # until the server counts it as waiting
        if client.info("w")["waiting"].get("sample"):
            break
        threading.Event().wait(0.02)
    client.clear("w")
    waiter.join(10)
    assert not waiter.is_alive()
    assert len(got) == 1 and isinstance(got[0], ServerError)
    assert got[0].type == "TableClosed" and got[0].status == 409
    assert "cleared while a call waited" in str(got[0])


def test_a_kill_right_after_clear_leaves_the_table_empty(live_server: Any) -> None:
    """The new, empty state is complete on disk before the clear answers; a restart reopens
    the newest complete state, so the old rows never come back."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("k", {"kind": "uniform"}, capacity=64, backend={"kind": "memmap"}))
    client.extend("k", rows(0, 40))
    client.clear("k")
    client.extend("k", rows(200, 5))
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait(10)
    again = live_server(root=server.root)
    back = ReplayClient(again.url, transport="http")
    assert back.info("k")["size"] == 5
    assert set(back.sample("k", 16)["id"].tolist()) <= set(range(200, 205))
    folders = sorted(p.name for p in (server.root / "tables" / "k").iterdir() if p.is_dir())
    assert len([f for f in folders if f.startswith("storage")]) == 1  # the old rows are gone


def test_clear_through_the_shared_memory_socket(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("s", {"kind": "uniform"}, capacity=16))
    client.extend("s", rows(0, 16))
    with raw(server) as s:
        s.sendall(frame({"op": "clear", "table": "s"}))
        reply = read(s)
        assert reply["ok"] is True and reply["info"]["size"] == 0
        s.sendall(frame({"op": "clear", "table": "nope"}))
        assert read(s)["error"]["type"] == "TableNotFound"
    assert client.info("s")["size"] == 0


def test_read_gives_the_items_in_slots_as_stored(live_server: Any) -> None:
    """``read`` returns the items a sample's ``index`` names, bit for bit and in the order
    asked, counts nothing as sampled, and names a slot that holds no item; sharded, the
    server encoded in the index is the one asked."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("r", {"kind": "uniform"}, capacity=32))
    client.extend("r", rows(0, 20))
    got = client.read("r", [5, 0, 5, 19])
    assert got["id"].tolist() == [5, 0, 5, 19] and got["index"].tolist() == [5, 0, 5, 19]
    assert torch.equal(got["observation"], rows(0, 20)["observation"][[5, 0, 5, 19]])
    assert client.info("r")["samples"] == 0
    assert client.read("r", []).batch_size == (0,)
    for bad in ([20], [31], [32], [-1]):
        with pytest.raises(InvalidRequest) as err:
            client.read("r", bad)
        assert (err.value.field or "").startswith("index")  # index, or index.0 from the model
    second = live_server()
    sharded = ReplayClient([server.url, second.url], transport="http")
    ReplayClient(second.url).create_table(spec("r", {"kind": "uniform"}, capacity=32))
    ReplayClient(second.url).extend("r", rows(100, 10))
    batch = sharded.sample("r", 16)
    again = sharded.read("r", batch["index"])
    assert torch.equal(again["id"], batch["id"]) and torch.equal(again["index"], batch["index"])


def test_remove_takes_sampled_items_out_unless_overwritten(live_server: Any) -> None:
    """Reverb's deletes: a removed item is never sampled again; with the sample's keys, a
    slot overwritten since keeps its new item; sharded, each server removes its own."""
    server = live_server()
    client = ReplayClient(server.url, transport="http")
    client.create_table(spec("rm", {"kind": "uniform"}, capacity=8))
    client.extend("rm", rows(0, 8))
    batch = client.read("rm", [1, 2, 3])
    first = 2  # slot 1's item's key: the second item inserted (keys are ordinals)
    client.extend("rm", rows(8, 2))  # overwrites slots 0 and 1
    assert client.remove("rm", [1], key=[first]) == 0  # slot 1 holds another item now
    assert client.remove("rm", batch["index"][1:]) == 2  # slots 2 and 3
    assert client.remove("rm", [2, 2, 3]) == 0  # already gone: skipped
    info = client.info("rm")
    assert info["size"] == 6
    seen = {i for _ in range(40) for i in client.sample("rm", 6)["id"].tolist()}
    assert seen.isdisjoint({2, 3}) and {8, 9} <= seen
    with pytest.raises(InvalidRequest, match="index 8 outside"):
        client.remove("rm", [0, 8])
    with pytest.raises(ValueError, match="1 indices but 2 keys"):
        client.remove("rm", [0], key=[1, 2])
    status, _, body = server.request(
        "POST", "/v1/tables/rm/remove", b'{"index": [0], "key": [1, 2]}',
        {"Content-Type": "application/json"},
    )  # fmt: skip
    assert status == 400 and b"1 indices but 2 keys" in body  # the server's own check
    assert client.info("rm")["size"] == 6  # nothing changed
    second = live_server()
    ReplayClient(second.url).create_table(spec("rm", {"kind": "uniform"}, capacity=8))
    ReplayClient(second.url).extend("rm", rows(100, 8))
    sharded = ReplayClient([server.url, second.url], transport="http")
    drawn = sharded.sample("rm", 8)  # at most a server's capacity: the split may give one all
    doomed = torch.unique(drawn["index"])
    assert sharded.remove("rm", doomed) == len(doomed)
    assert sharded.info("rm")["size"] == 14 - len(doomed)


def test_a_sharded_sample_larger_than_a_servers_capacity_is_drawn_in_rounds(
    live_server: Any,
) -> None:
    """The split by sizes may give one server more than its capacity; its share is capped
    there and the rest drawn again, so the sample never fails for it."""
    servers = [live_server(), live_server()]
    for k, server in enumerate(servers):
        one = ReplayClient(server.url, transport="http")
        one.create_table(spec("cap", {"kind": "uniform"}, capacity=8))
        one.extend("cap", rows(100 * k, 8))
    sharded = ReplayClient([s.url for s in servers], transport="http")
    for _ in range(20):  # a split giving one server > 8 of 14 happens in most tries
        batch = sharded.sample("cap", 14)
        assert batch.batch_size == (14,)
        assert set(batch["id"].tolist()) <= {*range(8), *range(100, 108)}
