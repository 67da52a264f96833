"""The sync transport: a pool of keep-alive HTTP/1.1 connections (:mod:`.http1`).

Chosen by measurement (``bench/client_bench.py``, against a bare Starlette
route): on 14 MB bodies ``http.client`` reading with ``readinto`` ran at about
5x httpx's throughput (2.6 vs 0.5 GB/s), and our own connection
(:class:`~tdreplay.client.http1.Connection`) keeps that ``recv_into`` while
cutting ``http.client``'s per-call head building and ``email``-package
parsing, a third of a one-item sample's client time. Bodies are received
straight into a buffer the command chose (:attr:`Request.alloc`), so the
loader can reuse its buffers (pinned memory on CUDA hosts) instead of
allocating per batch. Chunked streams (:meth:`Transport.open_stream`) are read
chunk by chunk on a connection of their own (:mod:`tdreplay.client.streams`).

One :class:`Transport` per server; thread safe: each call takes an idle
connection (or opens one), and puts it back when the answer was read whole.
"""

from __future__ import annotations

import re
import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..codec.params import bounded
from . import errors, forking, http1
from .commands import Request, Response
from .settings import ClientSettings

USER_AGENT = "tdreplay-client/0.1"
#: a URL's ``user:password@`` (up to the authority's last ``@``)
_USERINFO = re.compile(r"^((?:[A-Za-z][A-Za-z0-9+.\-]*:)?//)?[^/?#]*@")


def shown_url(url: str) -> str:
    """``url`` as a message may show it: any ``user:password@`` in it replaced by ``***@``.

    >>> shown_url("http://alice:s3cret@127.0.0.1:8000/x")
    'http://***@127.0.0.1:8000/x'
    """
    return _USERINFO.sub(lambda m: f"{m.group(1) or ''}***@", url, count=1)


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
        """The endpoint of ``url`` (``http://host:port[/prefix]``; ``http://`` if omitted).

        Raises:
            ValueError: not an http(s) URL with a host, or one carrying ``user:password@``
                (never sent: a server takes a bearer token); the message shows the URL
                without its credentials.
        """
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {shown_url(url)!r}")
        if "@" in parts.netloc:
            raise ValueError(
                f"URL {shown_url(url)!r} carries a user and password, which a tdreplay client "
                "never sends: give the server's bearer token instead (TDREPLAY_TOKEN, "
                "TDREPLAY_TOKEN_FILE, or --token-file) and the URL without them"
            )
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
    out.append(("Content-Length", str(req.nbytes)))
    return out


