"""Extends the rate limiter holds back keep their bodies: those count in ``--max-receiving-bytes``.

An extend waiting for the rate limiter holds its request body (its rows view
it) until the wait ends, up to ``--max-timeout`` seconds. Before, only bodies
being received counted: once received, a body left the count, so any number
of waiting extends grew the server without bound (48 waiting extends of 1 MiB
here: +52.5 MiB of RSS, and not one refused).
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
import torch
from tensordict import TensorDict
from testkit import rss

from tdreplay.codec import encode, protocol

MiB = 1 << 20
LIMIT = 8 * MiB  # --max-receiving-bytes
CALLS = 48  # extends of one 1 MiB row each, all at once
WAIT = 3.0  # seconds each may wait for the rate limiter
EXTEND = protocol.table_path("big", "extend")


def request(server: Any, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
    kind = "application/json" if path == "/v1/tables" else protocol.ARROW_STREAM
    status, _, answer = server.request(
        method, path, body or None, {"Content-Type": kind}, timeout=60
    )
    return status, answer


def rows(n: int) -> bytes:
    x = torch.full((n, MiB), 7, dtype=torch.uint8)
    return encode(TensorDict({"x": x}, batch_size=[n])).to_pybytes()


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    # RSS is measured: a fresh process with none of the caller's allocator tuning,
    # nothing pooled, big arrays mmapped
    server = live_server(
        fresh=True, pooled_bytes=0, malloc_mmap_threshold=MiB, max_receiving_bytes=LIMIT
    )
    spec = {
        "name": "big",
        "capacity": 64,
        "fields": {"x": {"shape": [MiB], "dtype": "uint8"}},
        "backend": {"kind": "memory"},
        # two rows in, and every insert is held back until something is sampled
        "rate_limiter": {"min_size_to_sample": 1, "samples_per_insert": 1.0, "error_buffer": 1},
    }
    assert request(server, "POST", "/v1/tables", json.dumps(spec).encode())[0] == 201
    assert request(server, "POST", EXTEND, rows(2))[0] == 200
    return server


def test_waiting_extends_count_in_the_receiving_limit(server: Any) -> None:
    pid = server.proc.pid
    body = rows(1)
    path = f"{EXTEND}?timeout={WAIT}"
    assert request(server, "POST", f"{EXTEND}?timeout=0.2", body)[0] == 429  # one-time costs
    base = rss(pid)
    answers: list[tuple[int, bytes]] = []

    def extend() -> None:
        answers.append(request(server, "POST", path, body))

    threads = [threading.Thread(target=extend) for _ in range(CALLS)]
    for t in threads:
        t.start()
    peak = base
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss(pid))
        time.sleep(0.02)
    statuses = sorted(status for status, _ in answers)
    refused = [json.loads(a) for status, a in answers if status == 503]
    waited = statuses.count(429)  # held back until their timeout
    assert len(answers) == CALLS and waited + len(refused) == CALLS, statuses
    assert waited <= LIMIT // MiB, statuses  # no more wait than the limit holds rows of
    assert refused and all(
        a["type"] == "BackendError" and "--max-receiving-bytes" in a["detail"]
        and str(LIMIT) in a["detail"]
        for a in refused
    ), refused[:1]  # fmt: skip
    # what the waiting extends held: the limit's worth and the bodies on their way (9.5 to
    # 11.6 MiB measured), not one body per call (52.5 MiB before)
    assert peak - base < LIMIT + 12 * MiB, (peak - base) / MiB
    status, _ = request(server, "POST", protocol.table_path("big", "sample") + "?batch_size=2")
    assert status == 200  # the server goes on: a sample lets the next extend in
    assert request(server, "POST", EXTEND, body)[0] == 200
