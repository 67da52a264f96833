"""The writers' time limit (``max_delay``): one rule, two timers that differ only in how they wait.

What a writer buffers is sent once its oldest step has waited ``max_delay`` seconds
(:meth:`~.chunking.ChunkBuffer.due`; on a trajectory table, once a whole episode is
buffered), short chunks included, but not while the error of an earlier send waits to be
raised: nothing is sent until it is. :func:`due_in` is that rule, which both writers'
timers ask. What the time limit sends, and what becomes of its errors, is the writer's
``_send_expired`` (:meth:`~.writer_base.WriterBase._send_expired`).

A timer sleeps until its deadline, or until its writer wakes it: when the buffer gets a
deadline (the first step of a chunk, or of a trajectory table's first whole episode:
:attr:`~.chunking.ChunkBuffer.waiting` turns false), when a kept error is raised, and when
the writer closes. The blocking :class:`~.writer.Writer`'s timer is a thread waiting on a
condition (:func:`timer_thread`); the :class:`~.aio_writer.AsyncWriter`'s is a task
waiting on an event (:func:`timer_task`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref

from ..codec.params import bounded
from .writer_base import WriterBase


def due_in(writer: WriterBase) -> float | None:
    """Seconds until the time limit sends what ``writer`` buffers (<= 0: now), or ``None``:
    nothing to wait for until the writer wakes its timer (no limit, nothing buffered, no
    whole episode yet, or an error of an earlier send waits to be raised)."""
    if writer._errors or writer._buffer is None:
        return None
    return writer._buffer.due(writer.max_delay)


def timer_thread(writer: WriterBase, cond: threading.Condition) -> threading.Thread:
    """The blocking writer's timer, started: a daemon thread that waits on ``cond`` (the
    condition that guards what :func:`due_in` reads: the writer wakes it with
    :func:`wake`) and calls ``writer._send_expired()`` when the limit passes. It ends once
    the writer is closed (``_closed`` set under ``cond``, then woken). It holds the writer
    weakly while it waits, so that a writer dropped unclosed is collected, and its
    finalizer ends the thread."""
    thread = threading.Thread(
        target=_wait_and_send, args=(weakref.ref(writer), cond), daemon=True, name="tdreplay-writer"
    )
    weakref.finalize(writer, wake, cond)
    thread.start()
    return thread


def wake(cond: threading.Condition) -> None:
    """Wake the blocking writer's timer (what it reads has changed)."""
    with cond:
        cond.notify_all()


def _wait_and_send(ref: weakref.ReferenceType[WriterBase], cond: threading.Condition) -> None:
    while True:
        writer = ref()
        if writer is None:
            return
        with cond:
            if writer._closed:
                return
            left = due_in(writer)
            if left is None or left > 0:
                # a writer wakes a timer without a deadline when the buffer gets one; this
                # one wakes by itself at its deadline, never later than a newer one
                writer._timer_idle = left is None
                del writer  # wait without keeping the writer alive
                cond.wait(None if left is None else bounded(left))
                continue
        writer._send_expired()
        del writer


def timer_task(writer: WriterBase, woken: asyncio.Event) -> asyncio.Task[None]:
    """The asyncio writer's timer, started on the running loop: a task that waits on
    ``woken`` (the writer sets it) and awaits ``writer._send_expired()`` when the limit
    passes; it ends once the writer is closed (``_closed`` set, then ``woken``). A writer
    used from a later loop starts another there, with a new event."""
    return asyncio.get_running_loop().create_task(_await_and_send(writer, woken))


async def _await_and_send(writer: WriterBase, woken: asyncio.Event) -> None:
    while not writer._closed:
        left = due_in(writer)
        if left is None or left > 0:
            woken.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), left)
            continue
        await writer._send_expired()
