"""The same-host wire: control frames over a Unix socket, rows in shared-memory slots.

A client on the server's host talks to it over a Unix-domain socket (the
socket's path is in ``GET /v1/info``). Control messages are frames: a 4-byte
little-endian length, then a JSON object. Rows never go through the socket:
they lie in *slots*, ``memfd_create`` buffers the server creates for one
connection and hands to it once, as a file descriptor attached to a reply
(``SCM_RIGHTS``). A slot holds ``rows`` rows of a set of columns, each
column contiguous, row-major, at an offset aligned to :data:`ALIGN` bytes:
:class:`SlotLayout` says where. Both sides map the slot and view its columns
as tensors (``torch.frombuffer``), with no copy and no decode.

Two kinds of frames share the socket. The hot operations - sample, extend,
release - travel as *binary* frames of fixed layout (:class:`Request`,
:func:`sample_frame`, ...): no JSON, no parameter dict. Everything else
(hello, extend_slot, update_priority, info), every error, and a hot reply
that carries a slot's descriptor travel as JSON objects; a JSON frame's body
starts with ``{``, a binary frame's with its operation code.

Messages (``→`` client to server, ``←`` the reply; ``slot`` is the client's
number for a buffer, ``fd`` marks a reply that carries the slot's descriptor)::

    → {"op": "hello", "version": 2, "token": "..."}
    ← {"ok": true, "host": <host id>, "max_bytes": <slot bytes this connection may hold>}
    → SAMPLE  slot, batch size, timeout, table                           (binary)
    ← SAMPLED slot, generation                                           (binary)
    ← {"ok": true, "slot": k, "generation": g, "rows": n, "layout": [...], "nbytes": b} (+ fd)
    → {"op": "extend_slot", "table": t, "rows": n, "slot": k}
    ← {"ok": true, "slot": k, "layout": [...], "nbytes": b} (+ fd)
    → EXTEND  slot, rows, timeout, request id, table                     (binary)
    ← EXTENDED replayed, the slots written                               (binary)
    → RELEASE slot                                                       (binary)
    ← RELEASED                                                           (binary)
    → {"op": "update_priority", "table": t, "index": [...], "priority": [...], "key": [...]}
    ← {"ok": true, "updated": k}
    → {"op": "info", "table": t}
    ← {"ok": true, "info": {...}}
    → {"op": "clear", "table": t}
    ← {"ok": true, "info": {...}}
    ← {"ok": false, "status": s, "error": {"type": ..., "detail": ..., "field": ...}}   any failure

A failure's ``status`` is the HTTP status it stands for (absent: its type's). A time limit
ends the connection with its error first (408 ``InvalidRequest`` naming the flag), where the
client can still take a frame: a hello not sent in time, a frame not whole in time, or no
request in time (``field`` :data:`IDLE_ENDED`: the server read nothing more of the
connection); a client that stops taking an answer is closed without one.

A sample's slot is *leased* to the client until its next request naming the
same slot: the server writes into it only then. ``layout`` and the
descriptor come with the first reply for a slot, and again whenever the
server had to replace the slot (a new batch size); ``generation`` counts the
fills of a slot.

    >>> import torch
    >>> layout = SlotLayout.of({("obs",): ([3], torch.float32), ("done",): ([], torch.bool)}, 4)
    >>> [(c.key, c.offset, c.nbytes) for c in layout.columns], layout.nbytes
    ([(('obs',), 0, 48), (('done',), 64, 4)], 68)
    >>> SlotLayout.from_json(layout.to_json(), 4) == layout
    True
    >>> read_request(sample_frame("cartpole", slot=3, batch_size=32, timeout=None)[HEADER.size:])
    Request(op=1, slot=3, rows=32, timeout=None, table='cartpole', request_id=None)
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from . import dtypes
from .format import SEP, Column, NestedKey
from .request_ids import REQUEST_ID_ENCODING
from .text import json_failure

#: the protocol version a client says hello with (2: binary frames for the hot operations)
VERSION = 2
#: column offsets in a slot are multiples of this (a cache line; any dtype's alignment)
ALIGN = 64
#: bytes of a frame's length prefix
HEADER = struct.Struct("<I")
#: largest control frame either side reads by default (priority updates are the big ones)
MAX_FRAME = 64 << 20
#: the ``field`` of the error a connection left idle too long is ended with (the server read
#: nothing after its last answer: a request sent meanwhile was not read)
IDLE_ENDED = "connection"


class ShmProtocolError(ValueError):
    """A frame or a layout that does not follow the same-host wire."""


def frame(message: Mapping[str, Any]) -> bytes:
    """``message`` as a frame: its JSON's length, then the JSON."""
    body = json.dumps(message, separators=(",", ":")).encode()
    return HEADER.pack(len(body)) + body


