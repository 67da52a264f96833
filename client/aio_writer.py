"""The asyncio twin of :class:`~tdreplay.client.writer.Writer` (same chunking, same trajectory rule).

>>> async with client.writer("cartpole", chunk=256) as w:   # doctest: +SKIP
...     for step in rollout_steps:
...         await w.append(step)

A failed send leaves what it did not send kept for the next one (but a chunk refused for
good), and a full writer's ``append`` sends what is kept first or raises, as the blocking
writer's does (:mod:`.writer_base`); a send cancelled (its task, or the timer task when the loop
that ran it ends) keeps its chunks as well, sent again under the same request ids.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from .chunking import ChunkBuffer, episode_keys
from .deprecation import warn_close_deprecated
from .time_limit import timer_task
from .writer_base import Outbox, WriterBase, final_chunks


class AsyncExtendClient(Protocol):
    """An asyncio client an :class:`AsyncWriter` sends through (an ``AsyncReplayClient``)."""

    async def info(self, table: str) -> dict[str, Any]: ...

    async def extend(
        self, table: str, data: Any, *, timeout: float | None = None, request_id: str | None = None
    ) -> Any: ...


class AsyncWriter(WriterBase):
    """The :class:`Writer` of :class:`~tdreplay.client.AsyncReplayClient`: ``await w.append(step)``.

    Same chunking and trajectory rule, same ``max_pending``; the time limit
    (:mod:`.time_limit`) runs as an asyncio task. Use ``async with client.writer(...) as w``.
    """

    def __init__(
        self,
        client: AsyncExtendClient,
        table: str,
        chunk: int = 256,
        *,
        max_delay: float | None = 1.0,
        episode_key: str | None = None,
        end_key: str | None = None,
        timeout: float | None = None,
        max_pending: int = 8,
    ) -> None:
        super().__init__(
            client,
            table,
            chunk,
            max_delay=max_delay,
            episode_key=episode_key,
            end_key=end_key,
            timeout=timeout,
            max_pending=max_pending,
        )
        self.client: AsyncExtendClient = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._progress = asyncio.Event()
        self._timer: asyncio.Task[None] | None = None

    def _bind(self) -> None:
        """Use the running loop: a writer may go on under a later loop (a second
        ``asyncio.run``) once the one it was used from has stopped; its lock, events and
        time limit are made anew there (the first loop's timer task was cancelled when
        that loop ended, and ``aclose`` raised its ``CancelledError``, the buffer unsent).

        Raises:
            RuntimeError: the loop it was used from is running still (another thread's).
        """
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        if self._loop is not None and self._loop.is_running():
            raise RuntimeError(
                "this writer is in use by another running event loop; use one writer per loop"
            )
        self._loop = loop
        self._lock, self._wake, self._progress = asyncio.Lock(), asyncio.Event(), asyncio.Event()
        if self._timer is not None:
            self._timer.cancel()  # done already where its loop ended
            self._timer = None
            self._start_timer()

    def _start_timer(self) -> None:
        if self.max_delay is not None and not self._closed:
            self._timer = timer_task(self, self._wake)

    async def _buf(self) -> ChunkBuffer:
        if self._buffer is None:
            info = await self.client.info(self.table)
            if self._closed:  # closed while this asked (aclose found no buffer to send)
                raise RuntimeError("append() on a closed writer")
            if self._buffer is not None:  # another append made it meanwhile: keep that one
                return self._buffer
            ep, end, cap = episode_keys(info, *self._keys)
            self._buffer = ChunkBuffer(self.chunk, episode_key=ep, end_key=end, max_rows=cap)
            self._start_timer()
        return self._buffer

    def _raise_pending(self) -> None:
        if self._errors:
            self._wake.set()  # the time limit may send again once the error is raised
            super()._raise_pending()

    async def _send(self, items: Outbox) -> None:
        """Send ``items`` in order; those not acknowledged stay (:meth:`_failed`)."""
        for i, (td, request_id) in enumerate(items):
            try:
                await self.client.extend(
                    self.table, td, timeout=self.timeout, request_id=request_id
                )
            except BaseException as err:
                if isinstance(err, asyncio.CancelledError) and self._buffer is not None:
                    # over shared memory the extend's worker thread goes on copying the
                    # chunk's rows out of the buffer: later steps must not be written over them
                    self._buffer.disown()
                self._failed(items[i:], err)
                raise
            self.sent_rows += td.batch_size[0]
            self.sent_chunks += 1
            self._progress.set()

    async def wait_sent(self, rows: int, timeout: float | None = None) -> bool:
        """Wait until ``rows`` steps in all have been sent; whether they were within ``timeout``.

        Raises:
            The error of a chunk the time limit sent, if one failed meanwhile.
        """
        self._bind()
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.sent_rows < rows:
            self._raise_pending()
            self._progress.clear()
            left = None if deadline is None else deadline - loop.time()
            if left is not None and left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), left)
        return True

    async def append(self, step: Any) -> None:
        """Buffer one step (batch ``[]``) or several (``[k]``); sends the chunks that are due.

        Raises:
            As :meth:`Writer.append`: an error of the time limit's send, or of the send of
                what is kept by a full writer (``max_pending``), leaves the step not taken.
        """
        if self._closed:
            raise RuntimeError("append() on a closed writer")
        self._bind()
        self._raise_pending()
        buf = await self._buf()
        async with self._lock:
            if self._closed:  # closed while this waited for the lock: its last send is past
                raise RuntimeError("append() on a closed writer")
            if self._full():  # what is kept goes first, or the step is not taken
                self._raise_pending()  # the time limit's, while this waited for the lock
                try:
                    await self._send(self._outbox([]))
                except Exception as err:
                    self._tell_full(err)
                    raise
            waiting = buf.waiting
            due = buf.append(step)
            if waiting and not buf.waiting:
                self._wake.set()  # the timer has a deadline now
            if due and not self._errors:  # none sent while an error waits to be raised
                await self._send(self._outbox(buf.take(borrow=True)))

    async def flush(self) -> None:
        """Send what is buffered now (trajectory tables: the whole episodes only)."""
        self._bind()
        self._raise_pending()
        if self._buffer is not None:
            async with self._lock:
                self._raise_pending()  # the time limit's, while this waited for the lock
                await self._send(self._outbox(self._buffer.take(expired=True, borrow=True)))

    async def _send_expired(self) -> None:
        """The time limit's send, from its timer task (see :meth:`WriterBase._send_expired`)."""
        assert self._buffer is not None
        try:
            async with self._lock:
                await self._send(self._outbox(self._buffer.take(expired=True, borrow=True)))
        except Exception as err:  # what was not acknowledged is kept for the next send
            self._keep(err)
            self._progress.set()  # a wait_sent raises it now

    async def aclose(self, *, discard: bool = False) -> None:
        """Send what is left and stop the timer (see :meth:`Writer.close`: what is kept from
        failed sends goes first; what this could not send is kept for a further ``aclose()``).

        Args:
            discard: drop the buffer and what is kept instead of sending them.
        """
        self._bind()
        if not self._closed:
            self._closed = True
            self._wake.set()
            if self._timer is not None:
                await self._timer  # it sees _closed and returns; a send in progress completes
        buf = self._buffer
        if buf is None:
            return
        if discard:
            buf.clear()
            self._kept, self._errors = [], []
            return
        async with self._lock:
            try:
                await self._send(self._outbox(final_chunks(buf)))
            except Exception as err:
                self._keep(err)  # raised after an earlier send's error
        self._raise_pending()

    async def __aenter__(self) -> AsyncWriter:
        return self

    async def close(self, *, discard: bool = False) -> None:
        """Deprecated alias of :meth:`aclose`, removed in the next release."""
        warn_close_deprecated(self)
        await self.aclose(discard=discard)

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        await self.aclose(discard=exc_type is not None)
