"""How the server frames HTTP/1.1 requests it cannot take, probed over raw sockets.

A request the parser refuses (a malformed chunk size, two Content-Lengths, a NUL in a
header) is answered with the protocol's JSON error naming what is wrong, and runs
nothing: a ``clear`` whose body turned out malformed in the same read used to run
while its client read ``400 Invalid HTTP request received.`` (text). A request with
``Connection: Upgrade`` (``curl --http2`` sends ``Upgrade: h2c``) used to have its
body skipped by the parser and then parsed as the next request (request smuggling);
a server that upgrades to nothing now refuses one with a body and parses what
follows one without. Two ``Host`` headers, which the Host check and the app read
differently (the last, the first), are a 400 (RFC 9112 3.2), and so is an HTTP/1.1
request with none (it was served); an ``Expect`` but ``100-continue`` is a 417 (RFC 9110
10.1.1; it was ignored and the request ran). A request sent whole before its client ends
its side (``shutdown(SHUT_WR)``) is answered, then the connection closed: it ran unanswered.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

import pytest
import testkit

from tdreplay.codec import encode, protocol

SPEC = {
    "name": "t",
    "capacity": 32,
    "fields": dict(testkit.FIELDS),
    "backend": {"kind": "memory"},
}
CLEAR = protocol.table_path("t", "clear")
HOST = b"Host: 127.0.0.1\r\n"


@pytest.fixture(scope="module")
def server(live_server: Any) -> Any:
    server = live_server()
    status, _, body = server.request(
        "POST", protocol.TABLES, json.dumps(SPEC).encode(), {"Content-Type": protocol.JSON}
    )
    assert status == 201, body
    return server


def fill(server: Any) -> None:
    """Eight rows in table ``t``."""
    status, _, body = server.request(
        "POST",
        protocol.table_path("t", "extend"),
        encode(testkit.rows(0, 8)).to_pybytes(),
        {"Content-Type": protocol.ARROW_STREAM},
    )
    assert status == 200, body


def size(server: Any) -> int:
    status, _, body = server.request("GET", protocol.table_path("t"))
    assert status == 200, body
    return json.loads(body)["size"]


def exchange(
    server: Any, *pieces: bytes, wait: float = 1.0, half_close: bool = False
) -> list[tuple[int, bytes]]:
    """Send ``pieces`` (a pause between them) on one connection (then end its sending side,
    with ``half_close``); the ``(status, body)`` of each response read until the server
    closes or ``wait`` seconds pass without a byte (with ``half_close``: until it closes)."""
    sock = socket.create_connection((server.host, server.port), timeout=wait)
    data = b""
    try:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.2)
            sock.sendall(piece)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except (TimeoutError, ConnectionResetError):
        assert not half_close, f"the server kept a half-closed connection open: {data!r}"
    finally:
        sock.close()
    answers = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.split(b"\r\n")
        length = next(
            int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length")
        )
        answers.append((int(lines[0].split(b" ")[1]), rest[:length]))
        data = rest[length:]
    return answers


@pytest.mark.parametrize(
    "request_, reason",
    [
        (b"Transfer-Encoding: chunked\r\n\r\nzz\r\n", "Invalid character in chunk size"),
        (b"Content-Length: 0\r\nContent-Length: 5\r\n\r\nhello", "Duplicate Content-Length"),
        (b"Content-Length: -1\r\n\r\n", "Invalid character in Content-Length"),
        (b"Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n{}", "Transfer-Encoding"),
        (b"X-A: b\x00c\r\n\r\n", "Invalid header value char"),
    ],
    ids=["chunk-size", "two-lengths", "negative-length", "length-and-chunked", "nul"],
)
def test_a_malformed_request_gets_a_json_400_and_runs_nothing(
    server: Any, request_: bytes, reason: str
) -> None:
    fill(server)
    before = size(server)
    answers = exchange(server, b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + HOST + request_)
    assert [status for status, _ in answers] == [400]
    body = json.loads(answers[0][1])
    assert body["type"] == "InvalidRequest" and body["field"] == "request"
    assert "malformed HTTP/1.1 request" in body["detail"] and reason in body["detail"]
    time.sleep(0.3)  # a clear that ran anyway would have ended by now
    assert size(server) == before


def test_an_upgrade_with_a_body_is_refused_and_its_body_is_no_request(server: Any) -> None:
    fill(server)
    before = size(server)
    smuggled = b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + HOST + b"\r\n"
    head = (
        b"POST " + protocol.TABLES.encode() + b" HTTP/1.1\r\n" + HOST
        + b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
        + b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
    )  # fmt: skip
    for pieces in ([head + smuggled], [head, smuggled]):
        answers = exchange(server, *pieces)
        assert [status for status, _ in answers] == [400], answers
        body = json.loads(answers[0][1])
        assert "Upgrade" in body["detail"] and body["field"] == "Upgrade"
        assert size(server) == before


def test_what_follows_an_upgrade_without_a_body_is_the_next_request(server: Any) -> None:
    upgrade = b"GET /healthz HTTP/1.1\r\n" + HOST + b"Connection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    answers = exchange(server, upgrade + b"GET /readyz HTTP/1.1\r\n" + HOST + b"\r\n")
    assert [status for status, _ in answers] == [200, 200]
    assert json.loads(answers[1][1])["status"] == "ready"


@pytest.mark.parametrize(
    "te",
    [b"Transfer-Encoding: gzip, chunked", b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked"],
    ids=["one-header", "two-headers"],
)
def test_a_transfer_coding_but_chunked_is_a_501_and_runs_nothing(server: Any, te: bytes) -> None:
    # a gzip body would reach the routes as it came (the parser decodes chunked only)
    fill(server)
    before = size(server)
    head = b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + HOST + te + b"\r\n\r\n"
    answers = exchange(server, head + b"0\r\n\r\n")
    assert [status for status, _ in answers] == [501], answers
    body = json.loads(answers[0][1])
    assert body["field"] == "Transfer-Encoding" and "decodes 'chunked' only" in body["detail"]
    assert body["got"] == "gzip, chunked"
    time.sleep(0.3)  # a clear that ran anyway would have ended by now
    assert size(server) == before
    # chunked alone, in any case, is served
    ok = b"GET /readyz HTTP/1.1\r\n" + HOST + b"Transfer-Encoding: Chunked\r\n\r\n0\r\n\r\n"
    assert [status for status, _ in exchange(server, ok)] == [200]


def test_two_host_headers_are_a_400(server: Any) -> None:
    fill(server)
    before = size(server)
    two = b"Host: rebound.example\r\n" + HOST
    answers = exchange(server, b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + two + b"\r\n")
    assert [status for status, _ in answers] == [400]
    body = json.loads(answers[0][1])
    assert body["field"] == "Host" and "Host" in body["detail"]
    assert size(server) == before


@pytest.mark.parametrize(
    "refused, status",
    [(b"X-A: \x00\r\n\r\n", 400), (b"Content-Length: 99999999999\r\n\r\n", 413)],
    ids=["malformed", "too-large"],
)
def test_a_refused_pipelined_request_is_answered_after_those_before_it(
    server: Any, refused: bytes, status: int
) -> None:
    fill(server)
    pipelined = [
        b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + HOST + b"\r\n",
        b"GET /readyz HTTP/1.1\r\n" + HOST + b"\r\n",
        b"POST /readyz HTTP/1.1\r\n" + HOST + refused,
    ]
    answers = exchange(server, b"".join(pipelined))
    assert [s for s, _ in answers] == [200, 200, status], answers
    assert json.loads(answers[0][1])["size"] == 0 == size(server)
    assert json.loads(answers[1][1])["status"] == "ready"
    assert "--max-body-bytes" in answers[2][1].decode() or "malformed" in answers[2][1].decode()


def test_an_http11_request_without_host_is_a_400_and_runs_nothing(server: Any) -> None:
    fill(server)
    before = size(server)
    answers = exchange(server, b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n\r\n")
    assert [status for status, _ in answers] == [400], answers
    body = json.loads(answers[0][1])
    assert body["field"] == "Host" and "without a Host header" in body["detail"]
    time.sleep(0.3)  # a clear that ran anyway would have ended by now
    assert size(server) == before
    # HTTP/1.0 may lack it; an empty Host is a Host (RFC 9112 3.2: a target with no authority)
    for ok in (b"GET /readyz HTTP/1.0\r\n\r\n", b"GET /readyz HTTP/1.1\r\nHost:\r\n\r\n"):
        assert [status for status, _ in exchange(server, ok)] == [200], ok


@pytest.mark.parametrize("expect", [b"200-ok", b"100-continue, x-more"])
def test_an_expectation_but_100_continue_is_a_417_and_runs_nothing(
    server: Any, expect: bytes
) -> None:
    fill(server)
    before = size(server)
    head = b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + HOST + b"Expect: " + expect
    answers = exchange(server, head + b"\r\n\r\n")
    assert [status for status, _ in answers] == [417], answers
    body = json.loads(answers[0][1])
    assert body["field"] == "Expect" and body["got"] == expect.decode()
    assert body["expected"] == "100-continue"
    time.sleep(0.3)  # a clear that ran anyway would have ended by now
    assert size(server) == before
    # 100-continue, in any case, is served
    ok = b"GET /readyz HTTP/1.1\r\n" + HOST + b"Expect: 100-Continue\r\n\r\n"
    assert [status for status, _ in exchange(server, ok)] == [200]


@pytest.mark.parametrize(
    "body",
    [b"", b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"],
    ids=["no-body", "body"],
)
def test_a_request_sent_whole_before_the_clients_fin_is_run_and_answered(
    server: Any, body: bytes
) -> None:
    # shutdown(SHUT_WR) right after the request: it ran, its answer was dropped with the
    # connection; now it is answered, then the connection is closed (exchange checks that)
    fill(server)
    request = b"POST " + CLEAR.encode() + b" HTTP/1.1\r\n" + HOST + (body or b"\r\n")
    answers = exchange(server, request, wait=10, half_close=True)
    assert [status for status, _ in answers] == [200], answers
    assert json.loads(answers[0][1])["size"] == 0 == size(server)
    # requests pipelined before the end are all answered, in order; a head cut short by the
    # end is dropped
    ready = b"GET /readyz HTTP/1.1\r\n" + HOST + b"\r\n"
    answers = exchange(server, ready * 3 + b"GET /readyz HT", wait=10, half_close=True)
    assert [status for status, _ in answers] == [200] * 3, answers
    # and so is a refusal due after them (past --max-pipelined: 64 waiting behind the first)
    answers = exchange(server, ready * 70, wait=10, half_close=True)
    assert [status for status, _ in answers] == [200] * 65 + [400], answers
    # a sample the rate limiter holds back (the table is empty) takes the end as its caller
    # leaving, as it takes a close (the two send the same FIN): 429 at once, not after 30 s
    sample = protocol.table_path("t", "sample") + "?batch_size=1&timeout=30"
    request = b"POST " + sample.encode() + b" HTTP/1.1\r\n" + HOST + b"\r\n"
    answers = exchange(server, request, wait=10, half_close=True)
    assert [status for status, _ in answers] == [429], answers
    assert b"left while the rate limiter held it back" in answers[0][1]