class Transport:
    """Executes :class:`Request` objects against one server over pooled connections.

    Args:
        url: the server's base URL (``http://host:port``).
        settings: the client's (default: a client's of this server alone): its ``token`` (sent with every request, if any),
            ``timeout`` (seconds to wait for each read of an answer, on top of the
            request's own ``wait``: the time the server may hold it), ``connect_timeout``
            and ``max_connections`` (idle connections kept for reuse).
    """

    def __init__(self, url: str, settings: ClientSettings | None = None) -> None:
        self.endpoint = Endpoint.parse(url)
        settings = settings or ClientSettings((url,))
        self.token = settings.token
        self.timeout = settings.timeout
        self.connect_timeout = settings.connect_timeout
        self.max_idle = settings.max_connections
        self._idle: deque[http1.Connection] = deque()
        self._lock = threading.Lock()
        self._closed = False
        forking.forget_in_child(self)

    def after_fork(self) -> None:
        """In a forked child: close its copies of the idle connections (the parent's stay
        open) and take a fresh lock (a thread of the parent's may have held it)."""
        self._lock = threading.Lock()
        idle, self._idle = list(self._idle), deque()
        for conn in idle:
            conn.close()

    # ---------------------------------------------------------------- pool
    def _new(self) -> http1.Connection:
        e = self.endpoint
        try:
            return http1.Connection(
                e.host, e.port, tls=e.tls, connect_timeout=bounded(self.connect_timeout)
            )
        except TimeoutError:
            raise errors.Timeout(
                f"connecting to {e.url} took over {self.connect_timeout}s", url=e.url
            ) from None
        except OSError as err:
            raise errors.ConnectionFailed(
                f"cannot connect to {e.url}: {err}", url=e.url, sent=False
            ) from None

    def _take(self, *, checked: bool = False) -> tuple[http1.Connection, bool]:
        """An idle connection (and ``True``) or a new one; ``checked``: one the server closed
        while idle is replaced before a request goes out (for a request not sent twice)."""
        with self._lock:
            conn = self._idle.pop() if self._idle else None
        if conn is None:
            return self._new(), False
        if checked and conn.dropped():
            conn.close()  # closed while idle: a fresh one, before the request goes out
            return self._new(), False
        return conn, True

    def _give(self, conn: http1.Connection) -> None:
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
        while idle; if it ends before any byte of the answer arrives, an
        idempotent request is sent once more on a fresh connection (as urllib3
        does). One that must not be repeated is sent on a fresh connection
        when the pooled one shows it was closed, and never twice.

        Raises:
            ConnectionFailed: cannot connect, or the connection dropped.
            Timeout: a connect or a read took longer than allowed.
            ProtocolError: the answer is not valid HTTP.
        """
        conn, reused = self._take(checked=not req.idempotent)
        if not reused or not req.idempotent:
            # a call that must not be repeated goes once: should the connection end before
            # the answer, the server may have done it (``sent``), and it is not sent again
            return self._roundtrip(conn, req, retry=False)
        try:
            return self._roundtrip(conn, req, retry=True)
        except _Stale as stale:
            first = stale.err  # the server may have read the request, then died
        try:
            return self._roundtrip(self._new(), req, retry=False)
        except errors.TransportError as err:
            raise errors.in_doubt(err, first) from None

    def head(self, req: Request) -> bytes:
        """``req``'s request line and headers, as sent."""
        return http1.request_head(
            req.method,
            self.endpoint.prefix + req.target,
            head_lines(req, self.endpoint, self.token),
        )

    def _roundtrip(self, conn: http1.Connection, req: Request, *, retry: bool) -> Response:
        limit = bounded(self.timeout + req.wait)
        try:
            status, headers, body, keep = conn.roundtrip(self.head(req), req, limit)
        except BaseException as err:
            raise self._failure(conn, req, err, limit, retry=retry) from None
        return self._answered(conn, status, headers, body, keep)

    def post(self, req: Request) -> Posted:
        """Send ``req`` and return before its answer, which :meth:`Posted.answer` reads:
        the caller works meanwhile (a writer fills its next chunk while the server stores
        this one). The connection is held until then. Only for an idempotent request: one
        whose connection drops before the answer raises ``ConnectionFailed(sent=True)``,
        and it is the caller's to send it again (through a plan, with its retries).

        Raises:
            ConnectionFailed, Timeout: as :meth:`execute`, here or from ``answer()``.
        """
        conn, _ = self._take(checked=True)
        limit = bounded(self.timeout + req.wait)
        try:
            conn.send(self.head(req), req, limit)
        except BaseException as err:
            raise self._failure(conn, req, err, limit, retry=False) from None
        return Posted(self, conn, req, limit)

    def _answered(
        self,
        conn: http1.Connection,
        status: int,
        headers: dict[str, str],
        body: memoryview,
        keep: bool,
    ) -> Response:
        if keep:
            self._give(conn)
        else:
            conn.close()
        return Response(status, headers, body)

    def _failure(
        self, conn: http1.Connection, req: Request, err: BaseException, limit: float, *, retry: bool
    ) -> BaseException:
        """What to raise for ``err``, which ended an exchange of ``req`` on ``conn`` (closed)."""
        conn.close()
        url, what = self.endpoint.url, f"{req.method} {req.target}"
        if isinstance(err, TimeoutError):
            return errors.Timeout(f"{what}: no answer from {url} within {limit:g}s", url=url)
        if isinstance(err, http1.SinkFailed):
            return err.err
        if isinstance(err, http1.ResetBeforeAnswer):
            lost = errors.ConnectionFailed(
                f"{what}: connection to {url} lost: {err}", url=url, sent=True
            )
            return _Stale(lost) if retry else lost
        if isinstance(err, OSError):
            return errors.ConnectionFailed(
                f"{what}: connection to {url} lost: {err!r}", url=url, sent=True
            )
        if isinstance(err, ValueError):
            return errors.ProtocolError(f"{what}: bad answer from {url}: {err}", url=url)
        return err

    @contextmanager
    def open_stream(self, req: Request) -> Iterator[Iterator[bytes]]:
        """Send ``req`` on a connection of its own and yield the answer's body as it arrives
        (the chunks of a chunked answer); the connection is closed after.

        Raises:
            ServerError: the server answered an error (its JSON body).
            ConnectionFailed, Timeout, ProtocolError: as :meth:`execute`, also while the
                body is read.
        """
        url, what = self.endpoint.url, f"{req.method} {req.target}"
        conn = self._new()
        try:
            head = conn.start(self.head(req), req, bounded(self.timeout + req.wait))
            if head.status >= 400:
                body = b"".join(conn.chunks()) if head.chunked else bytes(conn.rest(head))
                raise errors.from_response(head.status, memoryview(body))
            yield conn.chunks() if head.chunked else iter([bytes(conn.rest(head))])
        except errors.ReplayError:  # the server's own error (RateLimitTimeout is a TimeoutError)
            raise
        except TimeoutError:
            raise errors.Timeout(
                f"{what}: no answer from {url} within the timeout", url=url
            ) from None
        except ValueError as err:
            raise errors.ProtocolError(f"{what}: bad answer from {url}: {err}", url=url) from None
        except OSError as err:
            raise errors.ConnectionFailed(
                f"{what}: connection to {url} lost: {err!r}", url=url, sent=True
            ) from None
        finally:
            conn.close()


class Posted:
    """A request :meth:`Transport.post` sent, whose answer is not read yet."""

    def __init__(self, transport: Transport, conn: http1.Connection, req: Request, limit: float):
        self._transport, self._conn, self._req, self._limit = transport, conn, req, limit

    def answer(self) -> Response:
        """Read the answer (once); the connection goes back to the pool.

        Raises:
            ConnectionFailed, Timeout, ProtocolError: as :meth:`Transport.execute`.
        """
        t, conn = self._transport, self._conn
        try:
            status, headers, body, keep = conn.answer(self._req)
        except BaseException as err:
            raise t._failure(conn, self._req, err, self._limit, retry=False) from None
        return t._answered(conn, status, headers, body, keep)


class _Stale(Exception):
    """A pooled connection that closed before any byte of the answer: most often one the
    server had closed while idle, so the request is sent again on a fresh one; but the
    server may also have read it and died (``err`` says it may have been sent)."""

    def __init__(self, err: errors.ConnectionFailed) -> None:
        super().__init__(str(err))
        self.err = err
