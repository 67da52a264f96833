"""The HTTP-layer limits of ``tdreplay serve``, probed over raw sockets on a real server.

Each limit is hit once, with small limits so that each probe takes well under
a second, and the server is then checked to still extend and sample.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from tensordict import TensorDict

from tdreplay.cli import main as cli_main
from tdreplay.codec import decode, encode, protocol
from tdreplay.storage import TableSpec

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "schemas" / "cartpole.yaml"
EXTEND = protocol.table_path("cartpole", "extend")
SAMPLE = protocol.table_path("cartpole", "sample")
ARROW = {"Content-Type": protocol.ARROW_STREAM}

MAX_BODY = 1 << 20
MAX_HEADERS = 8192
HEADER_TIMEOUT = 0.5
BODY_TIMEOUT = 0.5
MAX_CONNECTIONS = 8
MAX_PIPELINED = 4


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    return live_server(
        "--schema",
        str(SCHEMA),
        backend="memory",
        max_body_bytes=MAX_BODY,
        max_header_bytes=MAX_HEADERS,
        header_timeout=HEADER_TIMEOUT,
        body_timeout=BODY_TIMEOUT,
        max_connections=MAX_CONNECTIONS,
        max_pipelined=MAX_PIPELINED,
    )


def rows(n: int) -> bytes:
    """``n`` rows of the cartpole table, encoded as an extend body."""
    td = TensorDict({}, batch_size=[n])
    for key, (shape, dtype) in TableSpec.from_file(SCHEMA).torch_schema().items():
        td.set(key, torch.ones(n, *shape, dtype=dtype))
    return encode(td).to_pybytes()


def still_serves(server: Any, deadline: float = 3.0) -> None:
    """An extend and a sample succeed (once the refused connection is gone)."""
    end = time.monotonic() + deadline
    while True:
        try:
            status, _, body = server.request("POST", EXTEND, rows(8), ARROW, timeout=5)
            if status != 503 or time.monotonic() > end:
                break
        except ConnectionError:
            if time.monotonic() > end:
                raise
        time.sleep(0.05)
    assert status == 200, body
    assert json.loads(body)["rows"] == 8
    status, _, body = server.request("POST", SAMPLE + "?batch_size=4", None, timeout=5)
    assert status == 200, body
    assert decode(body).batch_size[0] == 4


def connect(server: Any) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=5)


def answer(sock: socket.socket) -> tuple[int, dict[str, Any], bool]:
    """``(status, JSON body, closed)`` of the one response the server sends before closing."""
    data = b""
    closed = False
    while True:
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            closed = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next(
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            )
            if len(body) >= length:
                # the server closes after a refusal: wait for it
                sock.settimeout(3)
                closed = sock.recv(1) == b""
                break
    assert data, "no answer"
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.partition(b"\r\n\r\n")[2]), closed


def test_content_length_over_the_limit_is_refused_before_any_body(server: Any) -> None:
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(
        f"POST {EXTEND} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {protocol.ARROW_STREAM}\r\n"
        "Content-Length: 10000000000\r\n\r\n".encode()
    )
    status, body, closed = answer(sock)
    assert time.monotonic() - start < BODY_TIMEOUT  # answered at once, not timed out
    sock.close()
    assert status == 413 and closed
    assert body["type"] == "PayloadTooLarge" and body["field"] == "body"
    assert "--max-body-bytes" in body["detail"] and str(MAX_BODY) in body["detail"]
    still_serves(server)


def test_chunked_body_is_cut_off_at_the_limit(server: Any) -> None:
    sock = connect(server)
    chunk = b"%x\r\n%s\r\n" % (64 * 1024, b"\0" * (64 * 1024))
    sock.sendall(
        f"POST {EXTEND} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {protocol.ARROW_STREAM}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n".encode()
        + chunk * 20  # 1.25 MiB, never ended
    )
    status, body, closed = answer(sock)
    sock.close()
    assert status == 413 and closed
    assert body["type"] == "PayloadTooLarge" and "--max-body-bytes" in body["detail"]
    still_serves(server)


def test_a_body_within_the_limit_still_goes_through(server: Any) -> None:
    big = rows(MAX_BODY // 80)  # ~0.8 MiB of rows
    assert MAX_BODY // 2 < len(big) <= MAX_BODY
    status, _, body = server.request("POST", EXTEND, big, ARROW)
    assert status == 200, body
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    conn.request("POST", EXTEND, body=iter([big[:1000], big[1000:]]), headers=ARROW)
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    conn.close()


def test_oversized_headers_get_431(server: Any) -> None:
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 100 * 1024 + b"\r\n\r\n"
    )
    status, body, closed = answer(sock)
    sock.close()
    assert status == 431 and closed
    assert time.monotonic() - start < HEADER_TIMEOUT
    assert body["type"] == "InvalidRequest" and body["field"] == "headers"
    assert "--max-header-bytes" in body["detail"] and str(MAX_HEADERS) in body["detail"]
    still_serves(server)


def test_trailers_count_as_headers(server: Any) -> None:
    """A chunked body's trailer fields are headers the parser keeps: they were counted in no
    limit, and 300 MB of them, sent in 0.4 s, took the server's RSS up 300 MB before the
    body timeout (60 s by default) ended the request."""
    sock = connect(server)
    sock.sendall(
        f"POST {EXTEND} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {protocol.ARROW_STREAM}\r\n"
        "Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\n".encode()
    )
    line = b"X-Trailer: " + b"a" * 1000 + b"\r\n"
    try:
        for _ in range(4 * MAX_HEADERS // len(line)):
            sock.sendall(line)
    except ConnectionError:
        pass  # refused while sending
    status, body, closed = answer(sock)
    sock.close()
    assert status == 431 and closed, body
    assert body["field"] == "headers" and "--max-header-bytes" in body["detail"]
    still_serves(server)


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: 1\r\n"])
def test_stalled_headers_get_408(server: Any, sent: bytes) -> None:
    """Half the headers then nothing, or nothing at all: 408 once header_timeout has passed."""
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(sent)
    status, body, closed = answer(sock)
    elapsed = time.monotonic() - start
    sock.close()
    assert status == 408 and closed
    assert HEADER_TIMEOUT * 0.8 < elapsed < HEADER_TIMEOUT + 1.5
    assert body["field"] == "headers" and "--header-timeout" in body["detail"]
    still_serves(server)


def test_stalled_body_gets_408(server: Any) -> None:
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(
        f"POST {EXTEND} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {protocol.ARROW_STREAM}\r\n"
        "Content-Length: 100000\r\n\r\n".encode()
        + b"\0" * 5000
    )
    status, body, closed = answer(sock)
    elapsed = time.monotonic() - start
    sock.close()
    assert status == 408 and closed
    assert BODY_TIMEOUT * 0.8 < elapsed < BODY_TIMEOUT + 1.5
    assert body["field"] == "body" and "--body-timeout" in body["detail"]
    still_serves(server)


def test_idle_keep_alive_is_not_a_header_timeout(server: Any) -> None:
    """Between two requests on one connection only --keep-alive-timeout (5 s) runs."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
    for _ in range(2):
        conn.request("POST", EXTEND, body=rows(4), headers=ARROW)
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        resp.read()
        time.sleep(HEADER_TIMEOUT + 0.3)
    conn.close()


