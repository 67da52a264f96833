"""Every call of the protocol, defined once, with no I/O (the *sans-I/O* core).

A :class:`Command` builds one HTTP :class:`Request` and parses its
:class:`Response`; the sync transport (``http.client``) and the async one
(asyncio streams) only move bytes. So ``ReplayClient.sample`` and
``AsyncReplayClient.sample`` cannot drift apart: both execute
:class:`Sample`.

    >>> cmd = Sample("cartpole", 256, wait=5.0)
    >>> req = cmd.request()
    >>> req.method, req.target
    ('POST', '/v1/tables/cartpole/sample?batch_size=256&timeout=5.0')
"""

from __future__ import annotations

import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlencode

import numpy as np
import torch
from tensordict import TensorDict

from ..codec import arrow, protocol
from ..codec.parts import LayoutEncoder
from . import errors
from .batches import as_batch, decode_batch

T = TypeVar("T")

#: extend bodies: layouts sent again and again are encoded without pyarrow (codec.parts)
ENCODER = LayoutEncoder()

#: ``alloc(n)`` returns a writable buffer of exactly ``n`` bytes to receive a body into
Alloc = Callable[[int], memoryview]
#: ``sink(piece)`` takes a successful response's body piece by piece, as it arrives (a
#: piece is valid only during the call: the buffer is reused)
Sink = Callable[[memoryview], None]


def fresh(n: int) -> memoryview:
    """The default allocator: a new, uninitialized buffer per response.

    (``bytearray(n)`` would zero it first: a wasted pass over a large body.)
    """
    return memoryview(np.empty(n, dtype=np.uint8))  # type: ignore[arg-type]


@dataclass
class Request:
    """One HTTP request, as a command built it.

    Attributes:
        method: ``GET``, ``POST`` or ``DELETE``.
        target: path and query string.
        headers: extra headers (the transport adds Host, Content-Length, Authorization).
        body: the body, if any: bytes, or buffers sent one after the other
            (an extend's columns, uncopied: :func:`tdreplay.codec.encode_parts`).
        wait: seconds the server may hold the call (rate limiter); the
            transport's read timeout is this plus its own.
        idempotent: whether sending it twice is harmless (retries after the
            request may have reached the server are allowed only then).
        alloc: where a successful response's body goes.
        sink: instead, where a successful response's body is poured, piece by piece
            (bounded memory for bodies of any size: an export streamed to a file);
            the response's ``body`` is then empty.
    """

    method: str
    target: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | memoryview | tuple[memoryview, ...] | None = None
    wait: float = 0.0
    idempotent: bool = True
    alloc: Alloc = fresh
    sink: Sink | None = None

    @property
    def parts(self) -> tuple[bytes | memoryview, ...]:
        """The body as buffers to send in order (none for no body)."""
        body = self.body
        if body is None:
            return ()
        return body if isinstance(body, tuple) else (body,)

    @property
    def nbytes(self) -> int:
        """The body's length in bytes (its Content-Length)."""
        return sum(len(part) for part in self.parts)


@dataclass
class Response:
    """One HTTP response: status, headers (lower-case names) and the whole body."""

    status: int
    headers: dict[str, str]
    body: memoryview

    def json(self) -> Any:
        try:
            return json.loads(bytes(self.body)) if len(self.body) else None
        except ValueError as err:
            raise errors.ProtocolError(f"response is not JSON: {err}") from None

    def check(self) -> Response:
        """Raise the server's error for a status >= 400; return self otherwise."""
        if self.status >= 400:
            raise errors.from_response(self.status, self.body)
        return self


class Command(Generic[T]):
    """One call: :meth:`request` builds it, :meth:`parse` reads the answer."""

    def request(self) -> Request:
        raise NotImplementedError

    def parse(self, response: Response) -> T:
        raise NotImplementedError


def _target(path: str, **query: Any) -> str:
    q = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urlencode(q) if q else "")


