"""Which servers of a sharded client answer: failover and rejoin, written once for both twins.

A server that cannot be reached is marked *down*: samples are drawn from the
others (its share of a batch goes to them, in proportion to their sizes),
extends go to the others, and a warning is logged once. A down server is
tried again every ``shard_refresh`` seconds, whatever the client does, in the
background (:meth:`ShardHealth.due`, :meth:`ShardHealth.probed`): a health call
no caller waits on, so a server that hangs (takes connections, never answers)
costs the first call that meets it its timeout, and no call after. A down
server that answers is *up* again, an info line says so, and it takes its
share again with the data it kept (durable tables). When no server is up, a
call tries them in turn and waits on each. :meth:`ShardHealth.status` reports
each server's state and how often it went down.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from . import forking
from .errors import TransportError

log = logging.getLogger("tdreplay.client")


@dataclass
class _Shard:
    url: str
    up: bool = True
    since: float = 0.0
    failovers: int = 0
    last_error: str | None = None
    tried: float = 0.0  # when it was last tried while down
    probing: bool = False  # a try is out


class ShardHealth:
    """The up/down state of each server (thread safe).

    Args:
        urls: the servers, by shard number.
        retry_every: seconds between tries of a server that is down.
    """

    def __init__(self, urls: list[str], retry_every: float = 1.0) -> None:
        self._shards = [_Shard(u, since=time.monotonic()) for u in urls]
        self._lock = threading.Lock()
        self.retry_every = retry_every
        forking.forget_in_child(self)

    def after_fork(self) -> None:
        """In a forked child: no try is out (the parent's threads making them are not
        there; one marked out would never end, its server never tried again)."""
        self._lock = threading.Lock()
        for s in self._shards:
            s.probing = False

    def is_up(self, shard: int) -> bool:
        return self._shards[shard].up

    def due(self, shard: int) -> bool:
        """Whether ``shard`` is down and due for a try: none out, and ``retry_every`` seconds
        since it went down or was last tried (one caller at a time gets ``True``; it must
        report the try's outcome to :meth:`probed`)."""
        s = self._shards[shard]
        if s.up or s.probing:
            return False
        now = time.monotonic()
        with self._lock:
            if s.up or s.probing or now - max(s.since, s.tried) < self.retry_every:
                return False
            s.tried, s.probing = now, True
            return True

    def probed(self, shard: int, outcome: Any) -> None:
        """The try :meth:`due` allowed ended: answered (up again), or ``outcome`` is the
        error of a server that still does not answer (a server's error is an answer)."""
        from_server = not isinstance(outcome, TransportError)
        if from_server:
            self.answered(shard)
        else:
            self.down(shard, outcome)
        self._shards[shard].probing = False

    def up(self) -> list[int]:
        """The shards thought up, in order."""
        return [i for i, s in enumerate(self._shards) if s.up]

    def down(self, shard: int, err: BaseException) -> None:
        """``shard`` failed to answer: its share goes to the others until it answers again."""
        s = self._shards[shard]
        with self._lock:
            s.last_error = str(err)
            if not s.up:
                return
            s.up, s.since = False, time.monotonic()
            s.failovers += 1
        log.warning(
            "tdreplay server %d (%s) is unreachable (%s): samples and extends go to the other "
            "servers until it answers again",
            shard,
            s.url,
            err,
        )

    def answered(self, shard: int) -> None:
        """``shard`` answered: up (again)."""
        s = self._shards[shard]
        if s.up:
            return
        with self._lock:
            if s.up:
                return
            s.up = True
            down_for = time.monotonic() - s.since
            s.since = time.monotonic()
        log.info("tdreplay server %d (%s) answers again after %.1fs down", shard, s.url, down_for)

    def status(self) -> list[dict[str, Any]]:
        """Per server: ``url``, ``up``, ``seconds`` in that state, ``failovers`` (times it
        went down) and ``last_error``."""
        now = time.monotonic()
        with self._lock:
            return [
                {
                    "url": s.url,
                    "up": s.up,
                    "seconds": now - s.since,
                    "failovers": s.failovers,
                    "last_error": s.last_error,
                }
                for s in self._shards
            ]
