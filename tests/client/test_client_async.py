"""The async twin against a real server: the same calls, awaited."""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import make_rows, schema_fields, unique

from tdreplay.client import AsyncReplayClient, RateLimitTimeout, SchemaError, TableNotFound


async def x_table(client: AsyncReplayClient, prefix: str) -> str:
    """A new table of one int64 field ``x`` (capacity 64, in memory); its name."""
    name = unique(prefix)
    await client.create_table(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"},
         "fields": {"x": {"shape": [], "dtype": "int64"}}}
    )  # fmt: skip
    return name


def test_async_twin(server: Any) -> None:
    fields = schema_fields("robot")

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            name = unique("a")
            info = await client.create_table(
                {
                    "name": name,
                    "capacity": 32,
                    "backend": {"kind": "memory"},
                    "fields": fields,
                    "sampler": {"kind": "prioritized"},
                }
            )
            assert info["capacity"] == 32
            data = make_rows(fields, 20, seed=3)
            index = await client.extend(name, data)
            assert index.tolist() == list(range(20))
            # several calls at once share the pool
            batches = await asyncio.gather(*(client.sample(name, 16) for _ in range(4)))
            for batch in batches:
                want = data[batch["index"]]
                for key in want.keys(True, True):
                    assert torch.equal(batch[key], want[key]), key
            Cls = await client.tensorclass(name)
            view = await client.sample(name, 4, as_cls=Cls)
            assert type(view) is Cls and view.observation.wrist_rgb.dtype == torch.uint8
            await client.update_priority(name, index[:3], torch.ones(3))
            assert (await client.info(name))["size"] == 20
            with pytest.raises(SchemaError):
                await client.extend(name, data.exclude("action"))
            assert isinstance(await client.checkpoint(name, f"checkpoints/ck/{name}"), str)
            assert (await client.export(name, "csv")).startswith(b"")
            assert name in [t["name"] for t in await client.tables()]
            await client.delete_table(name)

    asyncio.run(main())


