"""A redis table's keys: laid out at create, checked against the Redis's limits, deleted; and
what a Redis call that failed is raised as.

A table's keys are tensordict's ``TensorDictStore`` keys, written in its format, so that
``TensorDictStore.from_store`` and its reads work on them: per field a meta hash
(``<prefix>:{<td_id>}:m:<field>``: the full shape, the dtype), an entry in the keys
registry (``...:__keys__``) and a data string (``...:d:<field>``: the rows, one after the
other). ``from_schema(storage="redis")`` sizes each data string to the capacity at
create (``SETRANGE`` of its last byte: Redis zero-fills the rest), so Redis holds
capacity x item bytes before a row; :func:`lay_out` writes the meta hashes and the
registry only, and the strings grow as rows are written past their end (Redis pads a gap
with zeros), unless the operator asks for the whole capacity now (``preallocate``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import torch
from tensordict.store._utils import _LUA_GETRANGES, _LUA_SETRANGES, _dtype_to_str

from ..errors import BackendError, InsufficientStorage
from ..redis_conn import RedisConnection
from ..spec import TableSpec

Layout = Mapping[str, tuple[list[int], torch.dtype]]
"""Fields by flat key: the shape of one row, the dtype stored."""


def lay_out(store: Any, fields: Layout, *, whole: bool) -> None:
    """Register ``fields`` in the fresh ``TensorDictStore`` ``store`` as ``from_schema``
    does (meta hashes with the full shape and dtype, keys registry; its metadata cache
    filled), writing no row: with ``whole``, each data string is sized to the capacity
    (zero-filled by Redis), as ``from_schema`` does; else it is made by the first write.

    Raises:
        redis.RedisError: Redis refused (past ``maxmemory``, ...) or did not answer; what
            it applied before stays (the caller deletes the store's keys).
    """
    rows = list(store.batch_size)
    layout = {
        store._full_key_path(key): ([*rows, *shape], dtype)
        for key, (shape, dtype) in fields.items()
    }

    async def write() -> None:
        pipe = store._client.pipeline()
        for path, (shape, dtype) in layout.items():
            nbytes = math.prod(shape) * dtype.itemsize
            if whole and nbytes:
                pipe.setrange(store._data_key(path), nbytes - 1, b"\x00")
            meta = {"shape": json.dumps(shape), "dtype": _dtype_to_str(dtype)}
            pipe.hset(store._meta_key(path), mapping=meta)
            pipe.sadd(store._keys_registry_key, path)
        await pipe.execute()

    store._run_sync(write())
    if store._meta_cache is not None:
        store._meta_cache.update(layout)
    store._keys_cache[0] = None  # read back from the registry when next needed


def run_start(rows: slice | torch.Tensor) -> int | None:
    """The first of ``rows`` when they are a run (consecutive, ascending), else ``None``."""
    if isinstance(rows, slice):
        return int(rows.start or 0)
    first, n = int(rows[0]), len(rows)
    if int(rows[-1]) - first == n - 1 and (n == 1 or bool((rows.diff() == 1).all())):
        return first
    return None


def put_rows(
    client: Any,
    strings: list[tuple[str, int]],
    rows: slice | torch.Tensor,
    data: list[memoryview],
    counter: str,
) -> int:
    """Write ``rows`` of each data string of ``strings`` (``(key, row bytes)``; ``data``:
    each field's bytes of those rows, in the same order) and count the write in ``counter``
    (``INCR``), in one transaction: one ``SETRANGE`` a string for a run of rows, else
    tensordict's ``SETRANGES`` script. Redis applies all of it or none: a Redis that keeps
    the rows keeps the count with them (a snapshot holds both or neither).

    Returns:
        the count after this write (the table's write generation).

    Raises:
        redis.RedisError: Redis refused (``maxmemory``: ``INCR`` refused, nothing applied)
            or did not answer.
    """
    first = run_start(rows)
    pipe = client.pipeline(transaction=True)
    for (key, size), raw in zip(strings, data, strict=True):
        if first is not None:
            pipe.setrange(key, first * size, raw)
        else:
            assert isinstance(rows, torch.Tensor)
            argv = [
                v
                for i, row in enumerate(rows.tolist())
                for v in (row * size, raw[i * size : (i + 1) * size])
            ]
            pipe.eval(_LUA_SETRANGES, 1, key, *argv)
    pipe.incr(counter)
    return int(pipe.execute()[-1])


def get_rows(
    client: Any, strings: list[tuple[str, int]], index: torch.Tensor, proof: list[str]
) -> tuple[list[bytes], list[bytes | None]]:
    """Rows ``index`` of each data string of ``strings`` (``(key, row bytes)``), their bytes
    one after the other: one ``GETRANGE`` a string for a run of rows, else tensordict's
    ``GETRANGES`` script (reads only), in one pipeline; and the values of the keys ``proof``
    (``MGET``) read after them on the same connection, so that they describe the Redis the
    rows came from (a restarted one drops the connection).

    Not in a transaction, as tensordict's reads are: Redis refuses every command of a
    ``MULTI`` while it is past ``maxmemory``, reads too, and a table whose rows filled its
    Redis would serve nothing.

    Raises:
        redis.RedisError: Redis failed or did not answer.
    """
    n = len(index)
    first = run_start(index)
    pipe = client.pipeline(transaction=False)
    for key, size in strings:
        if first is not None:
            pipe.getrange(key, first * size, (first + n) * size - 1)
        else:
            argv = [v for start in index.tolist() for v in (start * size, size)]
            pipe.eval(_LUA_GETRANGES, 1, key, *argv)
    pipe.mget(*proof)
    *got, values = pipe.execute()
    return got, list(values)


def delete_keys(client: Any, namespace: str, td_id: str) -> None:
    """Delete every key of the ``TensorDictStore`` ``td_id`` under ``namespace``."""
    keys = list(client.scan_iter(match=f"{namespace}:{{{td_id}}}:*", count=1000))
    if keys:
        client.delete(*keys)


def failure(
    table: str, conn: RedisConnection, doing: str, err: Exception
) -> BackendError | InsufficientStorage:
    """The error of a Redis call of ``table`` that failed (``err``) while ``doing`` something:
    :class:`InsufficientStorage` (507) when Redis is out of memory, else :class:`BackendError`."""
    import redis

    where = f"Redis {conn.name!r} ({conn.describe()})"
    if isinstance(err, redis.OutOfMemoryError):
        return InsufficientStorage(
            f"table {table!r}: {where} is out of memory (used memory over its maxmemory, "
            f"with the noeviction policy) and refused {doing} (it refuses every write then, "
            "one overwriting rows it holds too); nothing of this call was "
            "stored, and the table keeps serving what it holds. Raise that Redis's "
            "maxmemory, free memory there (delete tables or keys), or lower the table's "
            "capacity or move it to a Redis with room (with --preallocate, or the spec's "
            "backend.preallocate, a redis table reserves its whole capacity at create)",
            table=table,
        )
    if isinstance(err, redis.TimeoutError):
        return BackendError(
            f"table {table!r}: {where} did not answer within {conn.timeout:g}s "
            f"(--redis-timeout) while {doing}; it is hung, overloaded or unreachable",
            table=table,
        )
    return BackendError(f"table {table!r}: {where} failed while {doing}: {err}", table=table)


def check_string_sizes(spec: TableSpec, fields: Layout, conn: RedisConnection) -> None:
    """Refuse a table with a field longer than the Redis's longest string before writing
    anything: each field is one string of capacity x row bytes once full, and a Redis
    refuses one past ``proto-max-bulk-len`` (512 MiB by default) - for good, whatever a
    retry does.

    Raises:
        InsufficientStorage: a field is longer than that (507, naming it and the limit).
        BackendError: the Redis failed or did not answer in time (the one wait for it).
    """
    import redis

    client = redis_client(conn)
    try:
        limit = int(client.config_get("proto-max-bulk-len").get("proto-max-bulk-len", 0))
    except (redis.ResponseError, ValueError):  # CONFIG not allowed (a managed Redis): let it try
        return
    except redis.RedisError as err:  # down or silent: fail now, not after a second wait
        raise failure(spec.name, conn, "reading its longest string", err) from err
    finally:
        client.close()
    for key, (shape, dtype) in fields.items():
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


def retry_policy() -> tuple[Any, int, tuple[type[Exception], ...]]:
    """``Retry(*retry_policy())``: a dropped connection retried once, at once; nothing else."""
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return (NoBackoff(), 1, (RedisConnectionError,))


def redis_client(conn: RedisConnection) -> Any:
    """A sync client with ``conn``'s timeouts and :func:`retry_policy`."""
    import redis
    from redis.retry import Retry

    return redis.Redis(**conn.kwargs(), retry=Retry(*retry_policy()))
