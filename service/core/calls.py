"""How one served table's calls run: on the event loop when they cannot wait, else in a worker
thread, and a redis table's a few at a time.

Every table call of the service goes through a table's :class:`Calls` (its
:class:`~tdreplay.service.core.handle.TableHandle`'s ``call``), which is what lets a small
call run on the loop: while no worker thread uses the table, nothing can hold its locks.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Callable
from typing import TypeVar

from starlette.concurrency import run_in_threadpool

from tdreplay.storage import BackendError, Table

#: calls of one redis table running in worker threads at most (see :meth:`Calls.run`)
REDIS_CALLS = 4
T = TypeVar("T")


class Calls:
    """The calls of one table in flight: how many run in worker threads, and for a redis
    table the gate that keeps a hung Redis from taking every worker thread."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self._threads = 0
        # A hung Redis holds each call for its timeout: a few at a time, so that one
        # table cannot take every worker thread from the others.
        self._connection = table.backend.connection  # the Redis its rows live in, if any
        self._gate = None if self._connection is None else asyncio.Semaphore(REDIS_CALLS)

    @property
    def idle(self) -> bool:
        """Whether no worker thread is running a call of the table (nothing holds its locks)."""
        return self._threads == 0

    async def run(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """Run a table call without blocking the event loop.

        In the threadpool, except when ``inline`` (a small, memory-speed call)
        and no worker thread is using the table: then nothing can hold the
        table's locks (every table call of the service goes through here), so
        the call cannot wait, and it runs on the loop, saving the thread hop
        that costs more than the call itself.
        """
        if inline and self._threads == 0:
            return fn()
        if self._gate is not None:
            return await self._gated(fn)
        self._threads += 1
        try:
            return await _in_thread(fn)
        finally:
            self._threads -= 1

    async def _gated(self, fn: Callable[[], T]) -> T:
        """A redis table's call: at most :data:`REDIS_CALLS` in threads at once; a call
        that waits longer than the Redis timeout for its turn fails (the ones ahead are
        stuck on a Redis that does not answer)."""
        conn = self._connection
        assert self._gate is not None and conn is not None
        try:
            await asyncio.wait_for(self._gate.acquire(), conn.timeout)
        except TimeoutError:
            raise BackendError(
                f"table {self.table.name!r}: {REDIS_CALLS} calls have been waiting on Redis "
                f"{conn.name!r} ({conn.describe()}) for over {conn.timeout:g}s "
                "(--redis-timeout); it is hung, overloaded or unreachable",
                table=self.table.name,
            ) from None
        self._threads += 1
        try:
            return await _in_thread(fn)
        finally:
            self._threads -= 1
            self._gate.release()


async def _in_thread(fn: Callable[[], T]) -> T:
    """``fn()`` in a worker thread; a failure's finished frames are cleared of their locals.

    The worker's future holds the error, whose traceback holds the frame awaiting that
    future: a reference cycle, and through the traceback the table's own frames with
    ``self`` and views of its rows. Until the garbage collector ran, a table replaced or
    deleted after a failed call kept its memory (a ``shared`` table's ``/dev/shm``
    segments: a ``clear`` after a 507 gave nothing back). The traceback still names every
    frame and line.
    """
    try:
        return await run_in_threadpool(fn)
    except BaseException as err:
        traceback.clear_frames(err.__traceback__)
        raise
