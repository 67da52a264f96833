"""Waiting for the rate limiter without holding a thread.

A table calls its listeners (under its lock) whenever an insert or a sample
may have become possible. :class:`Changes` turns that into an
``asyncio.Event`` on the server's loop, and :func:`admitted` tries a table
call again (``Table.try_extend`` / ``try_sample``, which never block) each
time the event fires, until it goes through or the caller's timeout runs
out. Many waiters cost no threads; they are woken in the order they began to
wait, so no client starves.

The wait is counted by the table's rate limiter, once per call, like the
table's own blocking wait (``Table.begin_wait`` / ``end_wait``): its
counters say how many calls were held back, not how many tries were made.

A caller that leaves while its call waits (its connection closed) ends the
wait without another try: a sample nobody will read must not take a queue's
items, count as sampled or spend ``max_times_sampled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from tdreplay.storage import RateLimitTimeout, Table, TDReplayError

from ..limits import Hold

T = TypeVar("T")
#: what a wait is reported to (metrics): table, operation, seconds waited, timed out
WaitHook = Callable[[str, str, float, bool], None]


class Changes:
    """An event on ``loop`` fired (from any thread) when a table's state changes.

    Firing costs nothing while nobody waits: a table changes on every insert
    and sample, so the loop is woken only when a waiter is registered.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        #: calls waiting on this event now
        self.waiters = 0

    @property
    def event(self) -> asyncio.Event:
        """The event the next change fires; take it *before* checking the table."""
        return self._event

    def notify_threadsafe(self) -> None:
        """The table listener: schedule :meth:`fire` on the loop if anyone waits."""
        if self.waiters:
            # a closed loop (the server shutting down) has no one left to wake
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.fire)

    def fire(self) -> None:
        """Wake every current waiter (on the loop)."""
        event, self._event = self._event, asyncio.Event()
        event.set()


async def admitted(
    attempt: Callable[[], Awaitable[T | None]],
    *,
    table: Table,
    op: str,
    n: int,
    timeout: float,
    changes: Changes,
    gone: Callable[[], TDReplayError | None],
    on_wait: WaitHook | None = None,
    left: Callable[[], Awaitable[object]] | None = None,
    hold: Hold | None = None,
) -> T:
    """``attempt()``'s result once the rate limiter lets it through.

    Args:
        attempt: runs the table's ``try_*`` call (off the loop, or inline when
            that is safe); ``None`` means held back.
        table: the table, which counts the wait and words the timeout.
        op: ``"insert"`` or ``"sample"``.
        n: items, for the error message.
        timeout: seconds to keep trying.
        changes: the table's change events.
        gone: why the table is no longer served (deleted, cleared, replaced), or
            ``None``; the wait ends with that error.
        on_wait: told of the wait once it ends.
        left: returns once the caller is gone (e.g. its connection closed); watched
            only while the call waits, so a call that goes through at once costs nothing.
        hold: the rows the call keeps in memory (its request body), entered while it waits:
            they count with the bodies being received (``--max-receiving-bytes``).

    Raises:
        BackendError, PayloadTooLarge: held back, and its rows would pass
            ``--max-receiving-bytes`` (see :class:`~..limits.Hold`): it does not wait.
        RateLimitTimeout: still held back after ``timeout`` seconds (HTTP 429), or the
            caller left while it was held back (nobody reads that answer).
        TableNotFound: the table was deleted while the call waited.
        TableClosed: it was cleared or replaced (by a restore) while the call waited.
    """
    result = await attempt()
    if result is not None:
        return result
    with hold if hold is not None else contextlib.nullcontext():
        return await _held_back(attempt, table, op, n, timeout, changes, gone, on_wait, left)


async def _held_back(
    attempt: Callable[[], Awaitable[T | None]],
    table: Table,
    op: str,
    n: int,
    timeout: float,
    changes: Changes,
    gone: Callable[[], TDReplayError | None],
    on_wait: WaitHook | None,
    left: Callable[[], Awaitable[object]] | None,
) -> T:
    """:func:`admitted`'s wait, once its first try was held back."""
    began = table.begin_wait(op)  # type: ignore[arg-type]
    deadline = time.monotonic() + timeout
    changes.waiters += 1
    timed_out = False
    watch: asyncio.Future[object] | None = None
    try:
        if timeout <= 0:
            timed_out = True
            raise table.held_back(op, n, timeout)  # type: ignore[arg-type]
        if left is not None:
            watch = asyncio.ensure_future(left())
            watch.add_done_callback(functools.partial(_caller_left, changes))
        while True:
            # Registered (above), and the event taken before trying: a change during the try fires it.
            event = changes.event
            err = gone()
            if err is not None:
                raise err
            if watch is not None and watch.done():
                timed_out = True
                raise RateLimitTimeout(
                    f"table {table.name!r}: the caller of a {op} of {n} items left while the "
                    "rate limiter held it back",
                    table=table.name,
                )
            result = await attempt()
            if result is not None:
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                raise table.held_back(op, n, timeout)  # type: ignore[arg-type]
            with anyio.move_on_after(remaining):
                await event.wait()
    finally:
        if watch is not None:
            watch.cancel()
        changes.waiters -= 1
        seconds = table.end_wait(op, began, timed_out=timed_out)  # type: ignore[arg-type]
        if on_wait is not None:
            on_wait(table.name, op, seconds, timed_out)


def _caller_left(changes: Changes, watch: asyncio.Future[object]) -> None:
    """Wake the waits once a caller's ``left()`` returned (or failed: the caller is gone
    either way); not when the wait ended first and cancelled it."""
    if not watch.cancelled():
        watch.exception()  # retrieved: a failed watch is a caller gone, not an error to log
        changes.fire()
