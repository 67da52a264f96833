"""Memory of recent extend request ids, so that a retried extend inserts once.

A client sends ``X-Request-Id`` on every extend and the same id on every
retry of it. The first request with an id runs; a later one with the same id
(within ``ttl`` seconds, and among the last ``size`` ids) gets the first
one's answer and inserts nothing. A retry that arrives while the first is
still running waits for it. A request that fails is forgotten, so its retry
runs again.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any


class RecentRequests:
    """A bounded, expiring map ``request id -> answer`` (one per table).

    Args:
        size: ids remembered at most (the oldest are forgotten first).
        ttl: seconds an id is remembered.

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
    """

    def __init__(self, size: int = 10_000, ttl: float = 300.0) -> None:
        self.size = size
        self.ttl = ttl
        self._entries: OrderedDict[str, tuple[float, asyncio.Future[Any]]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def _expire(self, now: float) -> None:
        while self._entries:
            _, (t, fut) = next(iter(self._entries.items()))
            if now - t <= self.ttl or not fut.done():
                break
            self._entries.popitem(last=False)

    async def run(
        self, request_id: str | None, call: Callable[[], Awaitable[Any]]
    ) -> tuple[Any, bool]:
        """``(answer, replayed)``: ``call()``'s answer, or the remembered one for ``request_id``."""
        if not request_id or self.size == 0:
            return await call(), False
        now = time.monotonic()
        self._expire(now)
        entry = self._entries.get(request_id)
        if entry is not None:
            return await asyncio.shield(entry[1]), True
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._entries[request_id] = (now, fut)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        try:
            answer = await call()
        except BaseException as err:
            if self._entries.get(request_id, (0, None))[1] is fut:
                del self._entries[request_id]
            if isinstance(err, Exception):
                fut.set_exception(err)
                fut.exception()  # retrieved: no "never retrieved" warning when nobody waited
            else:
                fut.cancel()
            raise
        fut.set_result(answer)
        return answer, False