def test_async_writer_and_loader(server: Any) -> None:
    fields = {"x": {"shape": [], "dtype": "int64"}}

    async def main() -> None:
        client = AsyncReplayClient(server.url)
        name = unique("aw")
        await client.create_table(
            {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": fields}
        )
        async with client.writer(name, chunk=4, max_delay=None) as w:
            for i in range(10):
                await w.append(TensorDict({"x": torch.tensor(i)}, []))
        assert w.sent_rows == 10 and w.sent_chunks == 3
        seen = []
        async for batch in client.loader(name, 8, prefetch=2, num_batches=4):
            seen.append(batch["x"].clone())
        assert len(seen) == 4 and all(b.shape == (8,) for b in seen)
        assert set(torch.cat(seen).tolist()) <= set(range(10))
        timed = client.writer(name, chunk=100, max_delay=0.05)
        await timed.append(TensorDict({"x": torch.arange(3)}, [3]))
        assert await timed.wait_sent(3, timeout=10)  # sent by the timer task
        await timed.aclose()
        empty = unique("ae")
        await client.create_table(
            {
                "name": empty,
                "capacity": 8,
                "backend": {"kind": "memory"},
                "fields": fields,
                "rate_limiter": {"min_size_to_sample": 4},
            }
        )
        with pytest.raises(RateLimitTimeout):
            await client.sample(empty, 2, timeout=0.05)
        await client.aclose()

    asyncio.run(main())


def test_async_writer_first_appends_at_once_all_arrive(server: Any) -> None:
    """Appends gathered on a new writer all await its first ``info``: every step is sent
    (each made its own buffer, and only the last one made was kept)."""

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            name = await x_table(client, "ag")
            async with client.writer(name, chunk=8, max_delay=0.05) as w:
                await asyncio.gather(
                    *(w.append(TensorDict({"x": torch.tensor(i)}, [])) for i in range(4))
                )
            assert w.sent_rows == 4
            got = await client.read(name, torch.arange(4))
            assert sorted(got["x"].tolist()) == [0, 1, 2, 3]

    asyncio.run(main())


def test_async_append_that_meets_aclose_is_sent_or_refused(server: Any) -> None:
    """An append waiting for the writer's first ``info`` while the writer closes raises;
    it does not return with its step kept nowhere."""

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            name = await x_table(client, "ac")
            w = client.writer(name, chunk=8, max_delay=None)
            append = asyncio.ensure_future(w.append(TensorDict({"x": torch.tensor(0)}, [])))
            await asyncio.sleep(0)  # the append awaits the table's info
            await w.aclose()
            with pytest.raises(RuntimeError, match="closed"):
                await append
            assert (await client.info(name))["size"] == 0

    asyncio.run(main())


def test_async_wait_sent_raises_the_time_limits_failed_send(server: Any) -> None:
    """The timer task's send fails (the table was deleted): ``wait_sent`` raises its error
    then, as the blocking writer's does (it waited out its timeout and said False)."""

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            name = await x_table(client, "at")
            w = client.writer(name, chunk=100, max_delay=0.3)
            await w.append(TensorDict({"x": torch.tensor(0)}, []))
            await client.delete_table(name)  # before the time limit sends the step
            loop = asyncio.get_running_loop()
            began = loop.time()
            with pytest.raises(TableNotFound):
                await w.wait_sent(1, timeout=15)
            assert loop.time() - began < 10
            await w.aclose(discard=True)

    asyncio.run(main())


def test_close_is_a_deprecated_alias_of_aclose(monkeypatch: pytest.MonkeyPatch) -> None:
    """``await x.close()`` still closes, warning once per class; ``aclose`` does not warn."""
    from tdreplay.client import deprecation
    from tdreplay.client.aio_transport import AsyncTransport

    monkeypatch.setattr(deprecation, "_WARNED_CLOSE", set())
    url = "http://127.0.0.1:9"  # nothing is sent: closing idle connections only

    async def main() -> None:
        client = AsyncReplayClient(url)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            await client.aclose()
            await client.writer("t").aclose()
            await AsyncTransport(url).aclose()
        for make in (lambda: client, lambda: client.writer("t"), lambda: AsyncTransport(url)):
            obj = make()
            with pytest.warns(DeprecationWarning, match=r"removed in the next release") as got:
                await obj.close()
                await make().close()  # the same class again: no second warning
            assert len(got) == 1 and type(obj).__name__ in str(got[0].message)
            assert got[0].filename == __file__  # points at the caller
        w = client.writer("t")
        await w.close(discard=True)  # the alias passes its arguments on
        assert w._closed

    asyncio.run(main())


def test_aclose_leaves_same_host_calls_in_flight_to_finish(server: Any) -> None:
    """``aclose`` with extends and samples in flight over shared memory: each ends as soon
    as over HTTP, with its answer (the channels they used were closed under them: some
    raised ``OSError: Bad file descriptor``, some waited out ``timeout + wait`` on a
    descriptor number reused meanwhile, then went over HTTP)."""
    fields = {"x": {"shape": [4], "dtype": "int64"}}

    async def timed(call: Any) -> float:
        began = time.monotonic()
        await call
        return time.monotonic() - began

    async def main() -> None:
        async with AsyncReplayClient(server.url, timeout=5, wait=5) as client:
            name = unique("acf")
            await client.create_table(
                {"name": name, "capacity": 4096, "backend": {"kind": "memory"}, "fields": fields}
            )
            await client.extend(name, TensorDict({"x": torch.zeros(4, 4, dtype=torch.int64)}, [4]))
            assert await client.transport() == "shm"
            for turn in range(10):
                rows = [
                    torch.arange(8 * 4).reshape(8, 4) + 1000 * (20 * turn + i) for i in range(20)
                ]
                extends = [client.extend(name, TensorDict({"x": r}, [8])) for r in rows]
                samples = [client.sample(name, 4) for _ in range(20)]
                tasks = [asyncio.ensure_future(c) for c in (*extends, *samples)]
                await asyncio.sleep(0.001 * (turn % 5))
                await client.aclose()
                took = await asyncio.gather(*(timed(t) for t in tasks))
                assert max(took) < 4, (turn, max(took))
                for r, task in zip(rows, tasks, strict=False):
                    assert torch.equal((await client.read(name, task.result()))["x"], r)
            size = (await client.info(name))["size"]
            assert size == 4 + 10 * 20 * 8  # each extend stored once

    asyncio.run(main())


def test_a_new_loop_resolves_the_same_host_link_again(live_server: Any) -> None:
    """A client used under ``asyncio.run`` twice, its server restarted between: the new
    loop's concurrent calls find the link again (the lock they waited on was the first
    loop's, where calls had met on it: "bound to a different event loop")."""
    fields = {"x": {"shape": [], "dtype": "int64"}}
    first = live_server()
    client = AsyncReplayClient(first.url, timeout=5)
    spec = {"name": "again", "capacity": 64, "backend": {"kind": "memory"}, "fields": fields}
    rows = [TensorDict({"x": torch.arange(4) + 10 * i}, [4]) for i in range(8)]

    async def use(alone: int) -> None:
        await client.create_table(spec, if_absent=True)
        # the first loop's first calls all wait for the link; the second loop's first call
        # finds the link gone (another server), and the next ones wait for it again
        slots = [await client.extend("again", r) for r in rows[:alone]]
        slots += await asyncio.gather(*(client.extend("again", r) for r in rows[alone:]))
        for r, s in zip(rows, slots, strict=True):
            assert torch.equal((await client.read("again", s))["x"], r["x"])
        assert await client.transport() == "shm"
        await client.aclose()

    asyncio.run(use(0))
    first.stop()
    live_server(port=first.port)  # another server where it was
    asyncio.run(use(1))


def test_aclose_under_a_later_loop(server: Any) -> None:
    """``asyncio.run(client.aclose())`` after the loop that used the client ended: its idle
    connections are that loop's, dropped (closing them asked the ended loop to, and
    raised RuntimeError: Event loop is closed); the client stays usable."""
    client = AsyncReplayClient(server.url, transport="http")
    name = unique("al")
    spec = {
        "name": name,
        "capacity": 8,
        "backend": {"kind": "memory"},
        "fields": {"x": {"shape": [], "dtype": "int64"}},
    }
    asyncio.run(client.create_table(spec))  # leaves an idle connection of that loop
    asyncio.run(client.aclose())

    async def again() -> None:
        async with client:
            assert (await client.info(name))["size"] == 0

    asyncio.run(again())


def test_a_cancelled_append_leaves_no_torn_rows_over_shm(server: Any) -> None:
    """An append cancelled while it sends a chunk over shared memory: the worker thread
    still copying that chunk's rows out of the writer's buffer finishes with them as they
    were (the next appends wrote the same rows of the buffer meanwhile: rows stored with
    one step's ``id`` and another's ``obs``)."""
    fields = {"id": {"shape": [], "dtype": "int64"}, "obs": {"shape": [4096], "dtype": "int64"}}

    def step(i: int) -> TensorDict:
        return TensorDict({"id": torch.tensor(i), "obs": torch.full((4096,), i)}, [])

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            name = unique("atr")
            spec = {"name": name, "capacity": 4096, "backend": {"kind": "memory"}}
            await client.create_table({**spec, "fields": fields})
            assert await client.transport() == "shm"
            w = client.writer(name, chunk=64, max_delay=None)
            i = 0
            for turn in range(30):
                for _ in range(63):
                    await w.append(step(i))
                    i += 1
                sending = asyncio.ensure_future(w.append(step(i)))  # the chunk's 64th
                i += 1
                await asyncio.sleep(0.0001 * (turn % 20))
                sending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sending
            await w.aclose()
            await asyncio.sleep(0.5)  # the cancelled sends' threads are done
            stored = await client.read(name, torch.arange((await client.info(name))["size"]))
            torn = (stored["obs"] != stored["id"][:, None]).any(1)
            assert not torn.any(), stored["id"][torn].tolist()

    asyncio.run(main())
