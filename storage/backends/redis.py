"""``redis``: tensordict's ``TensorDictStore`` on a Redis (or Dragonfly) server.

Nested keys are stored flat (``next:reward``) because ``from_schema`` rejects
tuple keys on this backend; Redis has no bfloat16, so such a field is stored
as int16 with the same bits and viewed back on read. Every allocation gets
keys of its own (a fresh ``TensorDictStore`` id under the prefix), on a
connection the operator configured by name (:mod:`tdreplay.storage.redis_conn`),
laid out with no row: Redis memory grows as rows are written
(:mod:`~tdreplay.storage.backends.redis_keys`), and recorded under the data root until
they are deleted (:mod:`~tdreplay.storage.backends.redis_records`), so that a process
killed before it deleted them does not leave them in Redis for good.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from tensordict import TensorDictBase, TensorDictStore

from ..errors import BackendError, InsufficientStorage
from ..redis_conn import RedisConnection
from ..spec import NestedKey, TableSpec
from .base import Backend, BackendState, Rows, carrier
from .redis_identity import RedisIdentity, ask
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
from .redis_records import KeysRecord

#: nested keys are joined with this in Redis (``next:reward``)
REDIS_SEP = ":"

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
    not sent in a transaction, which such a Redis refuses whole). Such a Redis
    refuses every write, overwrites of a full table's rows too; while it does,
    :meth:`reserve` asks it before an insert evicts anything. Redis grows a
    string by ``realloc``, which moves it only when it outgrows its allocator's size
    class (a quarter apart): amortized, no quadratic cost, but Redis spends ~5x
    the CPU of a preallocated fill (``bench/redis_bench.py``).

    **Identity.** A marker key and a write count kept with the rows tell a Redis that
    lost the table, or came back from an older snapshot, from one that holds every write
    acknowledged (:mod:`~.redis_identity`): :attr:`state` is then ``"lost"`` and every
    write and read raises :class:`TableLost`.

    **Hangs.** Every command has the connection's timeout, and a timed-out
    command is not retried: redis-py's default policy retries three times and
    each reconnect retries on its own (15 s for a 1 s timeout, measured), so a
    hung Redis fails a call in about the timeout, with :class:`BackendError`.
    A dropped connection is retried once (a restarted Redis). While the last
    marker check failed so, :attr:`state` is ``"unreachable"``.
    """

    kind = "redis"

    def __init__(
        self,
        spec: TableSpec,
        storage: TensorDictBase,
        conn: RedisConnection,
        *,
        held: int = 0,
        record: KeysRecord | None = None,
    ) -> None:
        super().__init__(spec, storage)
        #: where the table's keys are recorded until they are deleted
        self.record = record
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
        #: whether Redis still holds what the table acknowledged
        self.identity = RedisIdentity(spec.name, conn, self.client, storage._redis_key)  # type: ignore[attr-defined]
        self._refusing = False  # Redis refused the last write for memory (see reserve)

    @classmethod
    def allocate(
        cls,
        spec: TableSpec,
        conn: RedisConnection,
        *,
        prefix: str,
        folder: Path,
        preallocate: bool = False,
    ) -> RedisBackend:
        """A fresh ``TensorDictStore`` for ``spec`` under ``prefix``, marked as this table's:
        its fields laid out as ``from_schema`` does, with no row (see :mod:`.redis_keys`),
        or, with ``preallocate``, each field's string sized to the capacity now; its keys
        recorded in the table's own folder ``folder`` first (:mod:`.redis_records`).

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
        record = KeysRecord.write(folder, spec.name, conn.name, prefix, td_id)
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
                record.remove()
            record.release()  # kept if the keys were not deleted: the next sweep does
            if td is not None:
                with contextlib.suppress(Exception):
                    td.close()
            if isinstance(err, redis.RedisError):
                raise failure(spec.name, conn, "allocating the table's keys", err) from err
            raise
        backend = cls(spec, td, conn, held=spec.capacity if preallocate else 0, record=record)
        try:
            backend.identity.mark()
        except BaseException:
            with contextlib.suppress(Exception):
                backend.destroy()
            raise
        return backend

    # -- identity (see redis_identity) -----------------------------------------
    @property
    def state(self) -> BackendState:
        """The table's :attr:`~.redis_identity.RedisIdentity.state`."""
        return self.identity.state

    def probe(self) -> BackendState:
        """:meth:`~.redis_identity.RedisIdentity.probe`."""
        return self.identity.probe()

    def ping(self) -> None:
        """``PING`` the table's Redis (up to the connection's timeout).

        Raises:
            BackendError: Redis failed or did not answer in time.
        """
        self._redis("answering before the table's keys are deleted", self.client.ping)

    def _redis(self, doing: str, fn: Callable[[], T]) -> T:
        """``fn()``, Redis failures raised as :class:`BackendError` naming the connection."""
        return ask(self.spec.name, self.connection, doing, fn)

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
        self.identity.check(
            force=True
        )  # a write into a Redis that lost the table recreates it zero-filled
        raw = self._bytes(data)
        try:
            writes = self._redis(
                "writing rows",
                lambda: put_rows(self.client, self._strings, rows, raw, self.identity.writes_key),
            )
        except InsufficientStorage:
            self._refusing = True
            raise
        self.identity.counted(writes)
        top = rows.stop if isinstance(rows, slice) else int(rows.max()) + 1 if len(rows) else 0
        self.held = max(self.held, top or 0)

    def reserve(self, end: int) -> None:
        """Before an insert claims its rows and evicts the items they hold: while Redis
        refused the last write for memory, ask it first with a write of nothing
        (``SETRANGE`` of no bytes, refused as any write is), so that inserts retried against
        a full Redis evict nothing; nothing is sent otherwise.

        Raises:
            InsufficientStorage: Redis is still out of memory.
            BackendError: Redis failed or did not answer in time.
        """
        if self._refusing:
            key = self.identity.writes_key
            self._redis("writing rows", lambda: self.client.setrange(key, 0, b""))
            self._refusing = False

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
        if self.state == "lost":
            self.identity.check()  # raises
        if not len(index):
            return
        if self.held < self.capacity and int(index.max()) >= self.held:
            self._gather_past_end(index, out)
            return
        acknowledged = self.identity.writes
        got, (marker, writes) = self._redis(
            "reading rows",
            lambda: get_rows(self.client, self._strings, index, self.identity.keys),
        )
        self.identity.verify(marker, writes, acknowledged)
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
        would be Redis memory lost for good. A Redis that fails meanwhile is logged, not
        raised (the process is stopping); the keys stay recorded, and the next start on
        this data root deletes them (:mod:`.redis_records`)."""
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
        """Delete the table's keys (and their record) and close.

        Raises:
            BackendError: Redis failed or did not answer in time (the keys it still holds,
                ``<prefix>:{<id>}:*``, are named; they stay recorded, and the next sweep
                deletes them: :mod:`.redis_records`).
        """
        namespace = self.storage._namespace  # type: ignore[attr-defined]
        td_id = self.storage._td_id  # type: ignore[attr-defined]
        try:
            self._redis(
                f"deleting the table's keys ({namespace}:{{{td_id}}}:*)",
                lambda: delete_keys(self.client, namespace, td_id),
            )
            if self.record is not None:
                self.record.remove()
        finally:
            if self.record is not None:
                self.record.release()
            with contextlib.suppress(Exception):
                self.storage.close()  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                self.client.close()

    @property
    def location(self) -> str | None:
        return self.url