def table_target(name: str, action: str = "") -> str:
    """The path of ``action`` on table ``name`` (quoted)."""
    return protocol.table_path(quote(name, safe=""), action)


@functools.lru_cache(maxsize=256)
def _sample_target(table: str, batch_size: int, wait: float | None) -> str:
    """A sample's path and query, built once per table, size and wait (quoting costs more
    than a small sample's decode)."""
    return _target(table_target(table, "sample"), batch_size=batch_size, timeout=wait)


def json_body(data: Any) -> tuple[dict[str, str], bytes]:
    return {"Content-Type": protocol.JSON}, json.dumps(data).encode()


# ------------------------------------------------------------------ control
@dataclass
class Health(Command[dict[str, Any]]):
    def request(self) -> Request:
        return Request("GET", "/healthz")

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json() or {}


@dataclass
class ServerInfo(Command[dict[str, Any]]):
    """``GET /v1/info``: the server's version and same-host transport."""

    def request(self) -> Request:
        return Request("GET", f"{protocol.API}/info")

    def parse(self, response: Response) -> dict[str, Any]:
        data = response.check().json()
        return data if isinstance(data, dict) else {}


@dataclass
class ListTables(Command[list[dict[str, Any]]]):
    def request(self) -> Request:
        return Request("GET", protocol.TABLES)

    def parse(self, response: Response) -> list[dict[str, Any]]:
        data = response.check().json()
        return list(data.get("tables", [])) if isinstance(data, dict) else []


@dataclass
class CreateTable(Command[dict[str, Any]]):
    spec: dict[str, Any]
    if_absent: bool = False

    def request(self) -> Request:
        headers, body = json_body(self.spec)
        target = _target(protocol.TABLES, if_absent="true" if self.if_absent else None)
        # create-if-absent answers the same however often it is sent: it may be retried
        return Request("POST", target, headers, body, idempotent=self.if_absent)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class Info(Command[dict[str, Any]]):
    table: str

    def request(self) -> Request:
        return Request("GET", table_target(self.table))

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class DeleteTable(Command[None]):
    table: str

    def request(self) -> Request:
        return Request("DELETE", table_target(self.table))

    def parse(self, response: Response) -> None:
        response.check()


@dataclass
class Clear(Command[dict[str, Any]]):
    """Empty the table (a fresh one of its schema replaces it); its info."""

    table: str

    def request(self) -> Request:
        return Request("POST", table_target(self.table, "clear"), {}, b"")

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


# ------------------------------------------------------------------ data
@dataclass
class Extend(Command[torch.Tensor]):
    """Insert rows. Carries an ``X-Request-Id`` so that a retry after a lost answer is a no-op.

    The id is drawn once per command, so every retry of this command sends the
    same one and the server, which remembers recent ids, writes the rows once.
    """

    table: str
    data: Any
    wait: float | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _body: Any = field(default=None, repr=False)

    def request(self) -> Request:
        if self._body is None:  # encoded once, reused by retries
            try:  # the columns are sent from their own memory, not copied into a body
                self._body = tuple(ENCODER.encode_parts(as_batch(self.data)))
            except arrow.CodecError as err:
                raise errors.SchemaError(str(err), field=err.field, type="CodecError") from None
        return Request(
            "POST",
            _target(table_target(self.table, "extend"), timeout=self.wait),
            {"Content-Type": protocol.ARROW_STREAM, protocol.REQUEST_ID: self.request_id},
            self._body,
            wait=self.wait or 0.0,
            idempotent=True,  # thanks to the request id
        )

    def parse(self, response: Response) -> torch.Tensor:
        data = response.check().json()
        if not isinstance(data, dict) or "index" not in data:
            raise errors.ProtocolError(f"extend: unexpected answer {data!r}")
        return torch.tensor(data["index"], dtype=torch.int64)


