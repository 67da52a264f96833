"""Which servers of a sharded client answer: failover and rejoin, written once for both twins.

A server that cannot be reached is marked *down*: samples are drawn from the
others (its share of a batch goes to them, in proportion to their sizes),
extends go to the others, and a warning is logged once. A down server is
tried again every ``shard_refresh`` seconds, whatever the client does: a
sampling client asks each server for its table's size that often (it does
anyway, to split samples), and a writing client sends one extend in that
many seconds to it in its turn (:meth:`ShardHealth.usable`; if it still
does not answer, the extend goes on to the next server). A down server that
answers is *up* again, an info line says so, and it takes its share again
with the data it kept (durable tables). :meth:`ShardHealth.status` reports
each server's state and how often it went down.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("tdreplay.client")


@dataclass
class _Shard:
    url: str
    up: bool = True
    since: float = 0.0
    failovers: int = 0
    last_error: str | None = None
    tried: float = 0.0  # when a call last went to it while down


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

    def is_up(self, shard: int) -> bool:
        return self._shards[shard].up

    def usable(self, shard: int) -> bool:
        """Whether a call may go to ``shard`` now: it is up, or it is down and due for a
        try (one caller at a time gets ``True``, once every ``retry_every`` seconds)."""
        s = self._shards[shard]
        if s.up:
            return True
        now = time.monotonic()
        with self._lock:
            if now - max(s.since, s.tried) < self.retry_every:
                return False
            s.tried = now
            return True

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
