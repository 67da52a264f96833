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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar
from urllib.parse import quote, urlencode

import torch
from tensordict import TensorDict

from ..codec import arrow, protocol
from ..codec import operations as ops
from ..codec.parts import LayoutEncoder
from . import errors
from .batches import as_batch, decode_batch
from .http_values import Alloc, Request, Response, fresh, json_body

T = TypeVar("T")

#: extend bodies: layouts sent again and again are encoded without pyarrow (codec.parts)
ENCODER = LayoutEncoder()


class Command(Generic[T]):
    """One call of an operation of the contract (:attr:`op`): :meth:`request` builds its
    HTTP request from the operation's method and route, :meth:`parse` reads the answer."""

    op: ClassVar[ops.Operation]

    def request(self) -> Request:
        raise NotImplementedError

    def parse(self, response: Response) -> T:
        raise NotImplementedError


def _target(path: str, **query: Any) -> str:
    q = {k: v for k, v in query.items() if v is not None}
    return path + ("?" + urlencode(q) if q else "")


def op_target(op: ops.Operation, table: str = "", **query: Any) -> str:
    """The path of ``op`` on table ``table`` (quoted), with its query string."""
    return _target(op.path(quote(table, safe="")), **query)


def op_request(command: Command[Any], table: str = "", **kw: Any) -> Request:
    """The request of ``command``'s operation on ``table`` with no query: its method, its
    route, whether a repeat is harmless (``kw``: headers, body, ...)."""
    return Request(
        command.op.method, op_target(command.op, table), idempotent=command.op.idempotent, **kw
    )


@functools.lru_cache(maxsize=256)
def _sample_target(table: str, batch_size: int, wait: float | None) -> str:
    """A sample's path and query, built once per table, size and wait (quoting costs more
    than a small sample's decode)."""
    return op_target(ops.SAMPLE, table, batch_size=batch_size, timeout=wait)


# ------------------------------------------------------------------ control
@dataclass
class Health(Command[dict[str, Any]]):
    op = ops.HEALTHZ

    def request(self) -> Request:
        return op_request(self)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json() or {}


@dataclass
class ServerInfo(Command[dict[str, Any]]):
    """``GET /v1/info``: the server's version and same-host transport."""

    op = ops.SERVER_INFO

    def request(self) -> Request:
        return op_request(self)

    def parse(self, response: Response) -> dict[str, Any]:
        data = response.check().json()
        return data if isinstance(data, dict) else {}


@dataclass
class ListTables(Command[list[dict[str, Any]]]):
    op = ops.LIST_TABLES

    def request(self) -> Request:
        return op_request(self)

    def parse(self, response: Response) -> list[dict[str, Any]]:
        data = response.check().json()
        return list(data.get("tables", [])) if isinstance(data, dict) else []


@dataclass
class CreateTable(Command[dict[str, Any]]):
    op = ops.CREATE_TABLE

    spec: dict[str, Any]
    if_absent: bool = False

    def request(self) -> Request:
        headers, body = json_body(self.spec)
        target = op_target(self.op, if_absent="true" if self.if_absent else None)
        # create-if-absent answers the same however often it is sent: it may be retried
        return Request(self.op.method, target, headers, body, idempotent=self.if_absent)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class Info(Command[dict[str, Any]]):
    op = ops.INFO

    table: str

    def request(self) -> Request:
        return op_request(self, self.table)

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


@dataclass
class DeleteTable(Command[None]):
    op = ops.DELETE_TABLE

    table: str

    def request(self) -> Request:
        return op_request(self, self.table)

    def parse(self, response: Response) -> None:
        response.check()


@dataclass
class Clear(Command[dict[str, Any]]):
    """Empty the table (a fresh one of its schema replaces it); its info."""

    op = ops.CLEAR

    table: str

    def request(self) -> Request:
        return op_request(self, self.table, body=b"")

    def parse(self, response: Response) -> dict[str, Any]:
        return response.check().json()


# ------------------------------------------------------------------ data
def rows_body(data: Any) -> tuple[memoryview, ...]:
    """``data``'s rows as an Arrow IPC body, sent from the columns' own memory (uncopied).

    Raises:
        SchemaError: the rows cannot be encoded (a dtype Arrow has no type for, ...).
    """
    try:
        return tuple(ENCODER.encode_parts(as_batch(data)))
    except arrow.CodecError as err:
        raise errors.SchemaError(str(err), field=err.field, type="CodecError") from None


def write_request(
    op: ops.Operation,
    target: str,
    body: tuple[memoryview, ...],
    request_id: str,
    wait: float | None,
) -> Request:
    """The request of a write of rows (extend, insert): idempotent by its request id."""
    return Request(
        op.method,
        target,
        {"Content-Type": protocol.ARROW_STREAM, protocol.REQUEST_ID: request_id},
        body,
        wait=wait or 0.0,
        idempotent=op.idempotent,
    )


