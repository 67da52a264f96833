"""The async client's loaders share its blocking client: no connections left behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import AsyncReplayClient, ReplayClient


def sockets(pid: int) -> int:
    """Sockets process ``pid`` holds open (its listeners among them)."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):  # closed meanwhile
            n += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return n


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_eighty_loaders_leave_no_connections_behind(server: Any, transport: str) -> None:
    table = unique("aloader")
    with ReplayClient(server.url) as setup:
        setup.create_table(
            {
                "name": table,
                "capacity": 64,
                "backend": {"kind": "memory"},
                "fields": {"x": {"shape": [], "dtype": "int64"}},
            }
        )
        setup.extend(table, TensorDict({"x": torch.arange(64)}, [64]))
    pid = server.proc.pid

    async def run() -> tuple[int, int]:
        held = []  # a learner's loaders, one per epoch, kept (or in a cycle gc has not met)
        async with AsyncReplayClient(server.url, transport=transport, timeout=30) as client:
            await client.health()
            before = sockets(pid)
            for _ in range(80):
                loader = client.loader(table, 8, prefetch=2, num_batches=2)
                n = 0
                async for _batch in loader:
                    n += 1
                assert n == 2
                held.append(loader)
            during = sockets(pid)
        # closed with the client: the server sees its connections end
        deadline = time.monotonic() + 30
        while sockets(pid) > before - 1 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return during - before, sockets(pid) - before

    during, after = asyncio.run(run())
    # one blocking client for all: its few connections (prefetch 2; over shm a fetcher
    # thread's channel may outlive it a while), not 80 clients' 80-160
    assert during <= 16, f"{during} more server sockets after 80 loaders"
    assert after <= -1  # aclose() closed the loaders' connections and the client's own
