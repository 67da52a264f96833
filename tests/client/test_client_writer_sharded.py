"""A sharded client's writer: a chunk that may be stored on a silent server is not sent
to another one (it would be stored twice), and one that surely was not is.

Real servers; one is paused (SIGSTOP): the kernel still takes its connections and
the requests' bytes, so a send to it times out with its request out (it may have
been stored). Resumed, it stores what it was sent, under one request id: once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tensordict import TensorDict

from tdreplay.client import AsyncReplayClient, ReplayClient, RetryPolicy, Timeout

FIELDS = {"x": {"shape": [], "dtype": "int64"}}


def steps(*xs: int) -> TensorDict:
    return TensorDict({"x": torch.tensor(xs, dtype=torch.int64)}, [len(xs)])


def stored(url: str) -> list[int]:
    client = ReplayClient(url, transport="http")
    return sorted(client.read("t", torch.arange(client.info("t")["size"]))["x"].tolist())


def notes(err: BaseException) -> str:
    return "\n".join(getattr(err, "__notes__", []))


@pytest.fixture
def two(live_server: Any, tmp_path: Path) -> list[Any]:
    schema = tmp_path / "t.yaml"
    schema.write_text(yaml.safe_dump({"name": "t", "capacity": 64, "fields": FIELDS}))
    return [live_server(schema=schema, root=tmp_path / f"data{i}") for i in range(2)]


def fast(urls: list[str]) -> ReplayClient:
    """A sharded client that gives a silent server up quickly (no call waits on a rate
    limiter long: an answer is due within 0.6 s)."""
    policy = RetryPolicy(attempts=2, backoff=0.05, max_backoff=0.1, jitter=0, deadline=1.0)
    return ReplayClient(urls, transport="http", timeout=0.5, wait=0.1, retry=policy)


def test_info_goes_on_without_a_silent_shard_and_names_it(two: list[Any]) -> None:
    """Sampling goes on without a server that does not answer; so does ``info`` (a writer
    asks for it first): the servers that answer, summed, and ``down`` naming the other.
    Before, one silent server of two failed every ``info``, and no writer could start."""
    paused, other = two
    ReplayClient(other.url).extend("t", steps(1, 2, 3))
    client = fast([s.url for s in two])
    paused.proc.send_signal(signal.SIGSTOP)
    try:
        info = client.info("t")
        assert info["size"] == 3 and info["capacity"] == 64
        assert [d["shard"] for d in info["down"]] == [0]
        assert info["down"][0]["url"] == paused.url
        with client.writer("t", chunk=2, max_delay=None, background=False) as w:
            w.append(steps(4, 5))  # the writer starts: its chunk goes to the server that answers
        assert stored(other.url) == [1, 2, 3, 4, 5]
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    deadline = time.monotonic() + 5
    while "down" in (info := client.info("t")):  # tried in the background: up once it answers
        assert time.monotonic() < deadline, "the server that woke is still thought down"
        time.sleep(0.05)
    assert [i["size"] for i in info["shards"]] == [0, 5]


def test_a_chunk_in_doubt_on_a_silent_shard_leaves_the_writer_and_is_stored_there_once(
    two: list[Any],
) -> None:
    """Chunk 4, one server paused after the writer started: the chunk sent to it times out,
    as do its re-sends there (it may be stored), so the writer drops it with a note saying
    why, keeps nothing, and goes on to the other server. Resumed, the paused server stores
    the chunk once; no row is on both servers, and every row is on one."""
    paused, other = two
    client = fast([s.url for s in two])
    w = client.writer("t", chunk=4, max_delay=None, background=False)
    w.append(steps(0, 1, 2, 3))
    paused.proc.send_signal(signal.SIGSTOP)
    first, in_doubt = 4, 0
    try:
        for _ in range(2):  # writes go round the servers: one of these goes to the paused one
            try:
                w.append(steps(*range(first, first + 4)))
            except Timeout as err:
                in_doubt += 1
                assert "may have been stored by its server" in notes(err)
                assert "it is not sent again" in notes(err)
            first += 4
        assert in_doubt == 1
        assert w.kept_rows == 0  # dropped, not kept for another server
        w.append(steps(*range(first, first + 4)))  # the writer goes on, to the other server
        first += 4
    finally:
        paused.proc.send_signal(signal.SIGCONT)
    w.close()
    on_paused, on_other = stored(paused.url), stored(other.url)
    assert not set(on_paused) & set(on_other)  # nothing stored twice
    assert sorted(on_paused + on_other) == list(range(first))  # nothing lost either
    assert len(on_paused) in (4, 8)  # the chunk in doubt once, though sent more than once


def test_a_hung_shard_costs_its_timeout_once_not_at_every_refresh(two: list[Any]) -> None:
    """A server that takes connections but never answers (paused: hung, not dead) costs
    the first call that meets it its timeout; after that, samples and extends go on at
    their own pace while it is tried again in the background every ``shard_refresh``,
    and once it answers it takes its share again. Before, every size refresh and every
    extend in its turn waited the whole timeout on it (3 s here, 30 s by default): for a
    client sampling in a loop, one stall a refresh."""
    hung, _ = two
    for s in two:
        ReplayClient(s.url).extend("t", steps(1, 2, 3, 4))
    client = ReplayClient(
        [s.url for s in two], transport="http", timeout=3.0, wait=0.1, shard_refresh=0.3
    )
    client.sample("t", 4)
    hung.proc.send_signal(signal.SIGSTOP)
    try:
        with contextlib.suppress(Timeout):  # the call that finds it hung: up to its timeout
            client.sample("t", 8)
            client.extend("t", steps(5))
            client.extend("t", steps(5))
        assert not client.shard_status()[0]["up"]
        slowest, until = 0.0, time.monotonic() + 2.5  # over 8 refreshes
        while time.monotonic() < until:
            for call in (lambda: client.sample("t", 8), lambda: client.extend("t", steps(6))):
                start = time.monotonic()
                call()
                slowest = max(slowest, time.monotonic() - start)
        assert slowest < 1.5, f"a call waited {slowest:.1f}s on the hung server"
    finally:
        hung.proc.send_signal(signal.SIGCONT)
    deadline, sampled, written = time.monotonic() + 5, set(), set()
    while sampled != {0, 1} or written != {0, 1}:  # tried in the background, it is found up
        assert time.monotonic() < deadline, f"after it woke: samples {sampled}, extends {written}"
        sampled |= {int(i) % 2 for i in client.sample("t", 8)["index"]}
        written |= {int(i) % 2 for i in client.extend("t", steps(7))}
        time.sleep(0.02)


def test_the_async_client_tries_a_hung_shard_in_the_background_too(two: list[Any]) -> None:
    """The asyncio twin runs the same plans; its background tries are tasks."""
    hung, _ = two
    for s in two:
        ReplayClient(s.url).extend("t", steps(1, 2, 3, 4))

    async def run() -> tuple[float, set[int]]:
        client = AsyncReplayClient(
            [s.url for s in two], transport="http", timeout=3.0, wait=0.1, shard_refresh=0.3
        )
        await client.sample("t", 4)
        hung.proc.send_signal(signal.SIGSTOP)
        try:
            await client.sample("t", 8)  # finds it hung: marked down
            slowest, until = 0.0, time.monotonic() + 2.0
            while time.monotonic() < until:
                start = time.monotonic()
                await client.sample("t", 8)
                await client.extend("t", steps(6))
                slowest = max(slowest, time.monotonic() - start)
        finally:
            hung.proc.send_signal(signal.SIGCONT)
        sampled: set[int] = set()
        deadline = time.monotonic() + 5
        while sampled != {0, 1} and time.monotonic() < deadline:
            sampled |= {int(i) % 2 for i in (await client.sample("t", 8))["index"]}
            await asyncio.sleep(0.02)
        await client.aclose()
        return slowest, sampled

    slowest, sampled = asyncio.run(run())
    assert slowest < 1.5, f"a call waited {slowest:.1f}s on the hung server"
    assert sampled == {0, 1}  # found up again in the background, it takes its share
