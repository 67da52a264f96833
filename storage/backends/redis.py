"""``redis``: tensordict's ``TensorDictStore`` on a Redis (or Dragonfly) server.

Nested keys are stored flat (``next:reward``) because ``from_schema`` rejects
tuple keys on this backend; Redis has no bfloat16, so such a field is stored
as int16 with the same bits and viewed back on read. Every allocation gets
keys of its own (a fresh ``TensorDictStore`` id under the prefix), on a
connection the operator configured by name (:mod:`tdreplay.storage.redis_conn`),
laid out with no row: Redis memory grows as rows are written
(:mod:`~tdreplay.storage.backends.redis_keys`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import NoReturn, TypeVar

import torch
from tensordict import TensorDictBase, TensorDictStore

from ..errors import BackendError, TableLost, TDReplayError
from ..redis_conn import RedisConnection
from ..spec import NestedKey, TableSpec
from .base import Backend, BackendState, Rows, carrier
from .redis_keys import (
    check_string_sizes,
    delete_keys,
    failure,
    get_rows,
    lay_out,
    put_rows,
    redis_client,
    retry_policy,
)

#: nested keys are joined with this in Redis (``next:reward``)
REDIS_SEP = ":"
#: the suffix of a redis table's marker key (``<prefix>:{<td_id>}:__tdreplay__``)
REDIS_MARKER = "__tdreplay__"
#: the suffix of a redis table's write count (see :class:`RedisBackend`, **Identity**)
REDIS_WRITES = "__tdreplay_writes__"
#: seconds between two marker checks before reads (writes check every time)
MARKER_INTERVAL = 1.0

T = TypeVar("T")
log = logging.getLogger("tdreplay.storage")


class RedisBackend(Backend):
    """``redis``: tensordict's ``TensorDictStore``, nested keys stored flat.

    **Rows.** Each field is one Redis string, rows one after the other, made empty
    at create (:func:`~.redis_keys.lay_out`): a write past its end grows it (Redis
    zero-fills a gap), so Redis holds the rows up to the last one written, not the
    capacity, unless the table was preallocated. Rows ``[0, held)`` are in every
    field's string (:attr:`held`, moved by each write that succeeded); a read of
    rows past it, which hold no item, gives zeros without asking Redis (its
    ``GETRANGE`` past a string's end answers fewer bytes). A Redis out of memory
    (``maxmemory``, noeviction) refuses a write with :class:`InsufficientStorage`
    (507): the rows are not written, the table serves what it holds (reads are
    not sent in a transaction, which such a Redis refuses whole). Redis grows a
    string by ``realloc``, which moves it only when it outgrows its allocator's size
    class (a quarter apart): amortized, no quadratic cost, but Redis spends ~5x
    the CPU of a preallocated fill (``bench/redis_bench.py``).

    **Identity.** At allocation a marker key, ``<prefix>:{<td_id>}:__tdreplay__``,
    is written with the table's name and a random epoch. A Redis that restarts
    without persistence, or is flushed, loses it with the rows; and there
    ``TensorDictStore`` would read missing keys as nothing and a write would
    recreate them zero-filled, so the table would serve zeros. A Redis that restarts
    from an older snapshot (an RDB saved before the last writes, an AOF that missed
    them) or a replica promoted behind its primary keeps the marker but not the rows
    written since: its strings end before them, or hold older rows where the table
    wrapped (or was preallocated) - lengths cannot tell the second case. So every write
    also counts itself in ``...:__tdreplay_writes__`` (``INCR``, in the transaction that
    writes its rows: a snapshot holds both or neither), and the table keeps the count
    Redis answered for its last acknowledged write (:attr:`writes`): a Redis whose count
    is lower lost acknowledged writes. Marker and count are read together (one ``MGET``)
    before every write, with every read's rows (in the same pipeline: the rows and their
    proof come from one Redis) and by :meth:`probe` (at most once a second,
    :data:`MARKER_INTERVAL`); nothing extra is sent. Once either is wrong the table's
    :attr:`state` is ``"lost"`` and every write and read raises :class:`TableLost`,
    naming what is missing.

    **Hangs.** Every command has the connection's timeout, and a timed-out
    command is not retried: redis-py's default policy retries three times and
    each reconnect retries on its own (15 s for a 1 s timeout, measured), so a
    hung Redis fails a call in about the timeout, with :class:`BackendError`.
    A dropped connection is retried once (a restarted Redis). While the last
    marker check failed so, :attr:`state` is ``"unreachable"``.
    """

    kind = "redis"

    def __init__(
        self, spec: TableSpec, storage: TensorDictBase, conn: RedisConnection, *, held: int = 0
    ) -> None:
        super().__init__(spec, storage)
        self.connection: RedisConnection = conn
        self.url = conn.describe()
        self.flat = {k: REDIS_SEP.join(k) for k in self.keys}
        self.client = redis_client(conn)
        self._item_nbytes = sum(self._row_nbytes)
        #: (data string, row bytes) of every field, in :attr:`keys` order
        self._strings: list[tuple[str, int]] = [
            (storage._data_key(self.flat[k]), nbytes)  # type: ignore[attr-defined]
            for k, nbytes in zip(self.keys, self._row_nbytes, strict=True)
        ]
        #: rows ``[0, held)`` are in every field's string (see the class docstring)
        self.held = held
        #: the marker key and the write count's key (see the class docstring), read together
        self.marker_key: str = storage._redis_key(REDIS_MARKER)  # type: ignore[attr-defined]
        self.writes_key: str = storage._redis_key(REDIS_WRITES)  # type: ignore[attr-defined]
        self._identity = [self.marker_key, self.writes_key]
        self._marker = b""
        #: the write count Redis answered for the last write acknowledged (writes are serial)
        self.writes = 0
        self._lost: TableLost | None = None
        self._unreachable = False  # the last marker check failed
        self._checked = 0.0
        self._probing = threading.Lock()

    @classmethod
    def allocate(
        cls, spec: TableSpec, conn: RedisConnection, *, prefix: str, preallocate: bool = False
    ) -> RedisBackend:
        """A fresh ``TensorDictStore`` for ``spec`` under ``prefix``, marked as this table's:
        its fields laid out as ``from_schema`` does, with no row (see :mod:`.redis_keys`),
        or, with ``preallocate``, each field's string sized to the capacity now.

        Raises:
            InsufficientStorage: a field is longer than the Redis's longest string, or the
                Redis is out of memory (nothing is left there).
            BackendError: Redis failed or did not answer in time (nothing is left there).
        """
        import redis
        from redis.asyncio.retry import Retry

        schema = spec.torch_schema()
        flat = {REDIS_SEP.join(k): (s, carrier(d)) for k, (s, d) in schema.items()}
        check_string_sizes(spec, flat, conn)
        td_id = str(uuid.uuid4())  # ours, so that what a failed allocation wrote can be found
        td = None
        try:
            td = TensorDictStore(
                batch_size=[spec.capacity],
                prefix=prefix,
                td_id=td_id,
                retry=Retry(*retry_policy()),  # type: ignore[arg-type]
                **conn.kwargs(),
            )
            lay_out(td, flat, whole=preallocate)
        except (
            BaseException
        ) as err:  # Redis applies a pipeline's commands up to the one that failed
            with contextlib.suppress(Exception):
                client = redis_client(conn)
                try:
                    delete_keys(client, prefix, td_id)
                finally:
                    client.close()
            if td is not None:
                with contextlib.suppress(Exception):
                    td.close()
            if isinstance(err, redis.RedisError):
                raise failure(spec.name, conn, "allocating the table's keys", err) from err
            raise
        backend = cls(spec, td, conn, held=spec.capacity if preallocate else 0)
        try:
            backend.mark()
        except BaseException:
            with contextlib.suppress(Exception):
                backend.destroy()
            raise
        return backend

    # -- identity ------------------------------------------------------------
    def mark(self) -> None:
        """Write the marker key: this table's name and a fresh epoch."""
        body = {"table": self.spec.name, "epoch": uuid.uuid4().hex, "created_at": time.time()}
        self._marker = json.dumps(body).encode()
        self._redis(
            "writing the table's marker", lambda: self.client.set(self.marker_key, self._marker)
        )
        self._checked = time.monotonic()

    @property
    def state(self) -> BackendState:
        """``"ok"``; ``"unreachable"`` while the last marker check failed (Redis down, hung
        or refusing: back to ``"ok"`` once a check succeeds); ``"lost"`` once the marker was
        found missing (never back to ``"ok"``)."""
        if self._lost is not None:
            return "lost"
        return "unreachable" if self._unreachable else "ok"

    def check(self, *, force: bool = False) -> None:
        """Check the marker and the write count (unless checked less than
        :data:`MARKER_INTERVAL` ago and not ``force``).

        Raises:
            TableLost: the marker is missing or not this table's, or Redis counts fewer
                writes than the table acknowledged.
            BackendError: Redis failed or did not answer in time.
        """
        if self._lost is not None:
            raise self._lost
        if not force and time.monotonic() - self._checked < MARKER_INTERVAL:
            return
        try:
            marker, writes = self._redis(
                "checking the table's marker", lambda: self.client.mget(self._identity)
            )
        except BackendError:
            self._unreachable = True
            raise
        self._verify(marker, writes)

    def _verify(self, marker: bytes | None, writes: bytes | None) -> None:
        """Whether Redis, answering ``marker`` and ``writes`` (the values of the marker key
        and the write count, ``None`` where missing), holds every write acknowledged.

        Raises:
            TableLost: it does not (the table is ``"lost"`` from now on).
        """
        self._unreachable = False
        if marker != self._marker:
            self._lose(
                f"the marker key {self.marker_key!r} written when the table was created is "
                "missing, so that Redis restarted without persistence, or was flushed, or "
                "evicted the keys"
            )
        held = int(writes or 0)
        if held < self.writes:
            self._lose(self._behind(held))
        self._checked = time.monotonic()

    def _behind(self, held: int) -> str:
        """Why a Redis that counts ``held`` of the table's writes lost some."""
        return (
            f"it holds older data than the table acknowledged: {held} of the table's writes "
            f"are there ({self.writes_key!r}), {self.writes} were acknowledged, so the rows of "
            f"the last {self.writes - held} are missing, or older rows stand in their place. "
            "That Redis restarted from an older snapshot (an RDB saved before those writes, "
            "an append-only file that did not have them yet), or a replica behind its "
            "primary took over"
        )

    def probe(self) -> BackendState:
        """:meth:`check` without raising, one probe at a time; returns :attr:`state`."""
        if self._lost is None and self._probing.acquire(blocking=False):
            try:
                self.check()
            except TDReplayError:
                pass  # lost or unreachable: in the state
            finally:
                self._probing.release()
        return self.state

    def _lose(self, why: str) -> NoReturn:
        """The table is ``"lost"`` from now on, for ``why``: log it and raise :class:`TableLost`."""
        self._lost = TableLost(
            f"table {self.spec.name!r}: its data in Redis {self.connection.name!r} ({self.url}) "
            f"is not what the table acknowledged: {why}. The table serves nothing rather than "
            "zeros or older rows: restore it from a checkpoint, or delete it and create it "
            "again (Redis persistence, appendonly yes with appendfsync always, keeps every "
            "acknowledged row across Redis restarts)",
            table=self.spec.name,
        )
        log.error("%s", self._lost.message)
        raise self._lost

    def _redis(self, doing: str, fn: Callable[[], T]) -> T:
        """``fn()``, Redis failures raised as :class:`BackendError` naming the connection."""
        import redis

        try:
            return fn()
        except redis.RedisError as err:
            raise failure(self.spec.name, self.connection, doing, err) from err

    # -- I/O -----------------------------------------------------------------
    def _bytes(self, data: Mapping[NestedKey, torch.Tensor]) -> list[memoryview]:
        """Each field's bytes of ``data``, in :attr:`keys` order (bfloat16 as its int16 bits)."""
        return [data[k].contiguous().view(-1).view(torch.uint8).numpy().data for k in self.keys]

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        """Write ``rows``, counted in the table's write count (:func:`~.redis_keys.put_rows`):
        each field's string grows to the last of them as needed.

        Raises:
            TableLost: the Redis lost the table, or acknowledged writes.
            InsufficientStorage: the Redis is out of memory (it refuses every write then, to
                rows it holds too); nothing of ``rows`` counts as written (the table marks
                them empty).
            BackendError: Redis failed or did not answer in time.
        """
        self.check(force=True)  # a write into a Redis that lost the table recreates it zero-filled
        raw = self._bytes(data)
        writes = self._redis(
            "writing rows",
            lambda: put_rows(self.client, self._strings, rows, raw, self.writes_key),
        )
        if writes <= self.writes:  # it went back between the check and the write
            self._lose(self._behind(writes - 1))
        self.writes = writes
        top = rows.stop if isinstance(rows, slice) else int(rows.max()) + 1 if len(rows) else 0
        self.held = max(self.held, top or 0)

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        """Copy rows ``index`` into ``out`` (see the class docstring for rows past
        :attr:`held`), read with :func:`~.redis_keys.get_rows` with the marker and the write
        count, checked before the rows are used: a Redis past its ``maxmemory`` still
        serves them.

        Raises:
            TableLost: the Redis lost the table, or acknowledged writes.
            BackendError: Redis failed or did not answer in time, or a string is shorter
                than the rows written.
        """
        if self._lost is not None:
            raise self._lost
        if not len(index):
            return
        if self.held < self.capacity and int(index.max()) >= self.held:
            self._gather_past_end(index, out)
            return
        got, identity = self._redis(
            "reading rows", lambda: get_rows(self.client, self._strings, index, self._identity)
        )
        self._verify(*identity)
        for key, data in zip(self.keys, got, strict=True):
            target = out[key]
            if len(data) != target.numel() * target.element_size():
                raise BackendError(
                    f"table {self.spec.name!r}: Redis {self.connection.name!r} ({self.url}) answered "
                    f"{len(data)} bytes for {len(index)} rows of field {self.flat[key]!r}",
                    table=self.spec.name,
                )
            raw = torch.frombuffer(bytearray(data), dtype=carrier(self.dtypes[key]))
            if self.dtypes[key] == torch.bfloat16:
                raw = raw.view(torch.bfloat16)
            target.copy_(raw.view(target.shape))

    def _gather_past_end(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        """:meth:`gather` of rows some of which are past :attr:`held`: the strings end before
        them (``GETRANGE`` would answer fewer bytes), and they read as zeros, as a row
        never written does on every backend (no live item is ever there)."""
        inside = index < self.held
        for value in out.values():
            value.zero_()
        if bool(inside.any()):
            part = self.read(index[inside])
            for key, value in out.items():
                value[inside] = part[key]

    @property
    def reserved_bytes(self) -> int:
        """Bytes of rows Redis holds: every field's string up to the last row written (the
        capacity when preallocated)."""
        return self.held * self._item_nbytes

    def close(self) -> None:
        """:meth:`destroy`: nothing ever reattaches a redis table's keys (a process
        allocates its tables afresh, and serves a checkpoint's rows), so keys left behind
        would be the table's capacity of Redis memory lost for good, at every restart.
        A Redis that fails meanwhile is logged, not raised (the process is stopping)."""
        try:
            self.destroy()
        except Exception as err:
            log.warning(
                "table %r: its keys in Redis %r were not deleted: %s",
                self.spec.name,
                self.connection.name,
                err,
            )

    def destroy(self) -> None:
        try:
            td_id = self.storage._td_id  # type: ignore[attr-defined]
            delete_keys(self.client, self.storage._namespace, td_id)  # type: ignore[attr-defined]
        finally:
            with contextlib.suppress(Exception):
                self.storage.close()  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                self.client.close()

    @property
    def location(self) -> str | None:
        return self.url
