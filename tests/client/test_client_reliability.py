"""Pickling, auth, retries with backoff, and request-id dedupe through a response-dropping proxy."""

from __future__ import annotations

import contextlib
import pickle
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import unique

from tdreplay.client import (
    AsyncReplayClient,
    ConnectionFailed,
    ReplayClient,
    RetryPolicy,
    TableNotFound,
    Unauthorized,
)

FIELDS = {"x": {"shape": [], "dtype": "int64"}}


def rows(start: int, n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(start, start + n)}, [n])


def new_table(client: ReplayClient, capacity: int = 256) -> str:
    name = unique("r")
    client.create_table(
        {"name": name, "capacity": capacity, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    return name


def test_client_pickles_as_its_settings(server: Any) -> None:
    client = ReplayClient(server.url, token=None, timeout=12.5, retry=RetryPolicy(attempts=7))
    client.info  # noqa: B018
    name = new_table(client)
    back = pickle.loads(pickle.dumps(client))
    assert back.settings == client.settings and back.settings.retry.attempts == 7
    assert back.extend(name, rows(0, 3)).tolist() == [0, 1, 2]
    aback = pickle.loads(pickle.dumps(AsyncReplayClient(server.url)))
    assert isinstance(aback, AsyncReplayClient) and aback.urls == (server.url,)


def test_a_subprocess_reconnects_from_the_pickle(server: Any) -> None:
    client = ReplayClient(server.url)
    name = new_table(client)
    code = (
        "import pickle, sys, torch\n"
        "from tensordict import TensorDict\n"
        "client, name = pickle.load(sys.stdin.buffer)\n"
        "client.extend(name, TensorDict({'x': torch.arange(5)}, [5]))\n"
        "print(client.info(name)['size'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps((client, name)),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == "5"
    assert client.info(name)["size"] == 5


@pytest.fixture(scope="module")
def secured(live_server: Any) -> Any:
    return live_server(token="s3cret")


def test_auth(secured: Any) -> None:
    good = ReplayClient(secured.url, token="s3cret")
    name = new_table(good)
    assert good.extend(name, rows(0, 2)).tolist() == [0, 1]
    for token in (None, "wrong"):
        bad = ReplayClient(secured.url, token=token)
        assert bad.health()["status"] == "ok"  # /healthz never needs the token
        with pytest.raises(Unauthorized) as err:
            bad.sample(name, 1)
        assert err.value.status == 401
        with pytest.raises(Unauthorized):
            bad.extend(name, rows(0, 1))
    assert good.info(name)["size"] == 2


class CountingPolicy(RetryPolicy):
    """A retry policy that records its decisions."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        object.__setattr__(self, "decisions", [])

    def should_retry(self, err: BaseException, attempt: int, elapsed: float, **kw: Any) -> bool:
        answer = super().should_retry(err, attempt, elapsed, **kw)
        self.decisions.append((type(err).__name__, attempt, answer))  # type: ignore[attr-defined]
        return answer


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_retries_with_backoff_then_gives_up() -> None:
    policy = CountingPolicy(attempts=3, backoff=0.001, max_backoff=0.002)
    client = ReplayClient(f"http://127.0.0.1:{closed_port()}", retry=policy, connect_timeout=1)
    with pytest.raises(ConnectionFailed) as err:
        client.info("t")
    assert err.value.sent is False
    assert policy.decisions == [  # type: ignore[attr-defined]
        ("ConnectionFailed", 1, True),
        ("ConnectionFailed", 2, True),
        ("ConnectionFailed", 3, False),
    ]


@dataclass
class Proxy:
    """A TCP proxy that, while ``drop`` is set, forwards a request but not its answer.

    The server gets the whole request and starts answering (so it has done the
    work); the proxy then closes the client's connection without relaying a
    byte, as a network failure after the fact would.
    """

    port: int
    drop: threading.Event
    dropped: threading.Event


@pytest.fixture
def proxy(server: Any) -> Iterator[Proxy]:
    upstream_port = int(server.url.rsplit(":", 1)[1])
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    p = Proxy(listener.getsockname()[1], threading.Event(), threading.Event())
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket, answer: bool) -> None:
        try:
            while data := src.recv(65536):
                if answer and p.drop.is_set():
                    p.drop.clear()
                    p.dropped.set()
                    break  # the answer has started: drop it and the connection
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", upstream_port))
            threading.Thread(target=pipe, args=(conn, up, False), daemon=True).start()
            threading.Thread(target=pipe, args=(up, conn, True), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield p
    stop.set()
    listener.close()


def test_extend_retried_after_a_lost_answer_inserts_once(server: Any, proxy: Proxy) -> None:
    direct = ReplayClient(server.url)
    name = new_table(direct)
    policy = CountingPolicy(attempts=4, backoff=0.01)
    client = ReplayClient(f"http://127.0.0.1:{proxy.port}", retry=policy)
    assert client.extend(name, rows(0, 3)).tolist() == [0, 1, 2]  # through the proxy
    # a client with no pooled connection: the lost answer goes to the retry policy
    fresh = ReplayClient(f"http://127.0.0.1:{proxy.port}", retry=policy)
    proxy.drop.set()
    index = fresh.extend(name, rows(100, 4))
    assert proxy.dropped.is_set()
    assert policy.decisions == [("ConnectionFailed", 1, True)]  # type: ignore[attr-defined]
    assert index.tolist() == [3, 4, 5, 6]  # the remembered answer of the first try
    assert direct.info(name)["size"] == 7  # the rows went in once
    assert sorted(direct.sample(name, 256)["x"].unique().tolist()) == [0, 1, 2, 100, 101, 102, 103]


def test_a_posted_writer_chunk_whose_answer_is_lost_is_stored_once(
    server: Any, proxy: Proxy
) -> None:
    """The writer posts a chunk (HTTP, one server); its answer is lost: the chunk goes again
    through the plan, under its request id, and the server stores it once."""
    direct = ReplayClient(server.url)
    name = new_table(direct)
    policy = CountingPolicy(attempts=4, backoff=0.01)
    client = ReplayClient(f"http://127.0.0.1:{proxy.port}", retry=policy, transport="http")
    with client.writer(name, chunk=4, max_delay=None) as w:
        w.append(rows(0, 2))  # the writer asks the table's info first
        proxy.drop.set()
        w.append(rows(2, 2))  # the chunk, posted; the proxy drops its answer
        w.append(rows(4, 2))
        w.flush()  # reads the lost answer: sent again
        assert proxy.dropped.is_set() and w._mode == "post"
        assert w.sent_rows == 6 and w.kept_rows == 0
    assert direct.info(name)["size"] == 6  # the posted chunk went in once
    assert sorted(direct.read(name, torch.arange(6))["x"].tolist()) == list(range(6))


def test_async_retry_after_a_lost_answer(server: Any, proxy: Proxy) -> None:
    import asyncio

    direct = ReplayClient(server.url)
    name = new_table(direct)

    async def main() -> None:
        client = AsyncReplayClient(
            f"http://127.0.0.1:{proxy.port}", retry=RetryPolicy(attempts=3, backoff=0.01)
        )
        await client.info(name)  # pooled: the lost answer is retried on a fresh connection
        proxy.drop.set()
        assert (await client.extend(name, rows(0, 5))).tolist() == [0, 1, 2, 3, 4]
        with pytest.raises(TableNotFound):
            await client.info(unique("missing"))
        await client.aclose()

    asyncio.run(main())
    assert proxy.dropped.is_set()
    assert direct.info(name)["size"] == 5
