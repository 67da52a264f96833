"""The sync transport: ``http.client`` with a pool of keep-alive connections.

Chosen by measurement (``bench/client_bench.py``, against a bare Starlette
route): on 14 MB bodies ``http.client`` reading with ``readinto`` ran at about
5x httpx's throughput (2.6 vs 0.5 GB/s), and on tiny requests it made 3.5x
as many calls per second (5.0k vs 1.4k). Bodies are received with ``readinto`` straight into a
buffer the command chose (:attr:`Request.alloc`), so the loader can reuse its
buffers (pinned memory on CUDA hosts) instead of allocating per batch.

One :class:`Transport` per server; thread safe: each call takes an idle
connection (or opens one), and puts it back when the answer was read whole.
"""

from __future__ import annotations

import http.client
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from . import errors
from .commands import Request, Response

USER_AGENT = "tdreplay-client/0.1"


@dataclass(frozen=True)
class Endpoint:
    """A server's address, parsed once from its base URL."""

    url: str
    host: str
    port: int
    tls: bool
    prefix: str

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        return cls(base, parts.hostname, port, tls, parts.path.rstrip("/"))

    @property
    def host_header(self) -> str:
        default = 443 if self.tls else 80
        return self.host if self.port == default else f"{self.host}:{self.port}"


def head_lines(req: Request, endpoint: Endpoint, token: str | None) -> list[tuple[str, str]]:
    """The headers every transport sends, besides the request's own."""
    out = [("Host", endpoint.host_header), ("User-Agent", USER_AGENT)]
    if token:
        out.append(("Authorization", f"Bearer {token}"))
    out.extend(req.headers.items())
    out.append(("Content-Length", str(len(req.body) if req.body is not None else 0)))
    return out


class Transport:
    """Executes :class:`Request` objects against one server over pooled connections.

    Args:
        url: the server's base URL (``http://host:port``).
        token: bearer token sent with every request, if any.
        timeout: seconds to wait for each read of an answer, on top of the
            request's own ``wait`` (the time the server may hold it).
        connect_timeout: seconds to wait for a connection.
        max_idle: idle connections kept for reuse.
    """

    def __init__(
        self,
        url: str,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        max_idle: int = 16,
    ) -> None:
        self.endpoint = Endpoint.parse(url)
        self.token = token
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self._idle: deque[http.client.HTTPConnection] = deque()
        self._lock = threading.Lock()
        self._closed = False

    # ---------------------------------------------------------------- pool
    def _new(self) -> http.client.HTTPConnection:
        e = self.endpoint
        conn: http.client.HTTPConnection
        if e.tls:
            conn = http.client.HTTPSConnection(e.host, e.port, timeout=self.connect_timeout)
        else:
            conn = http.client.HTTPConnection(e.host, e.port, timeout=self.connect_timeout)
        try:
            conn.connect()
        except TimeoutError:
            conn.close()
            raise errors.Timeout(
                f"connecting to {e.url} took over {self.connect_timeout}s", url=e.url
            ) from None
        except OSError as err:
            conn.close()
            raise errors.ConnectionFailed(
                f"cannot connect to {e.url}: {err}", url=e.url, sent=False
            ) from None
        return conn

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection (calls in flight finish and close theirs)."""
        with self._lock:
            self._closed = True
            idle, self._idle = list(self._idle), deque()
        for conn in idle:
            conn.close()

    # ---------------------------------------------------------------- calls
    def execute(self, req: Request) -> Response:
        """Send ``req`` and read the whole answer.

        A connection taken from the pool may have been closed by the server
        while idle; if it fails before any byte of the answer arrives, the
        request is sent once more on a fresh connection (as urllib3 does).

        Raises:
            ConnectionFailed: cannot connect, or the connection dropped.
            Timeout: a connect or a read took longer than allowed.
            ProtocolError: the answer is not valid HTTP.
        """
        conn, reused = self._take()
        try:
            return self._roundtrip(conn, req)
        except errors.ConnectionFailed:
            if not reused:
                raise
        return self._roundtrip(self._new(), req)

    def _put_head(self, conn: http.client.HTTPConnection, req: Request) -> None:
        """Arm the socket's timeout and write the request line and headers (not yet sent)."""
        assert conn.sock is not None
        conn.sock.settimeout(self.timeout + req.wait)
        conn.putrequest(
            req.method, self.endpoint.prefix + req.target, skip_host=True, skip_accept_encoding=True
        )
        for name, value in head_lines(req, self.endpoint, self.token):
            conn.putheader(name, value)

    def _roundtrip(self, conn: http.client.HTTPConnection, req: Request) -> Response:
        url = self.endpoint.url
        sent = False
        try:
            self._put_head(conn, req)
            sent = True
            body = req.body
            if body is not None and len(body) <= 65536:
                conn.endheaders(bytes(body))  # one send for head and small body
            else:
                conn.endheaders(body)
            resp = conn.getresponse()
            headers = {k.lower(): v for k, v in resp.getheaders()}
            if resp.status < 300 and resp.length is not None:
                body_view = req.alloc(resp.length)
                _readinto(resp, body_view)
            else:
                body_view = memoryview(resp.read())
            will_close = resp.will_close
            resp.close()  # read whole; frees the connection for the next request
        except TimeoutError:
            conn.close()
            raise errors.Timeout(
                f"{req.method} {req.target}: no answer from {url} within "
                f"{self.timeout + req.wait:g}s",
                url=url,
            ) from None
        except (ConnectionError, http.client.RemoteDisconnected, http.client.IncompleteRead) as err:
            conn.close()
            raise errors.ConnectionFailed(
                f"{req.method} {req.target}: connection to {url} lost: {err!r}", url=url, sent=sent
            ) from None
        except http.client.HTTPException as err:
            conn.close()
            raise errors.ProtocolError(
                f"{req.method} {req.target}: bad answer from {url}: {err!r}", url=url
            ) from None
        except OSError as err:
            conn.close()
            raise errors.ConnectionFailed(
                f"{req.method} {req.target}: {url}: {err!r}", url=url, sent=sent
            ) from None
        except BaseException:
            conn.close()
            raise
        if will_close:
            conn.close()
        else:
            self._give(conn)
        return Response(resp.status, headers, body_view)

    @contextmanager
    def open_stream(self, req: Request) -> Iterator[http.client.HTTPResponse]:
        """Send ``req`` and yield the unread response (for chunked streams); closes it after."""
        conn = self._new()
        try:
            self._put_head(conn, req)
            conn.endheaders(req.body)
            resp = conn.getresponse()
        except TimeoutError:
            conn.close()
            raise errors.Timeout(
                f"no answer from {self.endpoint.url}", url=self.endpoint.url
            ) from None
        except (OSError, http.client.HTTPException) as err:
            conn.close()
            raise errors.ConnectionFailed(
                f"{req.method} {req.target}: {self.endpoint.url}: {err!r}",
                url=self.endpoint.url,
                sent=True,
            ) from None
        try:
            if resp.status >= 400:
                raise errors.from_response(resp.status, resp.read())
            yield resp
        finally:
            conn.close()


def _readinto(resp: http.client.HTTPResponse, view: memoryview) -> None:
    n, total = 0, len(view)
    while n < total:
        got = resp.readinto(view[n:])
        if not got:
            raise http.client.IncompleteRead(bytes(view[:0]), total - n)
        n += got
