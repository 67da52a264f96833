"""A client used in a process forked after it made calls (a learner forking workers,
multiprocessing's ``fork`` start method): the child's calls go over connections of its
own and get their own answers, on real servers."""

from __future__ import annotations

import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import ReplayClient

FIELDS = {"x": {"shape": [], "dtype": "int64"}}


@pytest.fixture(scope="module")
def servers(server: Any, live_server: Any) -> list[Any]:
    return [server, live_server()]


def table_on(urls: list[str]) -> str:
    name = unique("fork")
    for url in urls:
        with ReplayClient(url, transport="http") as c:
            c.create_table(
                {"name": name, "capacity": 1024, "backend": {"kind": "memory"}, "fields": FIELDS}
            )
            c.extend(name, TensorDict({"x": torch.arange(100)}, [100]))
    return name


def samples(client: ReplayClient, table: str, calls: int, shift: int) -> str:
    """``calls`` samples of sizes 1..37 in turn: '' if each came back whole and of its
    size, else what went wrong."""
    for i in range(calls):
        n = 1 + (i + shift) % 37
        try:
            batch = client.sample(table, n)
        except Exception as err:
            return f"call {i}: {type(err).__name__}: {str(err)[:300]}"
        if batch.batch_size != torch.Size([n]) or not bool((batch["x"] < 100).all()):
            return f"call {i}: asked {n} rows, got {batch.batch_size} {batch['x'][:5].tolist()}"
    return ""


def in_child(work: Callable[[], str], parent_work: Callable[[], str], limit: float) -> str:
    """Fork; the child runs ``work`` while this process runs ``parent_work``; what either
    reported ('' each when all went well), or that the child hung past ``limit`` seconds."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report through the pipe, never return into pytest
        try:
            os.write(write, (work() or "ok").encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        mine = parent_work()
        ready, _, _ = select.select([read], [], [], limit)
        theirs = os.read(read, 4096).decode() if ready else f"child hung over {limit}s"
    finally:
        os.close(read)
        if not os.waitpid(pid, os.WNOHANG)[0]:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    return f"parent: {mine or 'ok'}; child: {theirs}"


def test_a_forked_child_gets_its_own_http_connections(server: Any) -> None:
    """The parent's pooled keep-alive connection was the child's too: both wrote requests
    on one server connection and read each other's answers (ProtocolError 'bad status
    line', 'malformed Arrow IPC stream', in 2 of 3 children of 300 calls)."""
    table = table_on([server.url])
    with ReplayClient(server.url, transport="http") as client:
        client.sample(table, 8)  # a connection in the pool
        outcome = in_child(
            lambda: samples(client, table, 300, 5), lambda: samples(client, table, 300, 0), 60
        )
        assert outcome == "parent: ok; child: ok"
        client.delete_table(table)


@pytest.mark.parametrize("transport", ["http", "shm"])
def test_a_forked_child_of_a_sharded_client_does_not_hang(
    servers: list[Any], transport: str
) -> None:
    """A sharded sample gathers from the servers on a thread pool; a child inherited the
    pool but not its threads, so its first sample queued for them forever."""
    urls = [s.url for s in servers]
    table = table_on(urls)
    with ReplayClient(urls, transport=transport, timeout=10) as client:
        for _ in range(5):
            client.sample(table, 64)  # the pool's threads started
        start = time.monotonic()
        outcome = in_child(lambda: samples(client, table, 20, 3), lambda: "", 30)
        assert outcome == "parent: ok; child: ok", f"{outcome} ({time.monotonic() - start:.1f}s)"
        assert samples(client, table, 20, 0) == ""  # the parent's pool still serves it
        client.delete_table(table)


def test_a_child_forked_while_a_down_server_was_tried_tries_it_again(live_server: Any) -> None:
    """A down server is tried in the background, one try at a time; a child forked while a
    try was out inherited 'a try is out' without the thread making it, and never tried
    that server again (down for good in the child, though it answered)."""
    paused, other = live_server(), live_server()
    urls = [paused.url, other.url]
    table = table_on(urls)
    client = ReplayClient(urls, transport="http", timeout=1.0, shard_refresh=0.1)
    paused.proc.send_signal(signal.SIGSTOP)
    try:
        client.sample(table, 8)  # its timeout on the paused server: marked down
        time.sleep(0.2)
        client.sample(table, 8)  # starts a try of it, which waits on it in the background
        assert not client.shard_status()[0]["up"]

        def child() -> str:
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:
                client.sample(table, 8)
                if client.shard_status()[0]["up"]:
                    return ""
                time.sleep(0.05)
            return "the server that answers again is still down"

        def parent() -> str:
            paused.proc.send_signal(signal.SIGCONT)
            return ""

        assert in_child(child, parent, 15) == "parent: ok; child: ok"
    finally:
        paused.proc.send_signal(signal.SIGCONT)
