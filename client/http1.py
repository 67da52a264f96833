"""HTTP/1.1 as the client speaks it: request heads, response heads, chunked bodies, and a
blocking keep-alive connection.

Written here rather than taken from ``http.client``, by measurement: on a
one-item sample (4.4 KB answer) ``http.client`` spent about a third of the
client's time building the request line by line and parsing the answer's
head with the ``email`` package. :class:`Connection` sends the head and a
small body in one ``send``, parses the head from one scratch buffer, and
``recv_into``s the body straight into the buffer the command chose
(:attr:`~tdreplay.client.commands.Request.alloc`). The async twin
(:mod:`tdreplay.client.aio_transport`) parses with the same functions.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .commands import Request

#: bytes a response head may take at most
MAX_HEAD = 1 << 20
_SCRATCH = 64 * 1024
#: bytes read at a time into a request's sink (:attr:`Request.sink`)
PIECE = 1 << 20


class ResetBeforeAnswer(ConnectionError):
    """The connection closed before any byte of the answer came (a pooled connection the
    server had closed while it was idle: the request can be sent again)."""


class SinkFailed(Exception):
    """The request's sink raised ``err`` (a full disk): the caller's own error, raised as it
    came, not a failure of the connection (which is dropped all the same)."""

    def __init__(self, err: Exception) -> None:
        super().__init__(str(err))
        self.err = err


def pour(sink: Callable[[memoryview], None], piece: memoryview) -> None:
    """``sink(piece)``, its exception wrapped in :class:`SinkFailed`."""
    try:
        sink(piece)
    except Exception as err:
        raise SinkFailed(err) from err


@dataclass(frozen=True)
class Head:
    """A response's status line and headers (names lower-case)."""

    status: int
    headers: dict[str, str]
    keep_alive: bool

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def length(self) -> int | None:
        """``Content-Length``, or ``None``.

        Raises:
            ValueError: it is not a non-negative integer.
        """
        value = self.headers.get("content-length")
        if value is None:
            return None
        if not value.isdigit():
            raise ValueError(f"bad Content-Length {value[:40]!r}")
        return int(value)


def request_head(method: str, target: str, lines: list[tuple[str, str]]) -> bytes:
    """The request line and header lines, ending with the empty line."""
    text = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in lines) + "\r\n"
    return text.encode("latin-1")


def parse_head(raw: bytes) -> Head | None:
    """The head in ``raw`` (without its final empty line); ``None`` for an informational
    (1xx) answer, which the real one follows.

    Raises:
        ValueError: not an HTTP/1.x status line, or a header line without a colon.
    """
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise ValueError(f"bad status line {lines[0][:80]!r}")
    status = int(code)
    if 100 <= status < 200:
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep:
            raise ValueError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    keep = headers.get("connection", "").lower() != "close" and version != "HTTP/1.0"
    return Head(status, headers, keep)


def has_body(head: Head, method: str) -> bool:
    return not (head.status in (204, 304) or method == "HEAD")


def chunk_size(line: bytes) -> int:
    """The size on a chunk-size line (extensions ignored).

    Raises:
        ValueError: not a hexadecimal size.
    """
    return int(line.split(b";")[0].strip() or b"x", 16)