@dataclass
class Sample(Command[TensorDict]):
    """Sample ``batch_size`` items: fields plus ``index`` and ``sample_info``.

    The decoded tensors are views on the received buffer (``alloc``'s);
    bool columns excepted, which Arrow packs into bits.
    """

    table: str
    batch_size: int
    wait: float | None = None
    alloc: Alloc = fresh
    #: over shared memory, the batch may view a leased slot (``ReplayClient.sample``); else
    #: it is copied into ``alloc``'s buffer (the loader, which owns its buffers' lifetime)
    lease: bool = False

    def request(self) -> Request:
        return Request(
            "POST",
            _sample_target(self.table, self.batch_size, self.wait),
            {"Accept": protocol.ARROW_STREAM},
            None,
            wait=self.wait or 0.0,
            idempotent=True,  # a repeat draws again; only queues (fifo/lifo) lose items
            alloc=self.alloc,
        )

    def parse(self, response: Response) -> TensorDict:
        return decode_batch(response.check().body)


@dataclass
class Read(Command[TensorDict]):
    """The items in slots ``index`` of one server's table, as stored (and ``index``)."""

    table: str
    index: list[int]

    def request(self) -> Request:
        headers, body = json_body({"index": self.index})
        return Request("POST", table_target(self.table, "read"), headers, body)

    def parse(self, response: Response) -> TensorDict:
        return decode_batch(response.check().body)


@dataclass
class Remove(Command[int]):
    """Remove the items in one server's slots ``index`` (with ``key``: only those still
    holding the sampled item); how many went."""

    table: str
    index: list[int]
    key: list[int] | None = None

    def request(self) -> Request:
        payload: dict[str, Any] = {"index": self.index}
        if self.key is not None:
            payload["key"] = self.key
        headers, body = json_body(payload)
        return Request("POST", table_target(self.table, "remove"), headers, body)

    def parse(self, response: Response) -> int:
        return int(response.check().json()["removed"])


@dataclass
class Stream(Command[None]):
    """``GET .../stream``: ``count`` samples as one chunked Arrow stream (read by the transport)."""

    table: str
    batch_size: int
    count: int
    wait: float | None = None

    def request(self) -> Request:
        return Request(
            "GET",
            _target(
                table_target(self.table, "stream"),
                batch_size=self.batch_size,
                count=self.count,
                timeout=self.wait,
            ),
            {"Accept": protocol.ARROW_STREAM},
            wait=self.wait or 0.0,
        )

    def parse(self, response: Response) -> None:
        response.check()


@dataclass
class UpdatePriority(Command[int]):
    """Set priorities of sampled slots; with ``key``, slots overwritten since are skipped.

    Answers how many priorities the server applied.
    """

    table: str
    index: Any
    priority: Any
    key: Any = None

    def payload(self) -> dict[str, Any]:
        """The update as JSON values (what either transport sends), lengths checked.

        Raises:
            ValueError: the index, priorities and keys differ in length.
        """
        index = torch.as_tensor(self.index).reshape(-1).tolist()
        priority = torch.as_tensor(self.priority).detach().reshape(-1).double().cpu().tolist()
        if len(index) != len(priority):
            raise ValueError(f"{len(index)} indices but {len(priority)} priorities")
        payload: dict[str, Any] = {"index": index, "priority": priority}
        if self.key is not None:
            key = torch.as_tensor(self.key).reshape(-1).tolist()
            if len(key) != len(index):
                raise ValueError(f"{len(index)} indices but {len(key)} keys")
            payload["key"] = key
        return payload

    def request(self) -> Request:
        headers, body = json_body(self.payload())
        return Request("POST", table_target(self.table, "update_priority"), headers, body)

    def parse(self, response: Response) -> int:
        data = response.check().json()
        if not isinstance(data, dict) or not isinstance(data.get("updated"), int):
            raise errors.ProtocolError(f"update_priority: unexpected answer {data!r}")
        return int(data["updated"])
