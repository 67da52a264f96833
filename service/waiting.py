"""Waiting for the rate limiter without holding a thread.

A table calls its listeners (under its lock) whenever an insert or a sample
may have become possible. :class:`Changes` turns that into an
``asyncio.Event`` on the server's loop, and :func:`rate_limited` retries a
table call (made with ``timeout=0``, so it never blocks its thread) each time
the event fires, until the call goes through or the caller's timeout runs
out. Many waiters cost no threads; they are woken in the order they began to
wait, so no client starves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

import anyio

from tdreplay.storage import RateLimitTimeout, TableNotFound

T = TypeVar("T")
Op = Literal["insert", "sample"]


class Changes:
    """An event on ``loop`` fired (from any thread) when a table's state changes.

    Firing costs nothing while nobody waits: a table changes on every insert
    and sample, so the loop is woken only when a waiter is registered.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._event = asyncio.Event()
        self.waiting: dict[Op, int] = {"insert": 0, "sample": 0}

    @property
    def event(self) -> asyncio.Event:
        """The event the next change fires; take it *before* checking the table."""
        return self._event

    def notify_threadsafe(self) -> None:
        """The table listener: schedule :meth:`fire` on the loop if anyone waits."""
        if self.waiting["insert"] or self.waiting["sample"]:
            # a closed loop (the server shutting down) has no one left to wake
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.fire)

    def fire(self) -> None:
        """Wake every current waiter (on the loop)."""
        event, self._event = self._event, asyncio.Event()
        event.set()


async def rate_limited(
    call: Callable[[], T],
    *,
    run: Callable[[Callable[[], T]], Awaitable[T]],
    changes: Changes,
    name: str,
    op: Op,
    timeout: float,
    describe: Callable[[], str],
    is_open: Callable[[], bool],
    on_wait: Callable[[float, bool], None] | None = None,
) -> T:
    """Run ``call`` (a table call with ``timeout=0``) until the limiter lets it through.

    Args:
        call: raises :class:`RateLimitTimeout` when the table would have to wait.
        run: runs ``call`` without blocking the loop (in the threadpool, or inline
            when that is safe); see ``TableHandle.call``.
        changes: the table's change events.
        name: the table, for errors.
        op: what waits, for the waiting counts.
        timeout: seconds to keep trying.
        describe: the message of the final :class:`RateLimitTimeout`.
        is_open: whether the table is still served; a deleted table ends the wait.
        on_wait: called once a wait ends, with its seconds and whether it timed out.

    Raises:
        RateLimitTimeout: still held back after ``timeout`` seconds (HTTP 429).
        TableNotFound: the table was deleted while the call waited.
    """
    try:
        return await run(call)
    except RateLimitTimeout:
        if timeout <= 0:
            if on_wait is not None:
                on_wait(0.0, True)
            raise RateLimitTimeout(describe(), table=name) from None
    start = time.monotonic()
    deadline = start + timeout
    changes.waiting[op] += 1
    timed_out = False
    try:
        while True:
            # Register (above) and take the event before trying: a change during the try fires it.
            event = changes.event
            if not is_open():
                raise TableNotFound(f"table {name!r} was deleted while a call waited", table=name)
            try:
                return await run(call)
            except RateLimitTimeout:
                pass
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                raise RateLimitTimeout(describe(), table=name) from None
            with anyio.move_on_after(remaining):
                await event.wait()
    finally:
        changes.waiting[op] -= 1
        if on_wait is not None:
            on_wait(time.monotonic() - start, timed_out)
