"""Both transports against a small in-process HTTP/1.1 server: pooling, bodies, failures."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tdreplay.client import ConnectionFailed, ProtocolError, Timeout
from tdreplay.client.aio_transport import AsyncTransport
from tdreplay.client.commands import Request
from tdreplay.client.settings import ClientSettings
from tdreplay.client.transport import Transport

BIG = bytes(range(256)) * 4096  # 1 MiB


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    release: threading.Event
    peers: set[tuple[str, int]]

    def log_message(self, *args: object) -> None:
        pass

    def _send(
        self, status: int, body: bytes, ctype: str = "application/json", **extra: str
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra.items():
            self.send_header(k.replace("_", "-"), v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.peers.add(self.client_address)
        if self.path == "/echo-headers":
            self._send(200, json.dumps(dict(self.headers)).encode())
        elif self.path == "/big":
            self._send(200, BIG, "application/octet-stream")
        elif self.path == "/chunked":
            self.send_response(200)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for part in (b"hello ", b"chunked ", b"world"):
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
        elif self.path == "/slow":
            self.release.wait(10)
            self._send(200, b"{}")
        elif self.path == "/close":
            self._send(200, b'{"closing": true}', Connection="close")
            self.close_connection = True
        elif self.path == "/empty":
            self.send_response(204)
            self.end_headers()
        elif self.path == "/missing":
            self._send(
                404, json.dumps({"type": "TableNotFound", "detail": "no table 'x'"}).encode()
            )
        else:
            self._send(200, b'{"ok": true}')

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(n)
        self._send(200, json.dumps({"got": len(body), "sum": sum(body) % 65521}).encode())


@pytest.fixture
def server() -> Iterator[tuple[str, type[Handler]]]:
    handler = type("H", (Handler,), {"release": threading.Event(), "peers": set()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", handler
    handler.release.set()
    httpd.shutdown()
    httpd.server_close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_keep_alive_pool_reuses_one_connection(server: tuple[str, type[Handler]]) -> None:
    url, handler = server
    t = Transport(url, ClientSettings((url,), token="sekrit"))
    for _ in range(5):
        r = t.execute(Request("GET", "/echo-headers"))
        assert r.status == 200
    headers = r.json()
    assert headers["Authorization"] == "Bearer sekrit"
    assert len(handler.peers) == 1  # five calls, one connection
    t.close()


def test_body_lands_in_the_callers_buffer(server: tuple[str, type[Handler]]) -> None:
    url, _ = server
    buf = bytearray(len(BIG) + 100)

    def alloc(n: int) -> memoryview:
        return memoryview(buf)[10 : 10 + n]

    r = Transport(url).execute(Request("GET", "/big", alloc=alloc))
    assert r.body.obj is buf and bytes(r.body) == BIG


def test_post_body_and_chunked_answers(server: tuple[str, type[Handler]]) -> None:
    url, _ = server
    t = Transport(url)
    payload = bytes(range(256)) * 1000
    r = t.execute(Request("POST", "/post", body=memoryview(payload)))
    assert r.json() == {"got": len(payload), "sum": sum(payload) % 65521}
    assert bytes(t.execute(Request("GET", "/chunked")).body) == b"hello chunked world"
    assert t.execute(Request("GET", "/close")).json() == {"closing": True}
    assert t.execute(Request("GET", "/")).json() == {"ok": True}  # reconnects


def test_bodiless_answers_free_the_connection(server: tuple[str, type[Handler]]) -> None:
    url, handler = server
    t = Transport(url)
    for path in ("/empty", "/missing", "/", "/empty", "/"):
        t.execute(Request("GET", path))
    assert len(handler.peers) == 1


def test_refused_connection_is_connection_failed() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    t = Transport(url, ClientSettings((url,), connect_timeout=2))
    with pytest.raises(ConnectionFailed) as info:
        t.execute(Request("GET", "/"))
    assert info.value.sent is False


def test_read_timeout(server: tuple[str, type[Handler]]) -> None:
    url, _ = server
    t = Transport(url, ClientSettings((url,), timeout=0.2))
    with pytest.raises(Timeout):
        t.execute(Request("GET", "/slow"))


def test_stale_pooled_connection_is_replaced(server: tuple[str, type[Handler]]) -> None:
    url, _ = server
    t = Transport(url)
    t.execute(Request("GET", "/"))
    conn = t._idle[0]
    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_RDWR)  # as if the server had dropped the idle connection
    assert t.execute(Request("GET", "/")).json() == {"ok": True}


def test_garbage_is_a_protocol_error() -> None:
    srv, port = scripted_server(b"SMTP ready\r\n\r\n")
    with srv, pytest.raises(ProtocolError):
        Transport(f"http://127.0.0.1:{port}").execute(Request("GET", "/"))


def test_async_transport(server: tuple[str, type[Handler]]) -> None:
    url, handler = server

    async def main() -> None:
        t = AsyncTransport(url, ClientSettings((url,), token="tok", timeout=0.3))
        r = await t.execute(Request("GET", "/echo-headers"))
        assert r.json()["Authorization"] == "Bearer tok"
        assert bytes((await t.execute(Request("GET", "/big"))).body) == BIG
        assert bytes((await t.execute(Request("GET", "/chunked"))).body) == b"hello chunked world"
        payload = b"x" * 300_000
        r = await t.execute(Request("POST", "/p", body=memoryview(payload)))
        assert r.json()["got"] == len(payload)
        assert (await t.execute(Request("GET", "/missing"))).status == 404
        assert (await t.execute(Request("GET", "/empty"))).status == 204
        assert len(handler.peers) == 1
        with pytest.raises(Timeout):
            await t.execute(Request("GET", "/slow"))
        await t.aclose()
        bad = AsyncTransport(f"http://127.0.0.1:{closed_port()}")
        with pytest.raises(ConnectionFailed):
            await bad.execute(Request("GET", "/"))

    asyncio.run(main())
    srv, port = scripted_server(b"SMTP ready\r\n\r\n")

    async def garbage() -> None:
        with pytest.raises(ProtocolError):
            await AsyncTransport(f"http://127.0.0.1:{port}").execute(Request("GET", "/"))

    with srv:
        asyncio.run(garbage())


def scripted_server(answer: bytes, *, close: bool = True) -> tuple[socket.socket, int]:
    """A server that reads one request and writes ``answer`` as it is (then closes)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def serve() -> None:
        conn, _ = srv.accept()
        conn.recv(65536)
        conn.sendall(answer)
        if close:
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


