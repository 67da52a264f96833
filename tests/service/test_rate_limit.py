"""Rate-limited calls wait on the event loop, not in threads; they time out with 429; waiters are all served."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import anyio.to_thread
from service_helpers import ARROW, body, served, spec, until

from tdreplay.codec import decode, protocol

SAMPLE = protocol.table_path("t", "sample")
EXTEND = protocol.table_path("t", "extend")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_waiters_hold_no_threads_and_an_extend_releases_them(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path) as (app, client):
            r = await client.post(
                protocol.TABLES, json=spec(rate_limiter={"min_size_to_sample": 4})
            )
            assert r.status_code == 201
            handle = app.state.core.table("t")
            n = 60  # more than the threadpool's 40 workers
            waiters = [
                asyncio.create_task(client.post(SAMPLE, params={"batch_size": 2, "timeout": 30}))
                for _ in range(n)
            ]
            await until(lambda: handle.table.rate_limiter.waiting["sample"] == n)
            limiter = anyio.to_thread.current_default_thread_limiter()
            # their retries done, nobody holds a worker thread while waiting
            await until(lambda: limiter.borrowed_tokens == 0)
            info = await client.get(protocol.table_path("t"))  # the server still answers
            assert info.json()["waiting"] == {"insert": 0, "sample": n}
            assert not any(w.done() for w in waiters)
            r = await client.post(EXTEND, content=body(0, 4), headers=ARROW)
            assert r.status_code == 200
            answers = await asyncio.gather(*waiters)
            assert [a.status_code for a in answers] == [200] * n
            for a in answers:
                assert set(decode(a.content)["id"].tolist()) <= {0, 1, 2, 3}
            assert handle.table.rate_limiter.waiting == {"insert": 0, "sample": 0}

    run(main())


def test_insert_waits_for_samples(tmp_path: Path) -> None:
    limiter = {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 4}

    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec(rate_limiter=limiter))
            handle = app.state.core.table("t")
            assert (await client.post(EXTEND, content=body(0, 5), headers=ARROW)).status_code == 200
            held = asyncio.create_task(
                client.post(EXTEND, content=body(5, 2), headers=ARROW, params={"timeout": 30})
            )
            await until(lambda: handle.table.rate_limiter.waiting["insert"] == 1)
            assert handle.table.size == 5
            r = await client.post(SAMPLE, params={"batch_size": 4})
            assert r.status_code == 200
            r = await held
            assert r.status_code == 200 and r.json()["index"] == [5, 6]

    run(main())


def test_timeout_is_429_and_counted(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path) as (_, client):
            await client.post(protocol.TABLES, json=spec(rate_limiter={"min_size_to_sample": 2}))
            start = time.monotonic()
            r = await client.post(SAMPLE, params={"batch_size": 1, "timeout": 0.2})
            assert r.status_code == 429 and r.json()["type"] == "EmptyTableError"  # holds none
            assert time.monotonic() - start >= 0.2
            await client.post(EXTEND, content=body(0, 1), headers=ARROW)
            r = await client.post(SAMPLE, params={"batch_size": 1, "timeout": 0})
            assert r.status_code == 429 and r.json()["type"] == "RateLimitTimeout"  # too few
            text = (await client.get("/metrics")).text
            assert 'tdreplay_rate_limiter_timeouts_total{op="sample",table="t"} 2.0' in text
            assert 'tdreplay_rate_limiter_waits_total{op="sample",table="t"} 2.0' in text

    run(main())


def test_server_default_timeout_applies(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path, default_timeout=0.05) as (_, client):
            await client.post(protocol.TABLES, json=spec())
            r = await client.post(SAMPLE, params={"batch_size": 1})  # no timeout given
            assert r.status_code == 429

    run(main())


def test_delete_ends_waits_with_404(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            handle = app.state.core.table("t")
            waiter = asyncio.create_task(
                client.post(SAMPLE, params={"batch_size": 1, "timeout": 30})
            )
            await until(lambda: handle.table.rate_limiter.waiting["sample"] == 1)
            r = await client.delete(protocol.table_path("t"))
            assert r.status_code == 204
            r = await waiter
            assert r.status_code == 404 and r.json()["type"] == "TableNotFound"

    run(main())


def test_every_waiter_is_served(tmp_path: Path) -> None:
    """Items arrive one at a time to many waiting consumers of a queue: none starves, none doubles."""

    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec(sampler={"kind": "fifo"}))
            handle = app.state.core.table("t")
            n = 24
            waiters = [
                asyncio.create_task(client.post(SAMPLE, params={"batch_size": 1, "timeout": 30}))
                for _ in range(n)
            ]
            await until(lambda: handle.table.rate_limiter.waiting["sample"] == n)
            for i in range(n):
                r = await client.post(EXTEND, content=body(i, 1), headers=ARROW)
                assert r.status_code == 200
            answers = await asyncio.gather(*waiters)
            assert [a.status_code for a in answers] == [200] * n
            got = sorted(int(decode(a.content)["id"][0]) for a in answers)
            assert got == list(range(n))

    run(main())
