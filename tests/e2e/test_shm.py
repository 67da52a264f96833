"""The same-host transport end to end: real servers, real client processes, real memfds."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import FIELDS, REPO, assert_consistent, rows

from tdreplay.client import ReplayClient, ServerError
from tdreplay.client.shm import ShmUnavailable
from tdreplay.codec.shm import HEADER, VERSION, extend_frame, frame, parse_frame, sample_frame

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")

SAMPLERS: dict[str, dict[str, Any]] = {
    "uniform": {"kind": "uniform"},
    "prioritized": {"kind": "prioritized", "alpha": 0.7, "beta": 0.5},
    "fifo": {"kind": "fifo"},
    "lifo": {"kind": "lifo"},
    "without_replacement": {"kind": "without_replacement"},
    "slice": {"kind": "slice", "slice_len": 4, "end_key": "next.done"},
}


def spec(name: str, sampler: dict[str, Any], capacity: int = 256, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "capacity": capacity,
        "fields": dict(FIELDS),
        "backend": {"kind": "memory"},
        "sampler": sampler,
        **extra,
    }


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def twins(live_server: Any) -> tuple[Any, Any]:
    """Two servers with the same seed: one read over shared memory, one over HTTP."""
    return live_server(seed=7), live_server(seed=7)


def test_shm_and_http_give_the_same_batches_for_every_sampler(twins: Any) -> None:
    a, b = twins
    shm, http = ReplayClient(a.url, transport="shm"), ReplayClient(b.url, transport="http")
    assert (shm.transport, http.transport) == ("shm", "http")
    for kind, sampler in SAMPLERS.items():
        for client in (shm, http):
            client.create_table(spec(kind, sampler))
            client.extend(kind, rows(0, 40))
            client.extend(kind, rows(40, 40))
        for _ in range(3):
            x, y = shm.sample(kind, 8).clone(), http.sample(kind, 8)
            assert x.keys(True, True) and set(x.keys(True, True)) == set(y.keys(True, True))
            for key in y.keys(True, True):
                assert torch.equal(x[key], y[key]), (kind, key)
            assert_consistent(x)
            if kind == "prioritized":  # updates through shm act as over HTTP
                new = torch.linspace(0.5, 4.0, 8)
                assert shm.update_priority(kind, x["index"], new, key=x["sample_info", "key"]) == 8
                assert http.update_priority(kind, y["index"], new, key=y["sample_info", "key"]) == 8
        assert shm.info(kind)["samples"] == http.info(kind)["samples"] == 24
        assert shm.info(kind)["inserts"] == 80


def test_tensorclass_views_and_errors_as_over_http(twins: Any) -> None:
    a, _ = twins
    client = ReplayClient(a.url, transport="shm")
    client.create_table(spec("tc", {"kind": "uniform"}, capacity=64))
    client.extend("tc", rows(0, 16))
    info = client.info("tc")
    cls = client._tensorclass("tc", info)
    batch = client.sample("tc", 4, as_cls=cls)
    assert type(batch) is cls and batch.id.shape == (4,)
    with pytest.raises(ServerError) as bad:  # a wrong dtype: the server's SchemaError, as HTTP's
        client.extend("tc", rows(0, 2).apply(lambda t: t.double() if t.dtype == torch.int64 else t))
    assert bad.value.type == "SchemaError" and bad.value.field == "id"
    with pytest.raises(ServerError) as bad:
        client.sample("tc", 65)
    assert bad.value.type == "InvalidRequest" and bad.value.field == "batch_size"
    with pytest.raises(ServerError) as bad:
        client.sample("missing", 1)
    assert bad.value.type == "TableNotFound"
    assert client.info("tc")["size"] == 16


def test_a_retried_extend_inserts_once(twins: Any) -> None:
    a, _ = twins
    client = ReplayClient(a.url, transport="shm")
    client.create_table(spec("idem", {"kind": "uniform"}, capacity=64))
    chan = client._driver.link(0).channel()
    first = chan.extend("idem", rows(0, 5), 5.0, "retry-1")
    again = chan.extend("idem", rows(0, 5), 5.0, "retry-1")
    assert first is not None and again is not None and first.tolist() == again.tolist()
    assert client.info("idem")["inserts"] == 5


def test_a_leased_batch_does_not_change_while_writers_overwrite_the_ring(twins: Any) -> None:
    a, _ = twins
    learner = ReplayClient(a.url, transport="shm")
    writer = ReplayClient(a.url, transport="shm")
    learner.create_table(spec("ring", {"kind": "uniform"}, capacity=32))
    writer.extend("ring", rows(0, 32))
    batch = learner.sample("ring", 16)
    kept = batch.clone()
    for start in range(32, 32 * 20, 32):  # overwrite every slot of the table many times
        writer.extend("ring", rows(start, 32))
    assert (batch == kept).all()  # the learner's lease: nothing wrote into its slot
    assert_consistent(batch)
    learner.sample("ring", 16)  # the other slot of the ring
    assert (batch == kept).all()
    learner.sample("ring", 16)  # back to the first: now it is refilled
    assert not torch.equal(batch["id"], kept["id"])


def test_an_owned_sample_keeps_its_rows_past_the_lease(twins: Any) -> None:
    """``sample(..., owned=True)`` copies the slot once into the batch's own memory: the
    samples after it, which refill every slot of the ring, leave it as it was."""
    a, _ = twins
    client = ReplayClient(a.url, transport="shm", lease_slots=1)
    client.create_table(spec("own", {"kind": "uniform"}, capacity=64))
    client.extend("own", rows(0, 64))
    owned = client.sample("own", 16, owned=True)
    leased = client.sample("own", 16)
    kept, first_lease = owned.clone(), leased["id"].clone()
    assert_consistent(owned)
    refilled = False
    for _ in range(20):
        client.sample("own", 16)  # the one leased slot, refilled each time
        refilled = refilled or not torch.equal(leased["id"], first_lease)
    assert refilled  # the leased batch views the slot; the owned one does not
    assert (owned == kept).all()


def test_the_client_cannot_shrink_a_slot_under_the_server(twins: Any) -> None:
    a, _ = twins
    client = ReplayClient(a.url, transport="shm")
    client.create_table(spec("seal", {"kind": "uniform"}, capacity=16))
    client.extend("seal", rows(0, 16))
    chan = client._driver.link(0).channel()
    _, fd = chan.call(sample_frame("seal", slot=60, batch_size=4, timeout=1), wait=1)
    assert fd >= 0
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
    assert client.sample("seal", 4)["id"].shape == (4,)  # the server is fine


KILLED_CLIENT = """
import sys
from tdreplay.client import ReplayClient
client = ReplayClient(sys.argv[1], transport="shm")
assert client.transport == "shm"
client.sample("starved", 1, timeout=60)   # held back: min_size_to_sample 200, no rows
"""


def test_a_client_killed_mid_call_costs_the_server_nothing(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="shm")
    client.create_table(
        spec("starved", {"kind": "uniform"}, rate_limiter={"min_size_to_sample": 200})
    )
    client.create_table(spec("fine", {"kind": "uniform"}, capacity=64))
    client.extend("fine", rows(0, 8))
    client.sample("fine", 4)
    before = fd_count(server.proc.pid)
    procs = [
        subprocess.Popen([sys.executable, "-c", KILLED_CLIENT, server.url], cwd=REPO)
        for _ in range(3)
    ]
    wait_until(lambda: client.info("starved")["waiting"]["sample"] == 3)
    for p in procs:
        p.send_signal(signal.SIGKILL)
        p.wait()
    wait_until(lambda: client.info("starved")["waiting"]["sample"] == 0)
    wait_until(lambda: fd_count(server.proc.pid) <= before)
    assert client.sample("fine", 4)["id"].shape == (4,)
    assert server.proc.poll() is None


def test_garbage_on_the_socket_ends_only_that_connection(live_server: Any) -> None:
    server = live_server()
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("g", {"kind": "uniform"}, capacity=16))
    client.extend("g", rows(0, 16))
    path = str(server.root / "run" / "tdreplay.sock")
    for junk in [
        b"\xff\xff\xff\xff",
        HEADER.pack(3) + b"{{{",
        HEADER.pack(4) + b"[1 ]",
        b"\x00" * 4,
    ]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            data = s.recv(65536)
            if data:  # an error frame, then the end
                assert parse_frame(data[HEADER.size :])["ok"] is False
            assert s.recv(10) == b""
    assert client.sample("g", 8)["id"].shape == (8,)


def test_the_token_guards_the_socket(live_server: Any) -> None:
    server = live_server(token="shm-t0ken-for-tests")
    path = str(server.root / "run" / "tdreplay.sock")
    for token in ("", "wrong", "shm-t0ken-for-test"):
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(path)
            s.sendall(frame({"op": "hello", "version": VERSION, "token": token}))
            data = s.recv(65536)
            reply = parse_frame(data[HEADER.size :])
            assert reply["ok"] is False and reply["error"]["type"] == "Unauthorized"
            assert s.recv(10) == b""
    good = ReplayClient(server.url, token="shm-t0ken-for-tests", transport="shm")
    good.create_table(spec("guarded", {"kind": "uniform"}, capacity=8))
    good.extend("guarded", rows(0, 8))
    assert good.sample("guarded", 2)["id"].shape == (2,)
    assert oct(os.stat(server.root / "run").st_mode & 0o777) == "0o700"


def test_without_the_socket_auto_falls_back_and_shm_says_why(live_server: Any) -> None:
    server = live_server("--no-shm")
    auto = ReplayClient(server.url)
    assert auto.transport == "http"
    auto.create_table(spec("h", {"kind": "uniform"}, capacity=8))
    auto.extend("h", rows(0, 8))
    assert auto.sample("h", 2)["id"].shape == (2,)
    with pytest.raises(ShmUnavailable, match="no shared-memory socket"):
        ReplayClient(server.url, transport="shm").sample("h", 2)
    with pytest.raises(ValueError, match="transport must be one of"):
        ReplayClient(server.url, transport="pigeon")


def test_a_connection_is_bounded_in_bytes(live_server: Any) -> None:
    server = live_server(shm_connection_bytes=4096)
    client = ReplayClient(server.url, transport="shm")
    client.create_table(spec("big", {"kind": "uniform"}, capacity=512))
    with pytest.raises(ServerError) as err:  # a 512-row extend slot is over the bound too
        client.extend("big", rows(0, 512))
    assert err.value.type == "InsufficientStorage"
    auto = ReplayClient(server.url)  # "auto" sends what does not fit over HTTP
    assert auto.extend("big", rows(0, 512)).tolist() == list(range(512))
    assert auto.sample("big", 256)["id"].shape == (256,)
    assert client.sample("big", 8)["id"].shape == (8,)  # a few hundred bytes: fine
    with pytest.raises(ServerError) as err:
        client.sample("big", 256)  # ~13 KB of slot: over the connection's 4096 bytes
    assert err.value.type == "InsufficientStorage" and "--shm-connection-bytes" in err.value.detail
    assert client.info("big")["samples"] == 8 + 256  # the refused sample drew nothing


def test_the_loader_over_shm_owns_its_batches(twins: Any) -> None:
    a, _ = twins
    client = ReplayClient(a.url, transport="shm")
    client.create_table(spec("loader", {"kind": "uniform"}, capacity=128))
    client.extend("loader", rows(0, 128))
    batches = list(client.loader("loader", 16, prefetch=2, num_batches=6, keep=True))
    assert len({b["id"].untyped_storage().data_ptr() for b in batches}) == 6
    for b in batches:
        assert_consistent(b)


def test_extend_through_shm_is_exactly_what_was_sent(twins: Any) -> None:
    a, _ = twins
    client = ReplayClient(a.url, transport="shm")
    client.create_table(spec("exact", {"kind": "fifo"}, capacity=128))
    data = rows(0, 100)
    assert client.extend("exact", data).tolist() == list(range(100))
    out = client.sample("exact", 100)
    for key in data.keys(True, True):
        assert torch.equal(out[key], data[key]), key
    assert isinstance(out, TensorDict)


def test_an_extend_of_millions_of_rows_is_inserted_once(live_server: Any) -> None:
    """The answer to an extend names each row's slot (8 bytes a row): past 8,388,608 rows
    it is over the 64 MiB a control frame may have. The client read it with that limit:
    over "shm" the call failed after the rows were in, and "auto" sent them again over
    HTTP (twice the inserts)."""
    n = (64 << 20) // 8 + 1000
    server = live_server()
    http = ReplayClient(server.url, transport="http")
    fields = {"x": {"shape": [], "dtype": "int8"}}
    data = TensorDict({"x": torch.ones(n, dtype=torch.int8)}, [n])
    for transport in ("shm", "auto"):
        name = f"long_{transport}"
        http.create_table({"name": name, "capacity": n, "fields": fields,
                           "backend": {"kind": "memory"}})  # fmt: skip
        client = ReplayClient(server.url, transport=transport)
        index = client.extend(name, data)
        assert client.transport == "shm"
        assert torch.equal(index, torch.arange(n)), transport
        assert http.info(name)["inserts"] == n, transport
        http.delete_table(name)
        client.close()


def test_a_long_answer_does_not_hold_up_the_server(live_server: Any) -> None:
    """The answer to an extend of 16M rows is 128 MB (the slot of each row). The server
    sent it copying what was left of it for every send the socket took (~200 KB): about
    40 GB of copies with the event loop held, every HTTP and socket client waiting 12 s."""
    n = 1 << 24
    server = live_server()
    http = ReplayClient(server.url, transport="http")
    http.create_table({"name": "long", "capacity": n, "fields": {"x": {"shape": [], "dtype": "int8"}},
                       "backend": {"kind": "memory"}})  # fmt: skip
    client = ReplayClient(server.url, transport="shm")
    data = TensorDict({"x": torch.ones(n, dtype=torch.int8)}, [n])
    client.extend("long", data[:8])
    waits: list[float] = []
    done = threading.Event()

    def health() -> None:
        while not done.is_set():
            began = time.monotonic()
            assert server.request("GET", "/healthz")[0] == 200
            waits.append(time.monotonic() - began)
            time.sleep(0.01)

    checker = threading.Thread(target=health)
    checker.start()
    try:
        assert len(client.extend("long", data)) == n and client.transport == "shm"
    finally:
        done.set()
        checker.join()
    assert max(waits) < 5.0, max(waits)


def test_the_async_twin_uses_shared_memory_and_owns_its_batches(twins: Any) -> None:
    import asyncio

    from tdreplay.client import AsyncReplayClient

    a, _ = twins

    async def main() -> None:
        async with AsyncReplayClient(a.url, transport="shm") as client:
            assert await client.transport() == "shm"
            await client.create_table(spec("async", {"kind": "uniform"}, capacity=64))
            assert (await client.extend("async", rows(0, 32))).tolist() == list(range(32))
            batches = [await client.sample("async", 8) for _ in range(4)]
            assert len({b["id"].untyped_storage().data_ptr() for b in batches}) == 4
            for b in batches:
                assert_consistent(b)
            info = await client.info("async")
            assert info["samples"] == 32 and info["inserts"] == 32

    asyncio.run(main())


def test_a_value_outside_its_categories_is_refused_through_either_door(twins: Any) -> None:
    """A field declaring ``n`` categories (several elements an item, which the server copies
    out of the client's slot before checking) refuses a value outside ``0 .. n-1`` over
    shared memory as over HTTP: the same error, nothing written."""
    a, _ = twins
    fields = {**FIELDS, "choice": {"shape": [3], "dtype": "int64", "n": 4}}
    shm, http = ReplayClient(a.url, transport="shm"), ReplayClient(a.url, transport="http")
    shm.create_table({**spec("cats", {"kind": "uniform"}, capacity=64), "fields": fields})

    def data(start: int, bad: int | None = None) -> TensorDict:
        td = rows(start, 4)
        td["choice"] = (torch.arange(12) % 4).reshape(4, 3)
        if bad is not None:
            td["choice"][2, 1] = bad
        return td

    assert shm.extend("cats", data(0)).tolist() == [0, 1, 2, 3]
    for client in (shm, http):
        for bad in (4, -1):
            with pytest.raises(ServerError) as info:
                client.extend("cats", data(4, bad))
            assert (info.value.type, info.value.field) == ("InvalidRequest", "choice")
            assert f"holds {bad}, outside its 4 categories 0 .. 3" in str(info.value)
    assert shm.info("cats")["size"] == 4
    assert torch.equal(shm.sample("cats", 8)["choice"].max(), torch.tensor(3))


RACED = {
    # (a field or writer the table checks values of, the column raced, a refused value)
    "categories": (
        {"fields": {**FIELDS, "choice": {"shape": [3], "dtype": "int64", "n": 4}}},
        ("choice",),
        99,
    ),
    "max-value key": (
        {"writer": {"kind": "max_value", "key": "next.reward"}},
        ("next", "reward"),
        float("nan"),
    ),
}


@pytest.mark.parametrize("case", list(RACED))
def test_a_client_writing_its_slot_during_an_extend_gets_nothing_past_the_checks(
    twins: Any, case: str
) -> None:
    """The client can write into its extend slot while the server works on it: a thread
    flips a checked column between a good value and a refused one while extends of that
    slot run. Each extend is refused or stores the good value, never the refused one (the
    server checks, and inserts, its own copy of the columns the table reads values of)."""
    a, _ = twins
    extra, key, bad = RACED[case]
    name = f"raced-{case.replace(' ', '-')}"
    client = ReplayClient(a.url, transport="shm")
    client.create_table({**spec(name, {"kind": "uniform"}, capacity=4096), **extra})
    n = 64
    data = rows(0, n)
    if "choice" in key:
        data["choice"] = torch.zeros(n, 3, dtype=torch.int64)
    chan = client._driver.link(0).channel()
    assert chan.extend(name, data, 1, "first") is not None  # maps the slot, fills it
    (number,) = chan._numbers[("extend", name)]
    column = chan._slots[number].views.columns[key][:n]
    stop = threading.Event()

    def flip() -> None:
        while not stop.is_set():
            column.fill_(bad)
            column.fill_(0)

    racer = threading.Thread(target=flip, daemon=True)
    racer.start()
    try:
        for i in range(150):
            message = extend_frame(name, slot=number, rows=n, timeout=1, request_id=f"r{i}")
            try:
                chan.call(message, wait=1)
            except ServerError as err:
                assert err.type == "InvalidRequest" and err.field == ".".join(key), err
    finally:
        stop.set()
        racer.join(10)
    size = client.info(name)["size"]  # fewer than 4096 when many extends were refused
    values = client.read(name, torch.arange(size)).get(key)  # filled from slot 0, in order
    if isinstance(bad, float):
        assert not values.isnan().any()
    else:
        assert values.max() == 0