@pytest.mark.parametrize(
    ("answer", "status", "body"),
    [
        # an informational answer first: the real one follows
        (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            200,
            b"ok",
        ),
        # no length, not chunked: the body runs to the end of the connection
        (b"HTTP/1.1 200 OK\r\nContent-Type: x\r\n\r\nto the end", 200, b"to the end"),
        # chunk extensions and trailers
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: 1\r\n\r\n",
            200,
            b"abcde",
        ),
        (b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n", 404, b""),
    ],
)
def test_answers_the_parser_must_read(answer: bytes, status: int, body: bytes) -> None:
    srv, port = scripted_server(answer)
    with srv:
        r = Transport(f"http://127.0.0.1:{port}").execute(Request("GET", "/"))
    assert (r.status, bytes(r.body)) == (status, body)


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA",  # more than one answer
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nX: " + b"a" * (1 << 20) + b"\r\n\r\n",  # a head over 1 MiB
    ],
)
def test_malformed_answers_are_protocol_errors(answer: bytes) -> None:
    srv, port = scripted_server(answer, close=False)
    with srv, pytest.raises(ProtocolError):
        url = f"http://127.0.0.1:{port}"
        Transport(url, ClientSettings((url,), timeout=5)).execute(Request("GET", "/"))


def test_an_answer_cut_short_is_connection_failed() -> None:
    srv, port = scripted_server(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
    with srv, pytest.raises(ConnectionFailed):
        Transport(f"http://127.0.0.1:{port}").execute(Request("GET", "/"))


def resetting_server(*, dies: bool = False) -> tuple[socket.socket, int, list[bytes]]:
    """A server that answers one request on a kept-alive connection, reads the next one on
    it and resets the connection without answering (a server that may have acted on it and
    died, or that dropped the connection), and answers on every later connection - or, if
    it ``dies``, listens no more (a server killed after it may have stored a write). It
    keeps the request lines it received."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    seen: list[bytes] = []
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

    def serve() -> None:
        conn, _ = srv.accept()
        seen.append(conn.recv(65536).split(b"\r\n")[0])
        conn.sendall(ok)
        seen.append(conn.recv(65536).split(b"\r\n")[0])
        if dies:
            srv.close()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        conn.close()  # a reset, no answer
        while not dies:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            with conn:
                seen.append(conn.recv(65536).split(b"\r\n")[0])
                conn.sendall(ok)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1], seen


def test_a_pooled_connection_that_dies_mid_call_may_have_sent_it() -> None:
    """The second request went out on the pooled connection and the server died before
    answering; the fresh connection the transport tries then is refused. The call must say
    it may have reached the server (``sent``): a sharded extend that took "refused" for
    "never sent" went to another server and was stored twice."""
    srv, port, _ = resetting_server(dies=True)
    url = f"http://127.0.0.1:{port}"
    t = Transport(url, ClientSettings((url,), connect_timeout=2))
    assert t.execute(Request("GET", "/")).status == 200
    with pytest.raises(ConnectionFailed) as info:
        t.execute(Request("POST", "/v1/extend", body=memoryview(b"rows")))
    assert info.value.sent is True
    srv.close()

    srv, port, _ = resetting_server(dies=True)

    async def twin() -> None:
        url = f"http://127.0.0.1:{port}"
        t = AsyncTransport(url, ClientSettings((url,), connect_timeout=2))
        assert (await t.execute(Request("GET", "/"))).status == 200
        with pytest.raises(ConnectionFailed) as info:
            await t.execute(Request("POST", "/v1/extend", body=memoryview(b"rows")))
        assert info.value.sent is True

    asyncio.run(twin())
    srv.close()


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_call_that_must_not_be_repeated_is_sent_once(idempotent: bool) -> None:
    """A pooled connection ends before the answer: an idempotent call goes again on a fresh
    connection; one that must not be repeated (a create without if_absent) is not sent
    twice - the server may have acted on it - and says it may have been sent."""
    srv, port, seen = resetting_server()
    with srv:
        url = f"http://127.0.0.1:{port}"
        t = Transport(url, ClientSettings((url,), connect_timeout=2))
        assert t.execute(Request("GET", "/first")).status == 200
        second = Request("POST", "/v1/tables", body=b"{}", idempotent=idempotent)
        if idempotent:
            assert t.execute(second).status == 200
            assert seen[1:] == [b"POST /v1/tables HTTP/1.1"] * 2
        else:
            with pytest.raises(ConnectionFailed) as info:
                t.execute(second)
            assert info.value.sent is True
            assert seen[1:] == [b"POST /v1/tables HTTP/1.1"]


def test_a_call_that_must_not_be_repeated_skips_a_pooled_connection_closed_while_idle(
    server: tuple[str, type[Handler]],
) -> None:
    """A pooled connection the server closed while idle is seen before a call that must not
    be repeated goes out: that call takes a fresh connection and gets its answer."""
    url, _ = server
    t = Transport(url)
    t.execute(Request("GET", "/"))
    conn = t._idle[0]
    assert conn.sock is not None
    conn.sock.shutdown(socket.SHUT_RDWR)  # as if the server had dropped the idle connection
    done = t.execute(Request("POST", "/p", body=memoryview(b"abc"), idempotent=False))
    assert done.json()["got"] == 3


@pytest.mark.parametrize("idempotent", [True, False])
def test_the_async_transport_sends_a_call_that_must_not_be_repeated_once(
    idempotent: bool,
) -> None:
    """:func:`test_a_call_that_must_not_be_repeated_is_sent_once` for the asyncio twin."""
    srv, port, seen = resetting_server()

    async def main() -> None:
        url = f"http://127.0.0.1:{port}"
        t = AsyncTransport(url, ClientSettings((url,), connect_timeout=2))
        assert (await t.execute(Request("GET", "/first"))).status == 200
        second = Request("POST", "/v1/tables", body=b"{}", idempotent=idempotent)
        if idempotent:
            assert (await t.execute(second)).status == 200
        else:
            with pytest.raises(ConnectionFailed) as info:
                await t.execute(second)
            assert info.value.sent is True
        await t.aclose()

    with srv:
        asyncio.run(main())
    assert seen[1:] == [b"POST /v1/tables HTTP/1.1"] * (2 if idempotent else 1)