class Connection:
    """One blocking keep-alive connection; one request at a time.

    Raises (every method): ``OSError`` (``TimeoutError``, ``ConnectionError``
    among them) as the socket raises it, :class:`ResetBeforeAnswer`, and
    ``ValueError`` for an answer that is not valid HTTP/1.1.
    """

    def __init__(self, host: str, port: int, *, tls: bool, connect_timeout: float) -> None:
        sock = socket.create_connection((host, port), timeout=connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls:
                sock = ssl.create_default_context().wrap_socket(sock, server_hostname=host)
        except BaseException:
            sock.close()
            raise
        self.sock = sock
        self.closed = False
        self._scratch = bytearray(_SCRATCH)
        self._n = 0  # bytes held in scratch

    def close(self) -> None:
        self.closed = True
        self.sock.close()

    def dropped(self) -> bool:
        """Whether this idle connection is no longer usable: readable while no request is
        out means the server closed it (or sent what no request asked for)."""
        try:
            readable, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError):  # closed here already
            return True
        return bool(readable)

    def roundtrip(
        self, head: bytes, req: Request, timeout: float
    ) -> tuple[int, dict[str, str], memoryview, bool]:
        """Send ``head`` and ``req.body``; read the answer whole.

        Returns:
            Status, headers, body (in ``req.alloc``'s buffer for a 2xx with a
            length) and whether the connection may be used again.
        """
        self.send(head, req, timeout)
        return self.answer(req)

    def send(self, head: bytes, req: Request, timeout: float) -> None:
        """Send ``head`` and ``req.body`` (each read of the answer may take ``timeout``)."""
        self.sock.settimeout(timeout)
        try:
            self._send(head, req)
        except (BrokenPipeError, ConnectionResetError) as err:  # closed while idle
            raise ResetBeforeAnswer(str(err)) from None

    def answer(self, req: Request) -> tuple[int, dict[str, str], memoryview, bool]:
        """Read the answer to ``req``, sent by :meth:`send` (see :meth:`roundtrip`)."""
        self._n = 0
        answer = self._head()
        if not has_body(answer, req.method):
            out = memoryview(b"")
        elif req.sink is not None and answer.status < 300:
            self._pour(answer, req.sink)
            out = memoryview(b"")
            if answer.length is None and not answer.chunked:  # read to the end: closed
                return answer.status, answer.headers, out, False
        elif answer.chunked:
            out = self._chunked()
        else:
            size = answer.length
            if size is None:  # until the server closes
                return answer.status, answer.headers, self._until_eof(), False
            target = (
                req.alloc(size) if answer.status < 300 and size else memoryview(bytearray(size))
            )
            self._into(target)
            out = target
        if self._n:  # more than one answer: not from a server we speak to
            raise ValueError("bytes after the end of the answer")
        if len(self._scratch) > 16 * _SCRATCH:  # grown for a big chunk: not kept pooled
            self._scratch = bytearray(_SCRATCH)
        return answer.status, answer.headers, out, answer.keep_alive

    def start(self, head: bytes, req: Request, timeout: float) -> Head:
        """Send ``head`` (and ``req.body``) and read the answer's head only: the body follows
        through :meth:`chunks` (a chunked answer) or :meth:`rest` (any other)."""
        self.sock.settimeout(timeout)
        self._send(head, req)
        self._n = 0
        return self._head()

    def _send(self, head: bytes, req: Request) -> None:
        """``head``, then the body's parts; a small body goes out with the head in one write."""
        parts = req.parts
        if req.nbytes <= _SCRATCH:
            self.sock.sendall(b"".join((head, *parts)))
            return
        self.sock.sendall(head)
        for part in parts:
            if len(part):
                self.sock.sendall(part)

    def chunks(self) -> Iterator[bytes]:
        """The chunks of a chunked body as they arrive."""
        while size := chunk_size(self._line()):
            while self._n < size + 2:
                self._fill(cap=None)
            yield bytes(self._scratch[:size])
            self._consume(size + 2)
        while self._line():  # trailers, up to an empty line
            pass

    def rest(self, head: Head) -> memoryview:
        """The whole body of a non-chunked answer (its length, or to the end)."""
        size = head.length
        if size is None:
            return self._until_eof()
        out = memoryview(bytearray(size))
        self._into(out)
        return out

    # -- reading --------------------------------------------------------------
    def _fill(self, cap: int | None = MAX_HEAD) -> int:
        """Receive more bytes into scratch (growing it when full, up to ``cap`` bytes for a
        head or a line; a chunk's data has no cap); how many came."""
        if self._n == len(self._scratch):
            if cap is not None and self._n >= cap:
                raise ValueError("response head over 1 MiB")
            self._scratch.extend(bytes(len(self._scratch)))
        got = self.sock.recv_into(memoryview(self._scratch)[self._n :])
        if not got:
            if self._n == 0:
                raise ResetBeforeAnswer("the server closed the connection before answering")
            raise ConnectionResetError("the server closed the connection mid-answer")
        self._n += got
        return got

    def _consume(self, k: int) -> None:
        rest = self._n - k
        if rest:
            self._scratch[0:rest] = self._scratch[k : self._n]
        self._n = rest

    def _head(self) -> Head:
        start = 0
        while True:
            end = self._scratch.find(b"\r\n\r\n", max(0, start - 3), self._n)
            if end < 0:
                start = self._n
                try:
                    self._fill()
                except ConnectionError as err:
                    if self._n == 0 and not isinstance(err, ResetBeforeAnswer):
                        raise ResetBeforeAnswer(str(err)) from None
                    raise
                continue
            head = parse_head(bytes(self._scratch[:end]))
            self._consume(end + 4)
            if head is not None:
                return head
            start = 0

    def _into(self, target: memoryview) -> None:
        have = min(self._n, len(target))
        target[:have] = self._scratch[:have]
        self._consume(have)
        while have < len(target):
            got = self.sock.recv_into(target[have:])
            if not got:
                raise ConnectionResetError("the server closed the connection mid-body")
            have += got

    def _pour(self, head: Head, sink: Callable[[memoryview], None]) -> None:
        """The body of ``head`` into ``sink``, at most :data:`PIECE` bytes at a time."""
        if head.chunked:
            for piece in self.chunks():
                pour(sink, memoryview(piece))
            return
        left = head.length
        if self._n:
            have = self._n if left is None else min(self._n, left)
            pour(sink, memoryview(bytes(self._scratch[:have])))
            self._consume(have)
            left = None if left is None else left - have
        buf = memoryview(bytearray(PIECE))
        while left is None or left > 0:
            got = self.sock.recv_into(buf if left is None else buf[: min(PIECE, left)])
            if not got:
                if left is None:
                    return
                raise ConnectionResetError("the server closed the connection mid-body")
            pour(sink, buf[:got])
            if left is not None:
                left -= got

    def _line(self) -> bytes:
        while (eol := self._scratch.find(b"\r\n", 0, self._n)) < 0:
            self._fill()
        line = bytes(self._scratch[:eol])
        self._consume(eol + 2)
        return line

    def _chunked(self) -> memoryview:
        return memoryview(b"".join(self.chunks()))

    def _until_eof(self) -> memoryview:
        parts = [bytes(self._scratch[: self._n])]
        self._n = 0
        while chunk := self.sock.recv(1 << 16):
            parts.append(chunk)
        return memoryview(b"".join(parts))
