"""``redis``: tensordict's ``TensorDictStore`` on a Redis (or Dragonfly) server.

Nested keys are stored flat (``next:reward``) because ``from_schema`` rejects
tuple keys on this backend; Redis has no bfloat16, so such a field is stored
as int16 with the same bits and viewed back on read. Every allocation gets
keys of its own (a fresh ``TensorDictStore`` id under the prefix), on a
connection the operator configured by name (:mod:`tdreplay.storage.redis_conn`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch
from tensordict import TensorDict, TensorDictBase

from ..errors import BackendError, InsufficientStorage, TableLost, TDReplayError
from ..redis_conn import RedisConnection
from ..spec import NestedKey, TableSpec
from .base import Backend, BackendState, Rows, carrier

#: nested keys are joined with this in Redis (``next:reward``)
REDIS_SEP = ":"
#: the suffix of a redis table's marker key (``<prefix>:{<td_id>}:__tdreplay__``)
REDIS_MARKER = "__tdreplay__"
#: seconds between two marker checks before reads (writes check every time)
MARKER_INTERVAL = 1.0

T = TypeVar("T")
log = logging.getLogger("tdreplay.storage")


class RedisBackend(Backend):
    """``redis``: tensordict's ``TensorDictStore``, nested keys stored flat.

    **Identity.** At allocation a marker key, ``<prefix>:{<td_id>}:__tdreplay__``,
    is written with the table's name and a random epoch. A Redis that restarts
    without persistence, or is flushed, loses it with the rows; and there
    ``TensorDictStore`` would read missing keys as nothing and a write would
    recreate them zero-filled, so the table would serve zeros. The marker is
    checked before every write and, at most once a second (:data:`MARKER_INTERVAL`),
    before reads (and after any read that failed on the data); once it is
    missing the table's :attr:`state` is ``"lost"`` and every write and read
    raises :class:`TableLost`.

    **Hangs.** Every command has the connection's timeout, and a timed-out
    command is not retried: redis-py's default policy retries three times and
    each reconnect retries on its own (15 s for a 1 s timeout, measured), so a
    hung Redis fails a call in about the timeout, with :class:`BackendError`.
    A dropped connection is retried once (a restarted Redis). While the last
    marker check failed so, :attr:`state` is ``"unreachable"``.
    """

    kind = "redis"

    def __init__(self, spec: TableSpec, storage: TensorDictBase, conn: RedisConnection) -> None:
        super().__init__(spec, storage)
        self.connection: RedisConnection = conn
        self.url = conn.describe()
        self.flat = {k: REDIS_SEP.join(k) for k in self.keys}
        self.client = _redis_client(conn)
        #: the marker key (see the class docstring) and what it holds
        self.marker_key: str = storage._redis_key(REDIS_MARKER)  # type: ignore[attr-defined]
        self._marker = b""
        self._lost = False
        self._unreachable = False  # the last marker check failed
        self._checked = 0.0
        self._probing = threading.Lock()

    @classmethod
    def allocate(cls, spec: TableSpec, conn: RedisConnection, *, prefix: str) -> RedisBackend:
        """A fresh ``TensorDictStore`` for ``spec`` under ``prefix``, marked as this table's.

        Raises:
            BackendError: Redis failed or did not answer in time (nothing is left there).
        """
        from redis.asyncio.retry import Retry

        schema = spec.torch_schema()
        flat = {REDIS_SEP.join(k): (s, carrier(d)) for k, (s, d) in schema.items()}
        _check_string_sizes(spec, flat, conn)
        td_id = str(uuid.uuid4())  # ours, so that what a failed allocation wrote can be found
        try:
            td = TensorDict.from_schema(
                flat,
                batch_size=[spec.capacity],
                storage="redis",
                prefix=prefix,
                td_id=td_id,
                retry=Retry(*_retry_policy()),  # type: ignore[arg-type]
                **conn.kwargs(),
            )
        except BaseException:  # Redis applies a pipeline's commands up to the one that failed
            with contextlib.suppress(Exception):
                client = _redis_client(conn)
                try:
                    _delete_keys(client, prefix, td_id)
                finally:
                    client.close()
            raise
        backend = cls(spec, td, conn)
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
        if self._lost:
            return "lost"
        return "unreachable" if self._unreachable else "ok"

    def check(self, *, force: bool = False) -> None:
        """Check the marker (unless checked less than :data:`MARKER_INTERVAL` ago and not ``force``).

        Raises:
            TableLost: the marker is missing or not this table's.
            BackendError: Redis failed or did not answer in time.
        """
        if self._lost:
            raise self._lost_error()
        if not force and time.monotonic() - self._checked < MARKER_INTERVAL:
            return
        try:
            got = self._redis(
                "checking the table's marker", lambda: self.client.get(self.marker_key)
            )
        except BackendError:
            self._unreachable = True
            raise
        self._unreachable = False
        if got != self._marker:
            self._lost = True
            log.error("%s", self._lost_error().message)
            raise self._lost_error()
        self._checked = time.monotonic()

    def probe(self) -> BackendState:
        """:meth:`check` without raising, one probe at a time; returns :attr:`state`."""
        if not self._lost and self._probing.acquire(blocking=False):
            try:
                self.check()
            except TDReplayError:
                pass  # lost or unreachable: in the state
            finally:
                self._probing.release()
        return self.state

    def _lost_error(self) -> TableLost:
        return TableLost(
            f"table {self.spec.name!r}: its data in Redis {self.connection.name!r} ({self.url}) is gone: "
            f"the marker key {self.marker_key!r} written when the table was created is missing, "
            "so that Redis restarted without persistence, or was flushed, or evicted the keys. "
            "The table serves nothing rather than zeros: restore it from a checkpoint, or delete "
            "it and create it again (Redis persistence, appendonly yes, keeps tables across "
            "Redis restarts)",
            table=self.spec.name,
        )

    def _redis(self, doing: str, fn: Callable[[], T]) -> T:
        """``fn()``, Redis failures raised as :class:`BackendError` naming the connection."""
        import redis

        try:
            return fn()
        except redis.RedisError as err:
            raise _failure(self.spec.name, self.connection, doing, err) from err

    # -- I/O -----------------------------------------------------------------
    def _pack(self, data: Mapping[NestedKey, torch.Tensor], n: int) -> TensorDict:
        return TensorDict(
            {
                self.flat[k]: (v.view(torch.int16) if v.dtype == torch.bfloat16 else v).contiguous()
                for k, v in data.items()
            },
            batch_size=[n],
        )

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        self.check(force=True)  # a write into a Redis that lost the table recreates it zero-filled
        n = next(iter(data.values())).shape[0]
        packed = self._pack(data, n)

        def put() -> None:
            self.storage[rows] = packed

        try:
            self._redis("writing rows", put)
        except BackendError:
            raise
        except Exception as err:
            raise BackendError(
                f"redis write failed at {self.url}: {err}", table=self.spec.name
            ) from err

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        self.check()
        try:
            got = self._redis("reading rows", lambda: self.storage[index])
        except BackendError:
            raise
        except Exception as err:  # missing keys read as b"": a lost table, most likely
            self.check(force=True)
            raise BackendError(
                f"redis read failed at {self.url}: {err}", table=self.spec.name
            ) from err
        for key in self.keys:
            value = got.get(self.flat[key])
            if self.dtypes[key] == torch.bfloat16:
                value = value.view(torch.bfloat16)
            out[key].copy_(value)

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
            _delete_keys(self.client, self.storage._namespace, td_id)  # type: ignore[attr-defined]
        finally:
            with contextlib.suppress(Exception):
                self.storage.close()  # type: ignore[attr-defined]
            with contextlib.suppress(Exception):
                self.client.close()

    @property
    def location(self) -> str | None:
        return self.url


def _delete_keys(client: Any, namespace: str, td_id: str) -> None:
    """Delete every key of the ``TensorDictStore`` ``td_id`` under ``namespace``."""
    keys = list(client.scan_iter(match=f"{namespace}:{{{td_id}}}:*", count=1000))
    if keys:
        client.delete(*keys)


def _failure(table: str, conn: RedisConnection, doing: str, err: Exception) -> BackendError:
    """The error of a Redis call of ``table`` that failed (``err``) while ``doing`` something."""
    import redis

    if isinstance(err, redis.TimeoutError):
        return BackendError(
            f"table {table!r}: Redis {conn.name!r} ({conn.describe()}) did not answer within "
            f"{conn.timeout:g}s (--redis-timeout) while {doing}; it is hung, overloaded or "
            "unreachable",
            table=table,
        )
    return BackendError(
        f"table {table!r}: Redis {conn.name!r} ({conn.describe()}) failed while {doing}: {err}",
        table=table,
    )


def _check_string_sizes(
    spec: TableSpec, flat: Mapping[str, tuple[Any, torch.dtype]], conn: RedisConnection
) -> None:
    """Refuse a table with a field longer than the Redis's longest string before writing
    anything: each field is one string of capacity x row bytes, and a Redis refuses one
    past ``proto-max-bulk-len`` (512 MiB by default) - for good, whatever a retry does.

    Raises:
        InsufficientStorage: a field is longer than that (507, naming it and the limit).
        BackendError: the Redis failed or did not answer in time (the one wait for it).
    """
    import redis

    client = _redis_client(conn)
    try:
        limit = int(client.config_get("proto-max-bulk-len").get("proto-max-bulk-len", 0))
    except (redis.ResponseError, ValueError):  # CONFIG not allowed (a managed Redis): let it try
        return
    except redis.RedisError as err:  # down or silent: fail now, not after a second wait
        raise _failure(spec.name, conn, "reading its longest string", err) from err
    finally:
        client.close()
    for key, (shape, dtype) in flat.items():
        nbytes = spec.capacity * math.prod(shape) * dtype.itemsize
        if limit and nbytes > limit:
            raise InsufficientStorage(
                f"table {spec.name!r}: field {key!r} takes {nbytes} bytes at capacity "
                f"{spec.capacity}, one Redis string, and Redis {conn.name!r} holds strings of "
                f"at most {limit} bytes (proto-max-bulk-len); lower the capacity, raise that "
                "limit, or use another backend",
                table=spec.name,
                field=key,
            )


def _retry_policy() -> tuple[Any, int, tuple[type[Exception], ...]]:
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return (NoBackoff(), 1, (RedisConnectionError,))


def _redis_client(conn: RedisConnection) -> Any:
    """A sync client with ``conn``'s timeouts and the retry policy of :class:`RedisBackend`."""
    import redis
    from redis.retry import Retry

    return redis.Redis(**conn.kwargs(), retry=Retry(*_retry_policy()))
