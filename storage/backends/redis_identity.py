"""Whether a Redis still holds what a redis table acknowledged: its marker and write count.

At allocation a marker key, ``<prefix>:{<td_id>}:__tdreplay__``, is written with the
table's name and a random epoch. A Redis that restarts without persistence, or is
flushed, loses it with the rows; and there ``TensorDictStore`` would read missing keys as
nothing and a write would recreate them zero-filled, so the table would serve zeros.

A Redis that restarts from an older snapshot (an RDB saved before the last writes, an
append-only file that missed them) or a replica promoted behind its primary keeps the
marker but not the rows written since: its strings end before them, or hold older rows
where the table wrapped (or was preallocated), which lengths cannot tell. So every write
also counts itself in ``...:__tdreplay_writes__`` (``INCR``, in the transaction that
writes its rows, :func:`~.redis_keys.put_rows`: a snapshot holds both or neither), and the
table keeps the count Redis answered for its last acknowledged write
(:attr:`RedisIdentity.writes`): a Redis whose count is lower lost acknowledged writes.

Marker and count are read together (one ``MGET``) before every write, with every read's
rows (in the same pipeline: rows and proof come from one Redis) and by a probe (at most
once a second, :data:`MARKER_INTERVAL`): nothing is sent for them alone on the hot path.
Once either is wrong the table is ``"lost"`` for good, and every write and read raises
:class:`TableLost`, naming what is missing.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from ..errors import BackendError, TableLost, TDReplayError
from ..redis_conn import RedisConnection
from .base import BackendState
from .redis_keys import failure

#: the suffix of a redis table's marker key (``<prefix>:{<td_id>}:__tdreplay__``)
REDIS_MARKER = "__tdreplay__"
#: the suffix of a redis table's write count
REDIS_WRITES = "__tdreplay_writes__"
#: seconds between two checks before reads by :meth:`RedisIdentity.probe` (writes check
#: every time, reads with their rows)
MARKER_INTERVAL = 1.0

T = TypeVar("T")
log = logging.getLogger("tdreplay.storage")


def ask(table: str, conn: RedisConnection, doing: str, fn: Callable[[], T]) -> T:
    """``fn()``, Redis failures raised as :func:`~.redis_keys.failure` names them."""
    import redis

    try:
        return fn()
    except redis.RedisError as err:
        raise failure(table, conn, doing, err) from err


class RedisIdentity:
    """The marker and the write count of table ``table`` (see the module docstring).

    Args:
        table: the table's name.
        conn: its Redis connection; ``client`` a client on it.
        key: the ``TensorDictStore``'s key of a suffix (``store._redis_key``).
    """

    def __init__(
        self, table: str, conn: RedisConnection, client: Any, key: Callable[[str], str]
    ) -> None:
        self.table = table
        self.connection = conn
        self.client = client
        self.marker_key = key(REDIS_MARKER)
        self.writes_key = key(REDIS_WRITES)
        #: what a read sends for its proof (``MGET`` of both)
        self.keys = [self.marker_key, self.writes_key]
        #: the write count Redis answered for the last write acknowledged (writes are serial)
        self.writes = 0
        self._marker = b""
        self._lost: TableLost | None = None
        self._unreachable = False  # the last check failed
        self._checked = 0.0
        self._probing = threading.Lock()

    def mark(self) -> None:
        """Write the marker key: this table's name and a fresh epoch."""
        body = {"table": self.table, "epoch": uuid.uuid4().hex, "created_at": time.time()}
        self._marker = json.dumps(body).encode()
        ask(
            self.table,
            self.connection,
            "writing the table's marker",
            lambda: self.client.set(self.marker_key, self._marker),
        )
        self._checked = time.monotonic()

    @property
    def state(self) -> BackendState:
        """``"ok"``; ``"unreachable"`` while the last check failed (Redis down, hung or
        refusing: back to ``"ok"`` once a check succeeds); ``"lost"`` once the marker was
        found missing or the count behind (never back to ``"ok"``)."""
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
        acknowledged = self.writes  # before asking: a write may be counted meanwhile
        try:
            marker, writes = ask(
                self.table,
                self.connection,
                "checking the table's marker",
                lambda: self.client.mget(self.keys),
            )
        except BackendError:
            self._unreachable = True
            raise
        self.verify(marker, writes, acknowledged)

    def verify(self, marker: bytes | None, writes: bytes | None, acknowledged: int) -> None:
        """Whether Redis, answering ``marker`` and ``writes`` (the values of :attr:`keys`,
        ``None`` where missing), holds the ``acknowledged`` writes (:attr:`writes` read
        before asking it: a check that runs beside a write may get its answer before the
        write is applied and compare it after the write is counted).

        Raises:
            TableLost: it does not (the table is ``"lost"`` from now on), or did not before.
        """
        if self._lost is not None:
            raise self._lost
        self._unreachable = False
        if marker != self._marker:
            self._lose(
                f"the marker key {self.marker_key!r} written when the table was created is "
                "missing, so that Redis restarted without persistence, or was flushed, or "
                "evicted the keys"
            )
        held = int(writes or 0)
        if held < acknowledged:
            self._lose(self._behind(held, acknowledged))
        self._checked = time.monotonic()

    def counted(self, writes: int) -> None:
        """A write was applied, Redis's count after it ``writes``: it is acknowledged.

        Raises:
            TableLost: the count went back since the check before the write (Redis
                restarted from an older snapshot meanwhile).
        """
        if writes <= self.writes:
            self._lose(self._behind(writes - 1, self.writes))
        self.writes = writes

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

    def _behind(self, held: int, acknowledged: int) -> str:
        """Why a Redis that counts ``held`` of the table's ``acknowledged`` writes lost some."""
        return (
            f"it counts {held} of the table's writes ({self.writes_key!r}) where "
            f"{acknowledged} were acknowledged, so the rows of the last "
            f"{acknowledged - held} are missing, or older rows stand in their place: that "
            "Redis restarted from an older snapshot (an RDB saved before those writes, an "
            "append-only file that did not have them yet), or a replica behind its primary "
            "took over"
        )

    def _lose(self, why: str) -> NoReturn:
        """The table is ``"lost"`` from now on, for ``why``: log it and raise :class:`TableLost`."""
        self._lost = TableLost(
            f"table {self.table!r}: its data in Redis {self.connection.name!r} "
            f"({self.connection.describe()}) is not what the table acknowledged: {why}. The "
            "table serves nothing rather than zeros or older rows: restore it from a "
            "checkpoint, or delete it and create it again (Redis persistence, appendonly yes "
            "with appendfsync always, keeps every acknowledged row across Redis restarts)",
            table=self.table,
        )
        log.error("%s", self._lost.message)
        raise self._lost
