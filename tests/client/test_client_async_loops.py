"""The async client used from several event loops at once, and dropped unclosed: its
keep-alive connections stay bounded (``client/aio_pool.py``)."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import AsyncReplayClient


def connections(port: int) -> int:
    """This process's open TCP connections to ``port`` (its descriptors' sockets, found in
    the kernel's table by inode)."""
    mine = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
        if link.startswith("socket:["):
            mine.add(link[8:-1])
    n = 0
    for line in Path("/proc/self/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        remote_port = int(cols[2].split(":")[1], 16)
        n += remote_port == port and cols[3] == "01" and cols[9] in mine  # 01: established
    return n


def spec(name: str) -> dict[str, Any]:
    fields = {"x": {"shape": [], "dtype": "int64"}}
    return {"name": name, "capacity": 8, "backend": {"kind": "memory"}, "fields": fields}


def test_two_loops_at_once_reuse_their_own_connections(server: Any) -> None:
    """Two threads, each under its own ``asyncio.run``, take turns calling one client: each
    loop keeps reusing its connection (the pool was emptied whenever the other loop had
    called, its live sockets dropped unclosed: a new connection per call, 4 threads
    reached the server's 1000-connection limit in 1.6 s)."""
    client = AsyncReplayClient(server.url, transport="http")
    name = unique("loops")
    asyncio.run(client.create_table(spec(name)))
    turn = threading.Barrier(2)
    failed: list[BaseException] = []

    def run(me: int) -> None:
        async def main() -> None:
            for _ in range(30):
                for who in (0, 1):  # strictly one loop, then the other
                    if who == me:
                        assert (await client.info(name))["size"] == 0
                    await asyncio.to_thread(turn.wait, 10)
            held = connections(server.port)
            await asyncio.to_thread(turn.wait, 10)  # both counted before either closes
            assert held <= 3, held  # one per loop (and the create's: an ended loop's)
            await client.aclose()

        try:
            asyncio.run(main())
        except BaseException as err:
            failed.append(err)
            turn.abort()

    threads = [threading.Thread(target=run, args=(me,)) for me in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not failed, failed[0]


def test_a_client_dropped_unclosed_closes_its_idle_connections(server: Any) -> None:
    """Clients made and dropped without ``aclose`` in one long-lived loop: each one's idle
    connections are closed when it is collected (they stayed open in the loop: 20 such
    clients held 80 sockets)."""
    name = unique("drop")

    async def main() -> None:
        async with AsyncReplayClient(server.url, transport="http") as first:
            await first.create_table(spec(name))
        for _ in range(5):
            client = AsyncReplayClient(server.url, transport="http")
            await asyncio.gather(*(client.info(name) for _ in range(4)))  # 4 connections
            del client
        gc.collect()
        for _ in range(5):  # the close scheduled on this loop, then the transports' own
            await asyncio.sleep(0)
        assert connections(server.port) == 0  # an ended loop's too: collected

    asyncio.run(main())


def test_a_writer_goes_on_under_a_later_loop(server: Any) -> None:
    """An async writer filled under one ``asyncio.run`` and closed under another sends its
    steps (``aclose`` raised the first loop's timer task's ``CancelledError``, the steps
    unsent); its time limit runs under the later loop too."""
    client = AsyncReplayClient(server.url)
    name = unique("wloop")
    asyncio.run(client.create_table(spec(name) | {"capacity": 64}))
    writer = client.writer(name, chunk=100, max_delay=3600)

    asyncio.run(append_to(writer, range(3)))
    asyncio.run(writer.aclose())
    limited = client.writer(name, chunk=100, max_delay=0)  # the time limit sends each step

    async def timed(values: range) -> None:
        await append_to(limited, values)
        assert await limited.wait_sent(values.stop - 3, timeout=30)  # its own steps

    asyncio.run(timed(range(3, 5)))
    asyncio.run(timed(range(5, 7)))
    asyncio.run(limited.aclose())

    async def stored() -> list[int]:
        async with client:
            rows = await client.read(name, torch.arange((await client.info(name))["size"]))
        return sorted(rows["x"].tolist())

    assert asyncio.run(stored()) == list(range(7))


async def append_to(writer: Any, values: range) -> None:
    for i in values:
        await writer.append(TensorDict({"x": torch.tensor(i)}, []))