@dataclass
class Extend(Command[torch.Tensor]):
    """Insert rows. Carries an ``X-Request-Id`` so that a retry after a lost answer is a no-op.

    The id is drawn once per command, so every retry of this command sends the
    same one and the server, which remembers recent ids, writes the rows once.
    """

    op = ops.EXTEND

    table: str
    data: Any
    wait: float | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _body: Any = field(default=None, repr=False)

    def request(self) -> Request:
        if self._body is None:  # encoded once, reused by retries
            self._body = rows_body(self.data)
        target = op_target(self.op, self.table, timeout=self.wait)
        return write_request(self.op, target, self._body, self.request_id, self.wait)

    def parse(self, response: Response) -> torch.Tensor:
        data = response.check().json()
        if not isinstance(data, dict) or "index" not in data:
            raise errors.ProtocolError(f"extend: unexpected answer {data!r}")
        return torch.tensor(data["index"], dtype=torch.int64)


@dataclass
class Insert(Command[dict[str, torch.Tensor]]):
    """Insert the same rows into several tables of one server, each with its own initial
    priority (``into``: table -> priority or ``None``); idempotent as :class:`Extend`."""

    op = ops.INSERT

    into: dict[str, float | None]
    data: Any
    wait: float | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    _body: Any = field(default=None, repr=False)

    def request(self) -> Request:
        if self._body is None:  # encoded once, reused by retries
            self._body = rows_body(self.data)
        target = op_target(self.op, into=json.dumps(self.into), timeout=self.wait)
        return write_request(self.op, target, self._body, self.request_id, self.wait)

    def parse(self, response: Response) -> dict[str, torch.Tensor]:
        data = response.check().json()
        if not isinstance(data, dict) or not isinstance(data.get("index"), dict):
            raise errors.ProtocolError(f"insert: unexpected answer {data!r}")
        return {k: torch.tensor(v, dtype=torch.int64) for k, v in data["index"].items()}


@dataclass
class Sample(Command[TensorDict]):
    """Sample ``batch_size`` items: fields plus ``index`` and ``sample_info``.

    The decoded tensors are views on the received buffer (``alloc``'s);
    bool columns excepted, which Arrow packs into bits.
    """

    op = ops.SAMPLE

    table: str
    batch_size: int
    wait: float | None = None
    alloc: Alloc = fresh
    #: over shared memory, the batch may view a leased slot (``ReplayClient.sample``); else
    #: it is copied into ``alloc``'s buffer (the loader, which owns its buffers' lifetime)
    lease: bool = False

    def request(self) -> Request:
        return Request(
            self.op.method,
            _sample_target(self.table, self.batch_size, self.wait),
            {"Accept": protocol.ARROW_STREAM},
            None,
            wait=self.wait or 0.0,
            idempotent=self.op.idempotent,  # a repeat draws again; only queues lose items
            alloc=self.alloc,
        )

    def parse(self, response: Response) -> TensorDict:
        return decode_batch(response.check().body)


@dataclass
class Read(Command[TensorDict]):
    """The items in slots ``index`` of one server's table, as stored (and ``index``)."""

    op = ops.READ

    table: str
    index: list[int]

    def request(self) -> Request:
        headers, body = json_body({"index": self.index})
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> TensorDict:
        return decode_batch(response.check().body)


@dataclass
class Remove(Command[int]):
    """Remove the items in one server's slots ``index`` (with ``key``: only those still
    holding the sampled item); how many went."""

    op = ops.REMOVE

    table: str
    index: list[int]
    key: list[int] | None = None

    def request(self) -> Request:
        payload: dict[str, Any] = {"index": self.index}
        if self.key is not None:
            payload["key"] = self.key
        headers, body = json_body(payload)
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> int:
        return int(response.check().json()["removed"])


@dataclass
class Stream(Command[None]):
    """``POST .../stream``: ``count`` samples as one chunked Arrow stream (read by the transport)."""

    op = ops.STREAM

    table: str
    batch_size: int
    count: int
    wait: float | None = None

    def request(self) -> Request:
        return Request(
            self.op.method,
            op_target(
                self.op, self.table, batch_size=self.batch_size, count=self.count, timeout=self.wait
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

    op = ops.UPDATE_PRIORITY

    table: str
    index: Any
    priority: Any
    key: Any = None

    def payload(self) -> dict[str, Any]:
        """The update as JSON values (what either transport sends; the plan checked them:
        lists it gives as they are, a sharded one's tensors as lists)."""

        def listed(values: Any) -> list[Any]:
            return values if isinstance(values, list) else values.double().tolist()

        index = self.index if isinstance(self.index, list) else self.index.tolist()
        payload: dict[str, Any] = {"index": index, "priority": listed(self.priority)}
        if self.key is not None:
            payload["key"] = self.key if isinstance(self.key, list) else self.key.tolist()
        return payload

    def request(self) -> Request:
        headers, body = json_body(self.payload())
        return op_request(self, self.table, headers=headers, body=body)

    def parse(self, response: Response) -> int:
        data = response.check().json()
        if not isinstance(data, dict) or not isinstance(data.get("updated"), int):
            raise errors.ProtocolError(f"update_priority: unexpected answer {data!r}")
        return int(data["updated"])
