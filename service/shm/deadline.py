"""When a same-host connection ends for taking too long: one deadline, one timer.

A connection ends when no hello comes (``--shm-hello-timeout``), a frame stays
incomplete (``--body-timeout``), nothing comes (``--shm-idle-timeout``) or an
answer is not taken (``--send-timeout``), too long; while a request is served,
it has no deadline. Every request moves the deadline, twice: a timer each time
would cost more than a small sample. :class:`Deadline` keeps one loop timer,
moved only when it fires before the deadline or must fire sooner; arming or
disarming otherwise stores a number and what it was armed for, which it hands
to ``expire`` (the connection tells its client which limit ended it).

    >>> import asyncio
    >>> async def main():
    ...     ended = []
    ...     deadline = Deadline(asyncio.get_running_loop(), ended.append)
    ...     deadline.arm(0.01, "frame"); deadline.disarm()  # a request came: no deadline
    ...     await asyncio.sleep(0.03)
    ...     deadline.arm(0.01, "idle")  # answered: the next one must come in time
    ...     await asyncio.sleep(0.03)
    ...     return ended
    >>> asyncio.run(main())
    ['idle']
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Generic, TypeVar, cast

#: what a deadline is armed for (the limit it stands for)
Why = TypeVar("Why")


class Deadline(Generic[Why]):
    """Calls ``expire(why)`` once the loop's time passes the deadline last armed (``why``: what
    it was armed for), unless disarmed.

    Args:
        loop: the event loop (its clock and its timer).
        expire: what the deadline ends (the connection), told which limit passed.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[Why], object]) -> None:
        self._loop = loop
        self._expire = expire
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf  # loop time; infinite while disarmed
        self._why: Why | None = None

    def arm(self, seconds: float, why: Why) -> None:
        """The deadline is ``seconds`` from now (brought forward or pushed back), for ``why``."""
        self._at = at = self._loop.time() + seconds
        self._why = why
        if self._timer is None or self._timer.when() > at:  # none, or one too late
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(at, self._fire)

    def disarm(self) -> None:
        """No deadline (a request is being served; its answer arms one again)."""
        self._at = math.inf

    def cancel(self) -> None:
        """Stop the timer for good (the connection ended)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        if self._at == math.inf:
            return
        if self._loop.time() >= self._at:
            self._expire(cast("Why", self._why))  # armed: set by arm
        else:
            self._timer = self._loop.call_at(self._at, self._fire)