def frame_length(header: bytes, limit: int = MAX_FRAME) -> int:
    """The length a frame's 4-byte header announces.

    Raises:
        ShmProtocolError: it is over ``limit``.
    """
    (n,) = HEADER.unpack(header)
    if n > limit:
        raise ShmProtocolError(f"a control frame of {n} bytes exceeds the limit of {limit} bytes")
    return int(n)


def parse_frame(body: bytes) -> dict[str, Any]:
    """The JSON object of a frame's body.

    Raises:
        ShmProtocolError: not a JSON object.
    """
    try:
        message = json.loads(body)
    except (ValueError, RecursionError) as err:  # not UTF-8 or JSON, too deep, a huge integer
        raise ShmProtocolError(f"a control frame is not JSON: {json_failure(err)}") from None
    if not isinstance(message, dict):
        raise ShmProtocolError(f"a control frame is a JSON {type(message).__name__}, not an object")
    return message


# -- binary frames: the hot operations ------------------------------------------
#: the first byte of a JSON frame's body; a binary frame's first byte is its operation
JSON_FRAME = ord("{")
#: the hot operations (requests) and their replies
SAMPLE, EXTEND, RELEASE = 1, 2, 3
SAMPLED, EXTENDED, RELEASED = 0x81, 0x82, 0x83
#: op, slot, batch size, timeout (NaN: the server's default); the table's name follows
_SAMPLE = struct.Struct("<BxHId")
#: op, request id length, slot, rows, timeout; the request id (``REQUEST_ID_ENCODING``,
#: as an HTTP header carries it: one byte a character, so the field holds the contract's
#: longest id, ``request_ids.MAX_REQUEST_ID``), then the table's name follow
_EXTEND = struct.Struct("<BBHId")
#: op, slot
_RELEASE = struct.Struct("<BxH")
#: op, slot, generation
_SAMPLED = struct.Struct("<BxHQ")
#: op, replayed, rows; the slots written follow (int64 each)
_EXTENDED = struct.Struct("<BBxxI")
#: op
_RELEASED = struct.Struct("<B")


class Request(NamedTuple):
    """A binary request as read off its frame (nothing checked beyond its layout: the
    server's parameter models check the values)."""

    op: int
    slot: int
    rows: int  # a sample's batch size, an extend's rows
    timeout: float | None
    table: str
    request_id: str | None