def test_an_idle_kept_alive_connection_is_closed_after_keep_alive_timeout(
    live_server: Any,
) -> None:
    """``--keep-alive-timeout`` (fixed at 5 s before): an answered connection idle this long
    is closed; a value that is no positive number stops the start, naming the flag's field."""
    keep_alive = 0.5
    server = live_server(keep_alive_timeout=keep_alive)
    sock = connect(server)
    start = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):  # until the server closes (5 s: recv times out)
        data += chunk
    elapsed = time.monotonic() - start
    sock.close()
    assert data.startswith(b"HTTP/1.1 200") and data.count(b"HTTP/1.1") == 1, data
    assert keep_alive * 0.8 < elapsed < keep_alive + 2
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit) as exc:
            cli_main(["serve", "--keep-alive-timeout", bad])
        assert "invalid settings: keep_alive_timeout" in str(exc.value.code), exc.value.code


def test_connections_beyond_the_cap_get_503(server: Any) -> None:
    held = [connect(server) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # well inside header_timeout: the held connections are still open
        sock = connect(server)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, body, closed = answer(sock)
        sock.close()
    finally:
        for s in held:
            s.close()
    assert status == 503 and closed
    assert "--max-connections" in body["detail"] and str(MAX_CONNECTIONS) in body["detail"]
    still_serves(server)


def test_requests_pipelined_past_the_limit_are_refused_after_those_before(server: Any) -> None:
    """A client that sends requests without reading the answers had each held (~1 KB): one
    connection sending 256 KiB of ``GET /nope`` took the server's RSS up 11 MB."""
    sock = connect(server)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 200)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except TimeoutError:
        pass
    sock.close()
    statuses = [int(status) for status in re.findall(rb"HTTP/1.1 (\d{3}) ", data)]
    # the one being answered, MAX_PIPELINED waiting behind it, then the refusal
    assert statuses == [200] * (1 + MAX_PIPELINED) + [400], statuses
    error = json.loads(data.rpartition(b"\r\n\r\n")[2])
    assert "--max-pipelined" in error["detail"] and error["field"] == "connection"
    still_serves(server)


