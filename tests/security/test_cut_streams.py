"""A stream whose client hangs up frees what it held at once, not at the next garbage collection.

The server here runs with Python's automatic garbage collection off, so only
what reference counting frees leaves its RSS. Before, Starlette's streamed
answer cancelled its body when the client went, and anyio kept that
cancellation in a reference cycle with every frame it went through: two cut
streams of 16 MiB batches left 100 MiB held until a cyclic collection (never,
here; rarely, once a busy server has promoted the cycle to the oldest
generation).
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict
from testkit import rss

from tdreplay.codec import encode, protocol

MiB = 1 << 20
ITEM = 2 * MiB  # bytes of one row
ROWS = 16
BATCH = 8  # a batch of 16 MiB


def wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


def post(server: Any, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    kind = "application/json" if path == "/v1/tables" else protocol.ARROW_STREAM
    headers = {"Content-Type": kind} if body is not None else {}
    status, _, answer = server.request("POST", path, body, headers)
    return status, answer


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    # a fresh process: no garbage collection, none of the caller's allocator tuning (CI
    # keeps freed heap up to 256 MiB: MALLOC_TRIM_THRESHOLD_); nothing pooled and big
    # arrays mmapped: a body the server lets go of leaves its RSS
    server = live_server(fresh=True, gc=False, pooled_bytes=0, malloc_mmap_threshold=MiB)
    spec = {
        "name": "big",
        "capacity": ROWS,
        "fields": {"x": {"shape": [ITEM], "dtype": "uint8"}},
        "backend": {"kind": "memory"},
    }
    assert post(server, "/v1/tables", json.dumps(spec).encode())[0] == 201
    rows = TensorDict({"x": torch.full((ROWS, ITEM), 7, dtype=torch.uint8)}, batch_size=[ROWS])
    assert post(server, protocol.table_path("big", "extend"), encode(rows).to_pybytes())[0] == 200
    return server


def stream_path(count: int | None = None) -> str:
    path = protocol.table_path("big", "stream") + f"?batch_size={BATCH}"
    return path if count is None else path + f"&count={count}"


def test_a_stream_cut_by_its_client_frees_its_batches(server: Any) -> None:
    status, body = post(server, stream_path(count=3))  # one-time costs first
    assert status == 200 and pa.ipc.open_stream(body).read_all().num_rows == 3 * BATCH
    del body
    pid = server.proc.pid
    base = rss(pid)
    socks = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        request = f"POST {stream_path()} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
        sock.sendall(request.encode())
        socks.append(sock)
    for sock in socks:
        assert sock.recv(4096)  # the stream is under way (blocked on a client not reading) ...
    wait_until(lambda: rss(pid) > base + 2 * BATCH * ITEM)
    for sock in socks:
        sock.close()  # ... and its client hangs up
    status, body = post(server, stream_path(count=2))  # the server goes on
    assert status == 200 and pa.ipc.open_stream(body).read_all().num_rows == 2 * BATCH
    del body
    # what the streams held goes with them: the cycle held ~6 batches (98 MiB); the
    # allocators may keep a batch or two of freed pages for reuse, no more
    wait_until(lambda: rss(pid) < base + 3 * BATCH * ITEM)
