"""Memory of recent extend request ids, so that a retried extend inserts once.

A client sends ``X-Request-Id`` on every extend and the same id on every
retry of it. The first request with an id runs; a later one with the same id
(within ``ttl`` seconds, and among the last ``size`` ids) gets the first
one's answer and inserts nothing. A retry that arrives while the first is
still running waits for it. A request that fails is forgotten, so its retry
runs again.

A retry resends the same rows, so each request's ``fingerprint`` is kept
with its id: its row count, initial priority and :class:`RowsFingerprint`.
A request whose fingerprint differs from the first one's is no retry but an
id used twice: it is refused, rather than answered with the other rows'
slots while its own rows are dropped. The guarantee is what the
fingerprint reads: a CRC-32 of the table's :data:`FINGERPRINT_COLUMNS`
widest columns (a CartPole transition's observations, action and the
trajectory id; an Atari transition's frames, action and reward), every
byte of a column up to :data:`WHOLE_ROW_BYTES` bytes a row and
:data:`ROW_SAMPLES` bytes of every row of a wider one, at fixed strides
across it. Other rows of the same count that differ only in what it does
not read (the done flags, a few pixels of a frame), or whose CRCs collide
(about one pair in 4 billion), are taken for a retry. Reading every byte
costs more than the extend itself for Atari frames, and a microsecond a
column for narrow ones (11 for a CartPole transition).

Ids outlive a crash where the table keeps its items' tags (memmap tables:
see ``Table.tagged``): each insert is tagged with :func:`request_tag` of its
id and fingerprint, and a handle reopened after a restart is
:meth:`~RecentRequests.seed`-ed with the tags of the items found, so the
retry of an extend whose answer the crash swallowed inserts nothing again.
A tag names the id and the rows together: after a restart, a request that
reuses an id for other rows is not recognised, and inserts as a new one.

The memory is bounded three ways, the oldest ids forgotten first: ``size``
ids, ``ttl`` seconds, and ``max_bytes`` bytes. The bytes are counted from
what is held: the id, the answer (see :func:`answer_bytes`) and a fixed
:data:`ENTRY_BYTES` for the bookkeeping of each id. An answer bigger than
``max_bytes`` on its own is not remembered; a retry of it runs again.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import sys
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from typing import Any

import numpy as np
import torch

from tdreplay.codec.ipc import Schema
from tdreplay.storage import InvalidRequest, NestedKey

#: bytes of bookkeeping per remembered id besides the id and the answer: the
#: OrderedDict slot and node, the entry, its timestamp and its future (measured
#: with tracemalloc on CPython 3.11: about 290)
ENTRY_BYTES = 300


def answer_bytes(answer: Any) -> int:
    """Bytes an answer holds: bytes, strings and numbers, in tuples, lists and dicts.

    Any other object counts as ``sys.getsizeof`` says (its own size, not what it
    refers to). Keep answers compact (e.g. the encoded response body): a list
    of Python ints costs 36 bytes an item.

    >>> answer_bytes((3, b"x" * 100)) == sys.getsizeof((3, b"")) + 28 + sys.getsizeof(b"x" * 100)
    True
    """
    if isinstance(answer, tuple | list):
        return sys.getsizeof(answer) + sum(answer_bytes(a) for a in answer)
    if isinstance(answer, dict):
        return sys.getsizeof(answer) + sum(
            answer_bytes(k) + answer_bytes(v) for k, v in answer.items()
        )
    return sys.getsizeof(answer)


#: how many of a table's columns the fingerprint reads: those of the most bytes a row
FINGERPRINT_COLUMNS = 4
#: a column of at most this many bytes a row enters the fingerprint whole
WHOLE_ROW_BYTES = 256
#: bytes of each row of a wider column that enter it, at fixed strides across the row
ROW_SAMPLES = 32


class RowsFingerprint:
    """A CRC-32 of what a table's rows hold, cheap enough to take on every extend.

    It reads the :data:`FINGERPRINT_COLUMNS` columns of the most bytes a row
    (the first in the schema among equals): every byte of such a column of at
    most :data:`WHOLE_ROW_BYTES` bytes a row, and :data:`ROW_SAMPLES` bytes of
    each row of a wider one, one every ``row_bytes // ROW_SAMPLES``. Each column
    read costs about a microsecond however narrow, which is why it reads a few.

    Args:
        schema: the table's fields, ``{key: (shape, dtype)}``.

    >>> schema = {("obs",): ([1000], torch.uint8), ("done",): ([], torch.bool)}
    >>> fingerprint = RowsFingerprint(schema)
    >>> rows = {("obs",): torch.zeros(4, 1000, dtype=torch.uint8), ("done",): torch.zeros(4)}
    >>> before = fingerprint(rows)
    >>> rows[("obs",)][3, 0] = 1  # row 3, byte 0: read
    >>> fingerprint(rows) != before
    True
    """

    def __init__(self, schema: Schema) -> None:
        def row_bytes(field: tuple[list[int], torch.dtype]) -> int:
            shape, dtype = field
            return math.prod(shape) * dtype.itemsize

        widest = sorted(schema, key=lambda k: -row_bytes(schema[k]))[:FINGERPRINT_COLUMNS]
        #: the columns read, in schema order, each with its dtype
        self.keys = [(key, schema[key][1]) for key in schema if key in widest]

    def __call__(self, columns: Mapping[NestedKey, torch.Tensor]) -> int:
        """The CRC-32 of flat ``columns`` ``[N, ...]``. A column missing or not of its field's
        dtype is left out (the insert refuses such rows)."""
        crc = 0
        for key, dtype in self.keys:
            column = columns.get(key)
            if column is None or column.dtype != dtype or not column.ndim:
                continue
            if dtype == torch.bfloat16:  # numpy has no bfloat16: the same bytes
                column = column.view(torch.int16)
            data = np.ascontiguousarray(column.numpy())
            if data.nbytes > WHOLE_ROW_BYTES * len(data):
                data = data.reshape(len(data), -1).view(np.uint8)
                data = data[:, :: data.shape[1] // ROW_SAMPLES].copy()
            crc = zlib.crc32(data.data, crc)
        return crc


def request_tag(request_id: str, fingerprint: object = None) -> int:
    """A nonzero int64 naming ``request_id`` sent with ``fingerprint`` (the first 8 bytes
    of the BLAKE2b hash of both).

    >>> request_tag("a") == request_tag("a") != request_tag("b")
    True
    >>> request_tag("a", "3 rows") != request_tag("a", "4 rows")
    True
    """
    named = request_id if fingerprint is None else f"{request_id}\0{fingerprint}"
    digest = hashlib.blake2b(named.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True) or 1


class _Entry:
    __slots__ = ("fingerprint", "future", "nbytes", "time")

    def __init__(
        self, time: float, future: asyncio.Future[Any], nbytes: int, fingerprint: Hashable
    ) -> None:
        self.time = time
        self.future = future
        self.nbytes = nbytes
        self.fingerprint = fingerprint


class RecentRequests:
    """A bounded, expiring map ``request id -> answer`` (one per table).

    Args:
        size: ids remembered at most (the oldest are forgotten first).
        ttl: seconds an id is remembered.
        max_bytes: bytes the remembered ids and answers may hold (the oldest
            are forgotten first; see the module docstring).

    >>> import asyncio
    >>> recent = RecentRequests(size=2, ttl=60)
    >>> calls = []
    >>> async def insert():
    ...     calls.append(1)
    ...     return {"rows": 1}
    >>> async def main():
    ...     a = await recent.run("id-1", insert)
    ...     b = await recent.run("id-1", insert)
    ...     return a, b, len(calls)
    >>> asyncio.run(main())
    (({'rows': 1}, False), ({'rows': 1}, True), 1)
    >>> 0 < recent.nbytes < 1000
    True
    """

    def __init__(self, size: int = 10_000, ttl: float = 300.0, max_bytes: int = 64 << 20) -> None:
        self.size = size
        self.ttl = ttl
        self.max_bytes = max_bytes
        #: bytes held now (ids, answers, bookkeeping)
        self.nbytes = 0
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._seeded: dict[int, Any] = {}
        self._seeded_at = 0.0

    def seed(self, answers: dict[int, Any]) -> None:
        """Remember ``{request_tag(id, fingerprint): answer}`` found in a reopened table
        (kept ``ttl`` seconds from now; at most ``size`` of them)."""
        self._seeded = dict(list(answers.items())[: self.size])
        self._seeded_at = time.monotonic()

    def __len__(self) -> int:
        return len(self._entries)

    def _forget_oldest(self) -> None:
        _, entry = self._entries.popitem(last=False)
        self.nbytes -= entry.nbytes

    def _forget(self, request_id: str, future: asyncio.Future[Any]) -> None:
        entry = self._entries.get(request_id)
        if entry is not None and entry.future is future:
            del self._entries[request_id]
            self.nbytes -= entry.nbytes

    def _shrink(self) -> None:
        while self._entries and (len(self._entries) > self.size or self.nbytes > self.max_bytes):
            self._forget_oldest()

    def _expire(self, now: float) -> None:
        while self._entries:
            entry = next(iter(self._entries.values()))
            if now - entry.time <= self.ttl or not entry.future.done():
                break
            self._forget_oldest()

    async def run(
        self,
        request_id: str | None,
        call: Callable[[], Awaitable[Any]],
        fingerprint: Hashable = None,
    ) -> tuple[Any, bool]:
        """``(answer, replayed)``: ``call()``'s answer, or the remembered one for ``request_id``.

        Raises:
            InvalidRequest: ``request_id`` is remembered with another ``fingerprint``
                (nothing runs).
        """
        if not request_id or self.size == 0 or self.max_bytes == 0:
            return await call(), False
        now = time.monotonic()
        self._expire(now)
        entry = self._entries.get(request_id)
        if entry is not None:
            if entry.fingerprint != fingerprint:
                raise InvalidRequest(
                    f"X-Request-Id {request_id!r} was sent with {entry.fingerprint}, now with "
                    f"{fingerprint}: a retry resends the same request, a new one needs a new id",
                    field="X-Request-Id",
                    expected=str(entry.fingerprint),
                    got=str(fingerprint),
                )
            return await asyncio.shield(entry.future), True
        if self._seeded:
            if now - self._seeded_at > self.ttl:
                self._seeded = {}
            elif (seeded := self._seeded.get(request_tag(request_id, fingerprint))) is not None:
                return seeded, True
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        entry = _Entry(now, fut, ENTRY_BYTES + sys.getsizeof(request_id), fingerprint)
        self._entries[request_id] = entry
        self.nbytes += entry.nbytes
        self._shrink()
        try:
            answer = await call()
        except BaseException as err:
            self._forget(request_id, fut)
            if isinstance(err, Exception):
                fut.set_exception(err)
                fut.exception()  # retrieved: no "never retrieved" warning when nobody waited
            else:
                fut.cancel()
            raise
        fut.set_result(answer)
        if self._entries.get(request_id) is entry:  # not forgotten while it ran
            size = answer_bytes(answer)
            entry.nbytes += size
            self.nbytes += size
            if entry.nbytes > self.max_bytes:
                self._forget(request_id, fut)  # alone over the bound: not remembered
            else:
                self._shrink()
        return answer, False