def test_idempotency_memory_is_bounded_in_bytes(live_server: Any) -> None:
    server = live_server("--schema", str(SCHEMA), backend="memory", idempotency_bytes=20_000)
    body = rows(200)  # each answer: 1.6 kB of indices (int64)
    for i in range(40):
        status, headers, _ = server.request(
            "POST", EXTEND, body, {**ARROW, "X-Request-Id": f"r{i}"}
        )
        assert status == 200 and protocol.IDEMPOTENT_REPLAY.lower() not in headers
    # the newest are remembered, the oldest forgotten (they insert again)
    _, headers, _ = server.request("POST", EXTEND, body, {**ARROW, "X-Request-Id": "r39"})
    assert headers.get(protocol.IDEMPOTENT_REPLAY.lower()) == "true"
    _, headers, _ = server.request("POST", EXTEND, body, {**ARROW, "X-Request-Id": "r0"})
    assert protocol.IDEMPOTENT_REPLAY.lower() not in headers


def test_bodies_being_received_at_once_are_bounded(live_server: Any) -> None:
    """Before --max-receiving-bytes, 64 connections each sending 90% of a 64 MiB body held
    3.6 GB of the server's memory (1000 connections x 256 MiB bodies: 250 GB)."""
    budget = 600_000
    server = live_server(
        "--schema", str(SCHEMA), backend="memory", max_body_bytes=MAX_BODY,
        max_receiving_bytes=budget,
    )  # fmt: skip
    head = (
        f"POST {EXTEND} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {protocol.ARROW_STREAM}\r\n"
        "Content-Length: {}\r\n\r\n"
    )
    held = connect(server)
    held.sendall(head.format(500_000).encode() + b"\0" * 1000)  # counted whole, sent slowly
    try:
        time.sleep(0.1)  # the server has read its headers
        sock = connect(server)
        sock.sendall(head.format(200_000).encode())
        status, body, closed = answer(sock)
        sock.close()
        assert status == 503 and closed and body["type"] == "BackendError"
        assert "--max-receiving-bytes" in body["detail"] and str(budget) in body["detail"]
    finally:
        held.close()
    sock = connect(server)  # one body larger than all may take together: never
    sock.sendall(head.format(800_000).encode())
    status, body, closed = answer(sock)
    sock.close()
    assert status == 413 and closed and "--max-receiving-bytes" in body["detail"]
    still_serves(server)  # the held body's bytes were given back when its connection closed


def test_json_nested_too_deeply_is_a_clear_400(server: Any) -> None:
    json_type = {"Content-Type": "application/json"}
    for nested in [b"[" * 100_000, b'{"a": ' * 50_000]:
        status, _, body = server.request("POST", "/v1/tables", nested, json_type)
        assert status == 400, body
        error = json.loads(body)
        assert error["type"] == "InvalidRequest" and error["field"] == "body"
        assert "JSON body" in error["detail"] and "nested too deeply" in error["detail"]
    still_serves(server)
