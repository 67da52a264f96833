"""``--send-timeout``: a client that stops taking its answer loses its connection, on a real server.

Before the limit, a sample whose answer was never read kept its connection
and its leased sample body for as long as the client held the socket (uvicorn
wrote the whole body into the transport, which waits for the client; its
keep-alive close waits for that too); a stream never read waited forever for
room to write; so did a shared-memory answer its client stopped reading.
Only ``--max-connections`` (and ``--shm-max-connections``) bounded them.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import termios
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.codec import decode, encode, protocol
from tdreplay.codec.shm import HEADER, VERSION, frame, release_frame

MiB = 1 << 20
ITEM = 2 * MiB  # bytes of one row
ROWS = 16  # the table's rows: a sample of all of them is a 32 MiB answer
SEND_TIMEOUT = 1.0  # long enough for a loaded machine to build the answers it holds


def rss(pid: int) -> int:
    """Resident bytes of process ``pid``, now."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def holds(pid: int, socks: list[socket.socket]) -> bool:
    """Whether process ``pid`` still holds the far end of any of ``socks`` (a socket of its
    own whose peer is one of their ports): the server closed a connection when it does not.
    (Its descriptor count alone is no sign: another connection of its closing meanwhile
    would pass for one of these, which a drain would then read whole.)"""
    ports = {sock.getsockname()[1] for sock in socks}
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                cols = line.split()
                if cols[9] in inodes and int(cols[2].rsplit(":", 1)[1], 16) in ports:
                    return True
    return False


def wait_until(condition: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    # nothing pooled and big arrays mmapped: a body the server lets go of leaves its RSS
    server = live_server(send_timeout=SEND_TIMEOUT, pooled_bytes=0, malloc_mmap_threshold=MiB)
    spec = {
        "name": "big",
        "capacity": ROWS,
        "fields": {"x": {"shape": [ITEM], "dtype": "uint8"}},
        "backend": {"kind": "memory"},
    }
    status, _, body = server.request(
        "POST", "/v1/tables", json.dumps(spec).encode(), {"Content-Type": "application/json"}
    )
    assert status == 201, body
    rows = TensorDict({"x": torch.full((ROWS, ITEM), 7, dtype=torch.uint8)}, batch_size=[ROWS])
    status, _, body = server.request(
        "POST",
        protocol.table_path("big", "extend"),
        encode(rows).to_pybytes(),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200, body
    return server


def ask(server: Any, request: bytes, *, window: int | None = None) -> socket.socket:
    """A raw connection that sent ``request`` (and reads nothing yet); ``window``: its
    receive buffer, fixed (else the kernel grows it: loopback can take a whole answer)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if window is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
    sock.settimeout(10)
    sock.connect((server.host, server.port))
    sock.sendall(request)
    return sock


def sample_request(n: int) -> bytes:
    path = protocol.table_path("big", "sample")
    return f"POST {path}?batch_size={n} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n".encode()


def drain(sock: socket.socket) -> int:
    """Bytes the socket yields until the server's close (EOF or reset)."""
    got = 0
    while True:
        try:
            chunk = sock.recv(MiB)
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += len(chunk)


def sampled(server: Any) -> int:
    """Items the table ``big`` has handed out so far (counted as each answer is built)."""
    status, _, body = server.request("GET", protocol.table_path("big"))
    assert status == 200
    return int(json.loads(body)["samples"])


def still_samples(server: Any, n: int = 2) -> None:
    path = protocol.table_path("big", "sample") + f"?batch_size={n}"
    status, _, body = server.request("POST", path)
    assert status == 200
    assert int(decode(body)["x"][-1, -1]) == 7


def test_answers_never_read_are_cut(server: Any) -> None:
    answer = ROWS * ITEM
    still_samples(server, ROWS)  # the first sample's one-time costs are not what is measured
    base, open_fds, before = rss(server.proc.pid), fds(server.proc.pid), sampled(server)
    socks = [ask(server, sample_request(ROWS), window=64 << 10) for _ in range(4)]
    try:
        # every answer is built (an answer built after the others were cut would go out
        # whole to the client that reads it below, uncut, since it reads)
        wait_until(lambda: sampled(server) >= before + 4 * ROWS)
        # the answers are held, whole, for clients that read none of them (at least two at
        # once: on a loaded machine the first may be cut before the last is built) ...
        wait_until(lambda: rss(server.proc.pid) > base + 2 * answer)
        # ... until --send-timeout: then the connections are closed
        wait_until(lambda: not holds(server.proc.pid, socks))
        wait_until(lambda: fds(server.proc.pid) <= open_fds)
        # and what they held is freed, the layouts' scratch too (less than one answer left)
        wait_until(lambda: rss(server.proc.pid) < base + answer)
        for sock in socks:
            assert drain(sock) < answer  # cut: the client never gets the rest
    finally:
        for sock in socks:
            sock.close()
    still_samples(server, ROWS)


def test_a_slow_reader_that_keeps_reading_is_not_cut(server: Any) -> None:
    n = 4
    sock = ask(server, sample_request(n))
    data = bytearray()
    began = time.monotonic()
    with sock:
        while not data.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00"):  # Arrow's end of stream
            time.sleep(SEND_TIMEOUT / 4)  # never taking nothing for --send-timeout
            chunk = sock.recv(MiB)
            assert chunk, f"cut after {len(data)} bytes"
            data += chunk
    assert time.monotonic() - began > SEND_TIMEOUT  # slower than the timeout as a whole
    batch = decode(bytes(data.partition(b"\r\n\r\n")[2]))
    assert batch.batch_size[0] == n and int(batch["x"][-1, -1]) == 7


def test_a_stream_never_read_is_cut(server: Any) -> None:
    base = fds(server.proc.pid)
    path = protocol.table_path("big", "stream")
    head = f"POST {path}?batch_size=4 HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n"
    sock = ask(server, head.encode())
    with sock:
        wait_until(lambda: fds(server.proc.pid) > base)
        wait_until(lambda: fds(server.proc.pid) <= base)  # the server closed it
        first = sock.recv(64)
        assert first.startswith(b"HTTP/1.1 200"), first  # a stream, not a refusal
        assert drain(sock) > 0  # what the kernel buffers held, then the end
    still_samples(server)


def test_a_shm_client_that_stops_reading_is_ended(server: Any) -> None:
    if not hasattr(os, "memfd_create"):
        pytest.skip("needs memfd_create")
    base = fds(server.proc.pid)
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(server.root / "run" / "tdreplay.sock"))
        sock.sendall(frame({"op": "hello", "version": VERSION}))
        (n,) = HEADER.unpack(sock.recv(HEADER.size))
        assert json.loads(sock.recv(n))["ok"] is True
        # requests answered at once, none of the answers read: the server's socket fills up
        for _ in range(100_000):
            queued = waiting(sock)
            sock.sendall(release_frame(0))
            end = time.monotonic() + 1.0
            while waiting(sock) == queued and time.monotonic() < end:
                time.sleep(0.001)
            if waiting(sock) == queued:  # this answer did not come: the server waits to send it
                break
        else:
            raise AssertionError("the server's socket never filled up")
        wait_until(lambda: fds(server.proc.pid) <= base)  # ended after --send-timeout
        assert drain(sock) >= queued  # the answers it had sent, then the end
    still_samples(server)


def waiting(sock: socket.socket) -> int:
    """Bytes queued on ``sock`` for reading."""
    return struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0" * 4))[0]