def _framed(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _seconds(timeout: float | None) -> float:
    return math.nan if timeout is None else timeout


def sample_frame(table: str, *, slot: int, batch_size: int, timeout: float | None) -> bytes:
    """A SAMPLE request's frame.

    Raises:
        struct.error: a number out of its field's range.
    """
    return _framed(_SAMPLE.pack(SAMPLE, slot, batch_size, _seconds(timeout)) + table.encode())


def extend_frame(
    table: str, *, slot: int, rows: int, timeout: float | None, request_id: str | None
) -> bytes:
    """An EXTEND request's frame.

    The request id is not checked here: the contract's rule (``request_ids.RequestId``) is, by
    the client before it sends over either door and by the server whichever door it came
    through. The frame carries any id the contract accepts, and more.

    Raises:
        ValueError: a request id that is not latin-1 or longer than 255 characters (the
            field's width): one the contract refuses.
    """
    rid = (request_id or "").encode(REQUEST_ID_ENCODING)
    if len(rid) > 255:
        raise ValueError(f"a request id of {len(rid)} characters does not fit a binary frame")
    head = _EXTEND.pack(EXTEND, len(rid), slot, rows, _seconds(timeout))
    return _framed(head + rid + table.encode())


def release_frame(slot: int) -> bytes:
    """A RELEASE request's frame."""
    return _framed(_RELEASE.pack(RELEASE, slot))


def read_request(body: bytes) -> Request:
    """The binary request of a frame's ``body``.

    Raises:
        ShmProtocolError: an unknown operation, a body of the wrong size, or a name that
            is not UTF-8.
    """
    op = body[0]
    try:
        if op == SAMPLE:
            _, slot, rows, timeout = _SAMPLE.unpack_from(body)
            table, rid = body[_SAMPLE.size :].decode(), None
        elif op == EXTEND:
            _, k, slot, rows, timeout = _EXTEND.unpack_from(body)
            rest = body[_EXTEND.size :]
            if len(rest) < k:
                raise ShmProtocolError("an extend frame shorter than its request id")
            rid, table = rest[:k].decode(REQUEST_ID_ENCODING) or None, rest[k:].decode()
        elif op == RELEASE:
            if len(body) != _RELEASE.size:
                raise ShmProtocolError(f"a release frame is {_RELEASE.size} bytes")
            _, slot = _RELEASE.unpack(body)
            return Request(op, slot, 0, None, "", None)
        else:
            raise ShmProtocolError(f"unknown binary operation {op}")
    except struct.error:
        raise ShmProtocolError(f"a binary frame of operation {op} is too short") from None
    except UnicodeDecodeError:
        raise ShmProtocolError("a table name that is not UTF-8") from None
    return Request(op, slot, rows, None if math.isnan(timeout) else timeout, table, rid)


def sampled_frame(slot: int, generation: int) -> bytes:
    """A SAMPLED reply's frame (a slot the client has mapped already)."""
    return _framed(_SAMPLED.pack(SAMPLED, slot, generation))


def extended_frame(index: bytes, replayed: bool) -> bytes:
    """An EXTENDED reply's frame: the slots written (int64 little-endian bytes)."""
    return _framed(_EXTENDED.pack(EXTENDED, replayed, len(index) // 8) + index)


def extended_length(rows: int) -> int:
    """The body length of the EXTENDED reply to an extend of ``rows`` rows (8 bytes a row:
    past :data:`MAX_FRAME` for 8 Mi rows and more)."""
    return _EXTENDED.size + 8 * rows


def released_frame() -> bytes:
    return _framed(_RELEASED.pack(RELEASED))


def read_reply(body: bytes) -> dict[str, Any]:
    """A reply's body as a JSON reply reads (``{"ok": ..., ...}``), binary or not
    (an extend's ``index`` stays bytes: int64 little-endian).

    Raises:
        ShmProtocolError: neither a JSON object nor a known binary reply.
    """
    if not body or body[0] == JSON_FRAME:
        return parse_frame(body)
    op = body[0]
    try:
        if op == SAMPLED:
            _, slot, generation = _SAMPLED.unpack(body)
            return {"ok": True, "slot": slot, "generation": generation}
        if op == EXTENDED:
            _, replayed, rows = _EXTENDED.unpack_from(body)
            index = body[_EXTENDED.size :]
            if len(index) != 8 * rows:
                raise ShmProtocolError("an extend reply of the wrong size")
            return {"ok": True, "index": index, "replayed": bool(replayed)}
        if op == RELEASED and len(body) == 1:
            return {"ok": True}
    except struct.error:
        pass
    raise ShmProtocolError(f"a malformed binary reply (operation {op})")


@dataclass(frozen=True)
class SlotLayout:
    """The columns of a slot of ``rows`` rows, and its size in bytes."""

    rows: int
    columns: tuple[Column, ...]
    nbytes: int

    @classmethod
    def of(
        cls, schema: Mapping[NestedKey, tuple[list[int] | tuple[int, ...], torch.dtype]], rows: int
    ) -> SlotLayout:
        """The layout of ``rows`` rows of ``schema`` (``{key: (item shape, dtype)}``), in its order."""
        columns, offset = [], 0
        for key, (shape, dtype) in schema.items():
            nbytes = rows * math.prod(shape) * dtype.itemsize
            columns.append(Column(tuple(key), offset, nbytes, dtype, tuple(shape)))
            offset += -(-nbytes // ALIGN) * ALIGN
        end = columns[-1].offset + columns[-1].nbytes if columns else 0
        return cls(rows, tuple(columns), end)

    def to_json(self) -> list[list[Any]]:
        """``[[dotted key, dtype name, shape, offset], ...]``."""
        return [
            [SEP.join(c.key), dtypes.name_of(c.dtype), list(c.shape), c.offset]
            for c in self.columns
        ]

    @classmethod
    def from_json(cls, data: Any, rows: int, *, limit: int | None = None) -> SlotLayout:
        """A layout read from a reply, every column checked to lie inside ``limit`` bytes.

        Raises:
            ShmProtocolError: malformed, an unknown dtype, or a column out of bounds.
        """
        if not isinstance(data, list) or not isinstance(rows, int) or rows < 0:
            raise ShmProtocolError("a slot layout is a list of columns and a row count")
        columns = []
        for entry in data:
            try:
                name, dtype_name, shape, offset = entry
                dtype = dtypes.TORCH[dtype_name]
                shape = tuple(int(d) for d in shape)
                offset = int(offset)
            except (TypeError, ValueError, KeyError):
                raise ShmProtocolError(f"a malformed slot column: {entry!r:.80}") from None
            if any(d < 0 for d in shape) or offset < 0 or offset % dtype.itemsize:
                raise ShmProtocolError(f"a slot column out of bounds: {entry!r:.80}")
            nbytes = rows * math.prod(shape) * dtype.itemsize
            if limit is not None and offset + nbytes > limit:
                raise ShmProtocolError(f"slot column {name!r} ends past the slot's {limit} bytes")
            columns.append(Column(tuple(str(name).split(SEP)), offset, nbytes, dtype, shape))
        end = max((c.offset + c.nbytes for c in columns), default=0)
        return cls(rows, tuple(columns), end)

    def views(self, buffer: Any) -> dict[NestedKey, torch.Tensor]:
        """Tensors viewing each column of ``buffer`` (a writable buffer of at least ``nbytes``)."""
        return self.views_of(self.whole(buffer))

    def whole(self, buffer: Any) -> torch.Tensor:
        """The slot's ``nbytes`` of ``buffer`` as one uint8 tensor (empty: none)."""
        if not self.nbytes:
            return torch.empty(0, dtype=torch.uint8)
        return torch.frombuffer(buffer, dtype=torch.uint8, count=self.nbytes)

    def views_of(self, whole: torch.Tensor) -> dict[NestedKey, torch.Tensor]:
        """Tensors viewing each column of ``whole`` (``nbytes`` uint8): one storage, so a
        column moved (``share_memory_()``) moves them all, ``whole`` too."""
        out = {}
        for c in self.columns:
            if c.nbytes:
                flat = whole[c.offset : c.offset + c.nbytes].view(c.dtype)
            else:
                flat = torch.empty(0, dtype=c.dtype)
            out[c.key] = flat.view(self.rows, *c.shape)
        return out
