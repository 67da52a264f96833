"""Small table calls run on the event loop only when no worker thread uses the table."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

from service_helpers import ARROW, body, served, spec

from tdreplay.codec import protocol


def _spy(table: Any, method: str, seen: list[int]) -> None:
    original = getattr(table, method)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(threading.get_ident())
        return original(*args, **kwargs)

    setattr(table, method, spy)


def test_small_calls_inline_large_ones_in_threads(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path, inline_bytes=4096) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            handle = app.state.core.table("t")
            seen: list[int] = []
            _spy(handle.table, "try_sample", seen)
            _spy(handle.table, "try_extend", seen)
            loop_thread = threading.get_ident()
            await client.post(
                protocol.table_path("t", "extend"), content=body(0, 40), headers=ARROW
            )
            await client.post(protocol.table_path("t", "sample"), params={"batch_size": 2})
            await client.post(protocol.table_path("t", "sample"), params={"batch_size": 64})
            assert seen[0] == loop_thread  # a 40-row extend of a memory table: inline
            assert seen[1] == loop_thread  # a small sample: inline
            assert seen[2] != loop_thread  # 64 rows are over 4096 bytes: a worker thread

    asyncio.run(main())


def test_nothing_inline_while_a_thread_uses_the_table(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            handle = app.state.core.table("t")
            release = threading.Event()
            started = asyncio.Event()
            loop = asyncio.get_running_loop()

            def slow() -> None:  # a long table call in a worker thread (e.g. a checkpoint)
                loop.call_soon_threadsafe(started.set)
                release.wait(30)

            slow_call = asyncio.create_task(handle.call(slow))
            await started.wait()
            seen: list[int] = []
            _spy(handle.table, "try_sample", seen)
            await client.post(protocol.table_path("t", "extend"), content=body(0, 4), headers=ARROW)
            r = await client.post(protocol.table_path("t", "sample"), params={"batch_size": 2})
            assert r.status_code == 200
            assert seen and seen[0] != threading.get_ident()
            release.set()
            await slow_call
            seen.clear()
            await client.post(protocol.table_path("t", "sample"), params={"batch_size": 2})
            assert seen == [threading.get_ident()]

    asyncio.run(main())


def test_inline_off(tmp_path: Path) -> None:
    async def main() -> None:
        async with served(tmp_path, inline_bytes=0) as (app, client):
            await client.post(protocol.TABLES, json=spec())
            seen: list[int] = []
            _spy(app.state.core.table("t").table, "try_sample", seen)
            await client.post(protocol.table_path("t", "extend"), content=body(0, 4), headers=ARROW)
            await client.post(protocol.table_path("t", "sample"), params={"batch_size": 2})
            assert seen and seen[0] != threading.get_ident()

    asyncio.run(main())
