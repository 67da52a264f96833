"""A sample whose client closed its connection while it waited for the rate limiter ends there.

A learner that dies (or gives up) while its sample waits must not leave the
sample behind on the server: once rows arrive it would take them - from a
queue, for good - and send them to nobody. Against a real server: a raw
connection asks for a sample of an empty FIFO table with a long timeout and
closes; the wait ends, and the rows inserted after are there for the next
learner.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import testkit

from tdreplay.codec import decode, encode, protocol

SPEC = {
    "name": "q",
    "capacity": 32,
    "fields": dict(testkit.FIELDS),
    "backend": {"kind": "memory"},
    "sampler": {"kind": "fifo"},
}


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server()


def waiting(server: Any) -> int:
    status, _, body = server.request("GET", protocol.table_path("q"))
    assert status == 200, body
    return json.loads(body)["waiting"]["sample"]


def until(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.mark.parametrize(
    "path",
    [
        protocol.table_path("q", "sample") + "?batch_size=2&timeout=30",
        protocol.table_path("q", "stream") + "?batch_size=2&count=1&timeout=30",
    ],
    ids=["sample", "stream"],
)
def test_a_sample_whose_client_left_takes_nothing(server: Any, path: str) -> None:
    server.request("DELETE", protocol.table_path("q"))
    status, _, body = server.request(
        "POST", protocol.TABLES, json.dumps(SPEC).encode(), {"Content-Type": protocol.JSON}
    )
    assert status == 201, body
    method = "POST" if path.split("?")[0].endswith("sample") else "GET"
    with socket.create_connection((server.host, server.port)) as learner:
        learner.sendall(
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()
        )
        assert until(lambda: waiting(server) == 1)
    assert until(lambda: waiting(server) == 0), "the sample still waits for a client gone"
    status, _, body = server.request(
        "POST",
        protocol.table_path("q", "extend"),
        encode(testkit.rows(0, 2)).to_pybytes(),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200, body
    status, _, body = server.request(
        "POST", protocol.table_path("q", "sample") + "?batch_size=2&timeout=5"
    )
    assert status == 200, body  # the rows are still queued for the next learner
    assert decode(body)["id"].tolist() == [0, 1]
