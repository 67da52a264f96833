"""A sharded client's writer: a chunk that may be stored on a silent server is not sent
to another one (it would be stored twice), and one that surely was not is.

Real servers; one is paused (SIGSTOP): the kernel still takes its connections and
the requests' bytes, so a send to it times out with its request out (it may have
been stored). Resumed, it stores what it was sent, under one request id: once.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from tensordict import TensorDict

from tdreplay.client import ReplayClient, RetryPolicy, Timeout

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
    info = client.info("t")
    assert "down" not in info and [i["size"] for i in info["shards"]] == [0, 5]


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
