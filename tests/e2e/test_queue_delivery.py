"""Queues over a real server: every item delivered once, to a caller that is there to read it."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import pytest
from testkit import FIELDS, rows

from tdreplay.client import RateLimitTimeout, ReplayClient


def _queue(client: ReplayClient, name: str, capacity: int = 64) -> None:
    client.create_table(
        {
            "name": name,
            "capacity": capacity,
            "fields": FIELDS,
            "backend": {"kind": "memory"},
            "sampler": {"kind": "fifo"},
        }
    )


def _until(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.mark.parametrize(
    "request_line",
    [
        b"POST /v1/tables/%s/sample?batch_size=1&timeout=30",
        b"POST /v1/tables/%s/stream?batch_size=1&count=2&timeout=30",
    ],
)
def test_a_sample_whose_client_hung_up_takes_nothing(
    server: Any, client: ReplayClient, request_line: bytes
) -> None:
    """A learner killed while its sample (or stream) waited on an empty queue: the next item
    goes to the next learner. (It went nowhere: the abandoned wait drew it when it came, and
    the queue then held nothing - measured: size 0 after the insert, the next sample timed out.)"""
    name = "hangup" + ("stream" if b"/stream" in request_line else "sample")
    _queue(client, name)
    conn = socket.create_connection((server.host, server.port))
    conn.sendall(
        request_line % name.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    )
    _until(lambda: client.info(name)["waiting"]["sample"] == 1)
    conn.close()
    _until(lambda: client.info(name)["waiting"]["sample"] == 0)
    client.extend(name, rows(0, 1))
    assert client.sample(name, 1, timeout=5)["id"].tolist() == [0]
    info = client.info(name)
    assert info["samples"] == 1 and info["rate_limiter"]["timeouts"]["sample"] == 1


def test_concurrent_learners_get_each_item_once(server: Any) -> None:
    """Learners over HTTP and shared memory drain a queue a collector fills: nothing twice,
    nothing lost."""
    with ReplayClient(server.url, transport="http") as admin:
        _queue(admin, "shared", capacity=32)
    total, got, errors = 600, [], []
    lock = threading.Lock()

    def learner(transport: str) -> None:
        try:
            with ReplayClient(server.url, transport=transport) as c:
                while True:
                    try:
                        ids = c.sample("shared", 3, timeout=1.0)["id"].tolist()
                    except RateLimitTimeout:
                        return
                    with lock:
                        got.extend(ids)
        except BaseException as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=learner, args=(t,)) for t in ["http", "shm"] * 2]
    for t in threads:
        t.start()
    with ReplayClient(server.url, transport="http") as collector:
        for start in range(0, total, 6):
            collector.extend("shared", rows(start, 6), timeout=10)
    for t in threads:
        t.join(30)
    assert not errors and not any(t.is_alive() for t in threads)
    assert sorted(got) == list(range(total))
