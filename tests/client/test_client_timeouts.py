"""A call's timeout, as the contract has it (``codec.params.Seconds``): any number of
seconds >= 0, ``inf`` for no limit of the caller's, capped by the server's maximum; a NaN or
negative one is refused.

Every call that takes one, on both transports and both twins: a huge or infinite timeout
(more seconds than a socket or a lock can wait) waits as long as the server holds the call,
never an ``OverflowError``; a NaN or negative one is an ``InvalidRequest`` naming
``timeout``, before anything is sent. (An in-process ``Table`` follows the same rule:
``tests/storage/test_sampler_semantics.py``.)
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from testkit import make_rows, schema_fields, unique

from tdreplay.client import AsyncReplayClient, InvalidRequest, RateLimitTimeout, ReplayClient

#: the server holds a call at most this long, whatever the client asks
MAX_TIMEOUT = 0.5
HUGE = [1e12, float(sys.maxsize), sys.maxsize, math.inf]
FIELDS = schema_fields("cartpole")


@pytest.fixture(scope="module")
def server(live_server: Callable[..., Any]) -> Any:
    return live_server("--max-timeout", str(MAX_TIMEOUT))


def new_table(client: ReplayClient) -> str:
    name = unique("to")
    client.create_table(
        {"name": name, "capacity": 64, "backend": {"kind": "memory"}, "fields": FIELDS}
    )
    return name


@pytest.mark.parametrize("transport", ["http", "shm"])
@pytest.mark.parametrize("huge", HUGE)
def test_a_huge_timeout_waits_as_long_as_the_server_holds_the_call(
    server: Any, transport: str, huge: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed: list[Any] = []  # a thread of the client's (the writer's timer) that died
    monkeypatch.setattr(threading, "excepthook", crashed.append)
    client = ReplayClient(server.url, transport=transport)
    name = new_table(client)
    began = time.monotonic()
    with pytest.raises(RateLimitTimeout):  # empty: held the server's maximum, then 429
        client.sample(name, 2, timeout=huge)
    assert MAX_TIMEOUT * 0.9 <= time.monotonic() - began < 10
    rows = make_rows(FIELDS, 4)
    assert client.extend(name, rows, timeout=huge).tolist() == [0, 1, 2, 3]
    assert len(client.extend({name: None}, rows, timeout=huge)[name]) == 4
    assert client.sample(name, 2, timeout=huge).batch_size == (2,)
    with client.writer(name, 2, timeout=huge, max_delay=huge) as writer:
        for i in range(4):
            writer.append(rows[i])
        assert writer.wait_sent(4, timeout=huge)
    for stream in (False, True):
        loader = client.loader(name, 2, num_batches=2, timeout=huge, stream=stream)
        assert [b.batch_size for b in loader] == [(2,), (2,)]
    finite = huge if math.isfinite(huge) else 1e12  # a silent server is given up on, once
    patient = ReplayClient(
        server.url, transport=transport, timeout=finite, connect_timeout=finite, wait=huge
    )
    assert patient.sample(name, 2).batch_size == (2,)
    assert client.info(name)["size"] == 12
    assert not crashed, [c.exc_value for c in crashed]


@pytest.mark.parametrize("transport", ["http", "shm"])
@pytest.mark.parametrize("bad", [math.nan, -1.0, -math.inf])
def test_a_nan_or_negative_timeout_is_refused_before_anything_is_sent(
    server: Any, transport: str, bad: float
) -> None:
    client = ReplayClient(server.url, transport=transport)
    name = new_table(client)
    rows = make_rows(FIELDS, 4)
    calls = {
        "extend": lambda: client.extend(name, rows, timeout=bad),
        "insert": lambda: client.extend({name: None}, rows, timeout=bad),
        "sample": lambda: client.sample(name, 2, timeout=bad),
        "loader": lambda: client.loader(name, 2, num_batches=1, timeout=bad),
        "stream": lambda: client.loader(name, 2, num_batches=1, timeout=bad, stream=True),
        "writer": lambda: client.writer(name, 2, timeout=bad),
    }
    for what, call in calls.items():
        with pytest.raises(InvalidRequest) as caught:
            call()
        assert caught.value.field == "timeout", what
    assert client.info(name)["size"] == 0


def test_the_async_client_agrees(server: Any) -> None:
    name = new_table(ReplayClient(server.url))
    rows = make_rows(FIELDS, 4)

    async def main() -> None:
        async with AsyncReplayClient(server.url) as client:
            for huge in HUGE:
                assert len(await client.extend(name, rows, timeout=huge)) == 4
                assert (await client.sample(name, 2, timeout=huge)).batch_size == (2,)
            async with client.writer(name, 2, timeout=HUGE[0]) as writer:
                for i in range(4):
                    await writer.append(rows[i])
                assert await writer.wait_sent(4, timeout=HUGE[0])
            for bad in (math.nan, -1.0):
                with pytest.raises(InvalidRequest) as caught:
                    await client.extend(name, rows, timeout=bad)
                assert caught.value.field == "timeout"
                with pytest.raises(InvalidRequest) as caught:
                    await client.sample(name, 2, timeout=bad)
                assert caught.value.field == "timeout"
                with pytest.raises(InvalidRequest):
                    client.writer(name, 2, timeout=bad)

    asyncio.run(main())
    assert ReplayClient(server.url).info(name)["size"] == 4 * len(HUGE) + 4
