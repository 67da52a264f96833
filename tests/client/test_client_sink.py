"""Answers poured into a sink (an export streamed into a file): both transports, every
framing, answers that arrive in pieces, slow answers (the timeout bounds each wait for
bytes, not the transfer), stalled ones, and a sink that fails."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tdreplay.client.aio_transport import AsyncTransport
from tdreplay.client.commands import Request, Response
from tdreplay.client.errors import Timeout
from tdreplay.client.settings import ClientSettings
from tdreplay.client.transport import Transport

BODY = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB: several pieces of 1 MiB


def _chunked(body: bytes, size: int) -> bytes:
    parts = [
        b"%x\r\n%s\r\n" % (len(body[i : i + size]), body[i : i + size])
        for i in range(0, len(body), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


ANSWERS = {
    "length": b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY,
    "chunked": b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + _chunked(BODY, 300_000),
    "to the end": b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" + BODY,
}


def serve(pieces: list[bytes], pause: float = 0.0) -> tuple[socket.socket, int]:
    """A server that reads one request and writes ``pieces`` with ``pause`` between them."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def run() -> None:
        conn, _ = srv.accept()
        with conn, contextlib.suppress(OSError):  # the client may drop the connection
            conn.recv(65536)
            for piece in pieces:
                conn.sendall(piece)
                time.sleep(pause)

    threading.Thread(target=run, daemon=True).start()
    return srv, srv.getsockname()[1]


def split(answer: bytes, n: int) -> list[bytes]:
    """``answer`` in ``n`` pieces, cut at odd places (inside the head, a size line, a chunk)."""
    step = len(answer) // n + 1
    return [answer[i : i + step] for i in range(0, len(answer), step)]


class Collect:
    def __init__(self, fail_after: int | None = None) -> None:
        self.parts: list[bytes] = []
        self.fail_after = fail_after

    def __call__(self, piece: memoryview) -> None:
        if self.fail_after is not None and sum(map(len, self.parts)) >= self.fail_after:
            raise OSError(28, "No space left on device")
        self.parts.append(bytes(piece))

    @property
    def body(self) -> bytes:
        return b"".join(self.parts)


def execute(twin: str, port: int, req: Request, timeout: float = 5.0) -> Response:
    url = f"http://127.0.0.1:{port}"
    if twin == "sync":
        return Transport(url, ClientSettings((url,), timeout=timeout)).execute(req)

    async def main() -> Response:
        transport = AsyncTransport(url, ClientSettings((url,), timeout=timeout))
        try:
            return await transport.execute(req)
        finally:
            await transport.aclose()

    return asyncio.run(main())


@pytest.fixture(params=["sync", "async"])
def twin(request: pytest.FixtureRequest) -> Iterator[str]:
    yield request.param


@pytest.mark.parametrize("framing", list(ANSWERS))
@pytest.mark.parametrize("pieces", [1, 37])
def test_every_framing_is_poured_whole(twin: str, framing: str, pieces: int) -> None:
    srv, port = serve(split(ANSWERS[framing], pieces))
    sink = Collect()
    with srv:
        r = execute(twin, port, Request("GET", "/export", sink=sink))
    assert r.status == 200 and bytes(r.body) == b""
    assert sink.body == BODY
    assert max(map(len, sink.parts)) <= 1 << 20  # at most a piece at a time


def test_an_error_answer_is_not_poured(twin: str) -> None:
    body = b'{"type": "TableNotFound", "detail": "no table"}'
    answer = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    srv, port = serve([answer])
    sink = Collect()
    with srv:
        r = execute(twin, port, Request("GET", "/export", sink=sink))
    assert r.status == 404 and bytes(r.body) == body and sink.parts == []


def test_a_slow_answer_is_bounded_per_piece_not_in_all(twin: str) -> None:
    """Pieces every 0.3 s for ~3 s under a 1 s timeout: the transfer outlasts the timeout,
    no wait for bytes does."""
    srv, port = serve(split(ANSWERS["length"], 10), pause=0.3)
    sink = Collect()
    with srv:
        r = execute(twin, port, Request("GET", "/export", sink=sink), timeout=1.0)
    assert r.status == 200 and sink.body == BODY


def test_a_stalled_answer_times_out(twin: str) -> None:
    answer = ANSWERS["length"]
    srv, port = serve([answer[: len(answer) // 2]], pause=5.0)
    with srv, pytest.raises(Timeout):
        execute(twin, port, Request("GET", "/export", sink=Collect()), timeout=0.5)


def test_a_failing_sink_fails_the_call(twin: str) -> None:
    """A full disk is the caller's error, raised as it came (not a transport failure that a
    plan would retry), and the connection is dropped, never pooled mid-body."""
    srv, port = serve(split(ANSWERS["length"], 5), pause=0.05)
    url = f"http://127.0.0.1:{port}"
    sink = Collect(fail_after=1 << 20)
    with srv, pytest.raises(OSError, match="No space left") as err:
        if twin == "sync":
            transport: Any = Transport(url, ClientSettings((url,), timeout=5))
            try:
                transport.execute(Request("GET", "/export", sink=sink))
            finally:
                assert not transport._idle
        else:

            async def main() -> None:
                transport = AsyncTransport(url, ClientSettings((url,), timeout=5))
                try:
                    await transport.execute(Request("GET", "/export", sink=sink))
                finally:
                    assert not transport._idle._pool()  # this loop's idle connections

            asyncio.run(main())
    assert type(err.value) is OSError and err.value.errno == 28
