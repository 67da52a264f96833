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

import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
from tensordict import TensorDict
from testkit import REPO, free_port

from tdreplay.codec import encode, protocol

MiB = 1 << 20
ITEM = 2 * MiB  # bytes of one row
ROWS = 16
BATCH = 8  # a batch of 16 MiB

#: ``tdreplay serve`` with automatic garbage collection off
SERVE = "import gc, sys; gc.disable(); from tdreplay.cli.serve import main; main(sys.argv[1:])"


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``, now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


class Server:
    def __init__(self, proc: subprocess.Popen, port: int) -> None:
        self.proc, self.port = proc, port

    def request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            headers = {"Content-Type": "application/json" if path == "/v1/tables" else ""}
            if body is not None and path != "/v1/tables":
                headers["Content-Type"] = protocol.ARROW_STREAM
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("cut-streams")
    port = free_port()
    # nor the caller's allocator tuning (CI keeps freed heap up to 256 MiB: MALLOC_TRIM_THRESHOLD_)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TDREPLAY_", "MALLOC_"))}
    argv = ["serve", "--host", "127.0.0.1", "--port", str(port), "--root", str(folder / "data")]
    # nothing pooled and big arrays mmapped: a body the server lets go of leaves its RSS
    argv += ["--log-level", "warning", "--pooled-bytes", "0", "--malloc-mmap-threshold", str(MiB)]
    with (folder / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-c", SERVE, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
        )
    server = Server(proc, port)
    try:
        wait_until(lambda: proc.poll() is not None or ready(server), timeout=60)
        assert proc.poll() is None, (folder / "server.log").read_text()
        spec = {
            "name": "big",
            "capacity": ROWS,
            "fields": {"x": {"shape": [ITEM], "dtype": "uint8"}},
            "backend": {"kind": "memory"},
        }
        assert server.request("POST", "/v1/tables", json.dumps(spec).encode())[0] == 201
        rows = TensorDict({"x": torch.full((ROWS, ITEM), 7, dtype=torch.uint8)}, batch_size=[ROWS])
        path = protocol.table_path("big", "extend")
        assert server.request("POST", path, encode(rows).to_pybytes())[0] == 200
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def ready(server: Server) -> bool:
    try:
        return server.request("GET", "/readyz")[0] == 200
    except OSError:
        return False


def stream_path(count: int | None = None) -> str:
    path = protocol.table_path("big", "stream") + f"?batch_size={BATCH}"
    return path if count is None else path + f"&count={count}"


def test_a_stream_cut_by_its_client_frees_its_batches(server: Server) -> None:
    status, body = server.request("POST", stream_path(count=3))  # one-time costs first
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
    status, body = server.request("POST", stream_path(count=2))  # the server goes on
    assert status == 200 and pa.ipc.open_stream(body).read_all().num_rows == 2 * BATCH
    del body
    # what the streams held goes with them: the cycle held ~6 batches (98 MiB); the
    # allocators may keep a batch or two of freed pages for reuse, no more
    wait_until(lambda: rss(pid) < base + 3 * BATCH * ITEM)
