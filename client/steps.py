"""The steps a plan yields (:mod:`.plans`): what each client twin performs, its own way.

A plan is a generator of steps: :class:`Call` (one command to one server),
:class:`Gather` (several at once), :class:`Probe` (one not waited on), :class:`Pause`
and :class:`Work` (blocking
work on the caller's side: files, decoding); it receives each step's result
and returns the call's. The twins' drivers (:mod:`.driving`) perform them: the
blocking twin's with blocking I/O and ``time.sleep``, the asyncio twin's awaited (and
:class:`Work` in a worker thread).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

from . import commands as C
from .errors import ReplayError
from .retry import NO_RETRY, RetryPolicy

T = TypeVar("T")


@dataclass
class Call:
    """Run ``command`` on server number ``shard`` (``once``: a try of a server thought
    down, which is not retried: if it does not answer, the plan goes on elsewhere)."""

    shard: int
    command: C.Command[Any]
    once: bool = False

    def retry(self, policy: RetryPolicy) -> RetryPolicy:
        """The retry policy this call runs under: ``policy``, or none for a try (``once``)."""
        return NO_RETRY if self.once else policy


@dataclass
class Gather:
    """Run several calls concurrently; the plan receives their results in order.

    With ``partial``, a call whose server could not be reached (a
    :class:`~tdreplay.client.errors.TransportError`) gives that error as its
    result instead of failing the gather.
    """

    calls: list[Call]
    partial: bool = False


@dataclass
class Pause:
    """Wait ``seconds`` (the driver's way: ``time.sleep`` or ``asyncio.sleep``)."""

    seconds: float


@dataclass
class Probe:
    """Start ``call`` and go on at once (the plan receives ``None``): ``done`` gets its
    answer, or the :class:`~tdreplay.client.errors.ReplayError` it failed with, when that
    comes. The blocking twin runs it on a thread of its own, the asyncio twin as a task."""

    call: Call
    done: Callable[[Any], None]


def probing(probe: Probe) -> Generator[Call, Any, None]:
    """The plan that runs a :class:`Probe`'s call and hands its outcome to ``done``
    (a twin runs it without waiting on it)."""
    try:
        outcome = yield probe.call
    except ReplayError as err:
        outcome = err
    probe.done(outcome)


class Work:
    """Run ``fn(*args)`` on the caller's side: blocking work a plan needs between its calls
    (reading a Parquet file, writing a dataset). The blocking twin runs it in place, the
    asyncio twin in a worker thread; its result, or its exception, goes back to the plan."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn = fn
        self.args = args

    def run(self) -> Any:
        return self.fn(*self.args)


Step = Call | Gather | Pause | Probe | Work
Plan = Generator[Step, Any, T]
