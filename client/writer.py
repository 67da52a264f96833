"""A writer for collectors: append steps one by one, send them in chunks.

    >>> with client.writer("cartpole", chunk=256) as w:   # doctest: +SKIP
    ...     for step in rollout_steps:                    # TensorDict, batch [] or [k]
    ...         w.append(step)

A chunk is sent (one ``extend``) when ``chunk`` steps are buffered, when the oldest
buffered step is ``max_delay`` seconds old (the time limit, :mod:`.time_limit`, from a
timer thread), and when the writer closes. Leaving a ``with`` block normally sends what
is left; leaving it on an exception discards the buffer (nothing half-written is sent).

**Sending without waiting.** As Reverb's writers can, :class:`Writer` sends a full chunk
while the collector appends the next steps into a second set of columns: over the
same-host shm transport from a sender thread; over HTTP to one server from the append
that fills it, which returns at once, the next send (``flush``, ``close``, ``wait_sent``)
reading its answer (no thread trades the GIL with the collector). One chunk at most is in
flight (two chunks held, sent in order); ``flush()`` and ``close()`` return once every step
is acknowledged; its error is raised by the next call; a posted chunk whose answer was
lost goes again through the client's retries, under its request id (stored once).
``background=True`` always uses the thread, ``False`` (and a sharded HTTP client, whose
chunk's server is chosen as it goes) waits for each answer. Measured on 2 cores with the
server on them (cartpole over HTTP, 256-step chunks, steps/s): posted 147k, waiting 109k;
a thread over HTTP lost to waiting (47k -> 39k, trading the GIL), over shm it won.

**When a send fails**, what it did not send is sent again first by the next send, under
its request ids, but a chunk refused for good; past ``max_pending`` chunks kept, ``append``
sends them first or raises (rules in :mod:`.writer_base`). A failed time limit's send leaves
the unfinished episode buffered as it was.

**The trajectory rule** (on a ``slice`` table a chunk ends at an episode boundary) is
:mod:`.chunking`'s.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from functools import partial
from typing import Any, Protocol

from ..codec.params import bounded
from .chunking import ChunkBuffer, episode_keys
from .columns import Lent
from .errors import ConnectionFailed, TransportError
from .shm import background_thread
from .time_limit import timer_thread, wake
from .writer_base import Outbox, WriterBase, final_chunks, send_mode


# What the writers need of their client, so that this module imports neither
# twin (each twin's ``writer()`` builds its writer here).
class ExtendClient(Protocol):
    """A blocking client a :class:`Writer` sends through (a ``ReplayClient``)."""

    def info(self, table: str) -> dict[str, Any]: ...

    def extend(
        self, table: str, data: Any, *, timeout: float | None = None, request_id: str | None = None
    ) -> Any: ...

    def post_extend(
        self, table: str, data: Any, *, timeout: float | None = None, request_id: str | None = None
    ) -> Callable[[], Any] | None: ...


class Writer(WriterBase):
    """Buffers steps for ``table`` and extends it chunk by chunk (see the module doc).

    Thread safe; chunks are sent in order: a full one from a sender thread (``background=True``)
    or from the appending thread, and for the time limit from a timer thread. An error from a
    chunk sent by either thread is raised by the next ``append``/``flush``/``close``/``wait_sent``.

    Args:
        client: a :class:`~tdreplay.client.ReplayClient`.
        table: the table to extend.
        chunk: steps per chunk.
        max_delay: seconds a step may wait in the buffer (``None``: no time limit).
        episode_key: per-step trajectory id key (overrides the table's).
        end_key: per-step end flag key (overrides the table's).
        timeout: seconds each extend may wait on the rate limiter.
        background: send full chunks from a sender thread (``True``), or from the
            ``append`` that fills them, waiting for the answer (``False``); ``None``:
            a thread over shm, posted over HTTP to one server (the module doc).
        max_pending: most chunks' worth of rows held unacknowledged (:mod:`.writer_base`).

    Raises:
        InvalidRequest: ``timeout`` negative, infinite or NaN (the contract's rule).
        TypeError, ValueError: ``chunk`` or ``max_pending`` not an int >= 1, or ``max_delay``
            not a number >= 0 or ``None`` (:func:`~tdreplay.client.chunking.check_max_delay`).
    """

    def __init__(
        self,
        client: ExtendClient,
        table: str,
        chunk: int = 256,
        *,
        max_delay: float | None = 1.0,
        episode_key: str | None = None,
        end_key: str | None = None,
        timeout: float | None = None,
        background: bool | None = None,
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
        self.client: ExtendClient = client
        self.background = background
        # Three locks, so that no thread waits on another's per-step work: _send_lock orders
        # the changes to the buffer and the sends; _cond guards what the timer reads of the
        # buffer (taken only by an append that changes it: the first of a chunk, or of a trajectory
        # table's first whole episode); _sent guards the counts and errors the senders update.
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._sent = threading.Condition()
        self._timer: threading.Thread | None = None
        self._sender: ThreadPoolExecutor | None = None
        #: waits for the chunk in flight (the sender thread's, or posted): keeps its error
        self._in_flight: Callable[[], object] | None = None
        self._mode = ""  # how full chunks go: "thread", "post" or "inline" (made by _buf)
        self._lent: Lent | None = None  # the columns they view

    def _buf(self) -> ChunkBuffer:
        """The buffer, made by the first append (threads that meet here make one)."""
        info = self.client.info(self.table)
        with self._send_lock:
            if self._closed:  # closed while this asked (close found no buffer to send)
                raise RuntimeError("append() on a closed writer")
            if self._buffer is not None:
                return self._buffer
            ep, end, cap = episode_keys(info, *self._keys)
            buf = self._buffer = ChunkBuffer(self.chunk, episode_key=ep, end_key=end, max_rows=cap)
            self._mode = send_mode(self.client, self.background)
            self.background = self._mode == "thread"
            if self.max_delay is not None:
                self._timer = timer_thread(self, self._cond)
        return buf

    def _raise_pending(self) -> None:
        if self._errors:
            with self._sent:
                err = self._errors.pop(0) if self._errors else None
            if err is not None:
                wake(self._cond)  # the time limit may send again
                raise err

    def _send(self, items: Outbox, read: Callable[[], object] | None = None) -> None:
        """Send ``items`` in order (the first posted already, when ``read`` reads its answer);
        those not acknowledged stay (:meth:`_failed`)."""
        for i, (td, request_id) in enumerate(items):
            try:
                if i or read is None or not _answer_came(read):
                    self.client.extend(self.table, td, timeout=self.timeout, request_id=request_id)
            except BaseException as err:
                self._failed(items[i:], err)
                raise
            with self._sent:
                self.sent_rows += td.batch_size[0]
                self.sent_chunks += 1
                self._sent.notify_all()

    def _send_in_background(self, items: Outbox, read: Callable[[], object] | None = None) -> None:
        """The sender thread's job, or a posted chunk's (:meth:`_post`): its error is kept
        for the next call to raise."""
        try:
            self._send(items, read)
        except BaseException as err:
            with self._sent:
                self._keep(err)
                self._sent.notify_all()

    def _post(self, items: Outbox) -> Callable[[], object] | None:
        """Send one chunk and return before its answer (``_mode == "post"``): the job that
        reads it. Several (kept ones first), or one whose post failed, go as :meth:`_send`
        sends them (a failed post through the plan: its retries, under the same request id)."""
        read = None
        if len(items) == 1:
            td, request_id = items[0]
            with suppress(TransportError):
                read = self.client.post_extend(
                    self.table, td, timeout=self.timeout, request_id=request_id
                )
        if read is None:
            self._send(items)
            return None
        return partial(self._send_in_background, items, read)

    def _wait_in_flight(self) -> None:
        """Wait for the chunk in flight, and take its columns back (``_send_lock`` held)."""
        if self._in_flight is not None:
            in_flight, self._in_flight = self._in_flight, None
            in_flight()  # the sender's job or the answer's reader keeps its error: this waits
        if self._lent is not None:
            assert self._buffer is not None
            with self._cond:
                self._buffer.reclaim(self._lent)
            self._lent = None

    def _send_due(self, buf: ChunkBuffer) -> None:
        """Send the full chunks (``_send_lock`` held), unless an error waits to be raised."""
        if self._mode == "inline":
            if self._errors:
                return
            with self._cond:
                chunks = buf.take(borrow=True)
            self._send(self._outbox(chunks))
            return
        self._wait_in_flight()
        if self._errors:
            return
        with self._cond:
            chunks, self._lent = buf.take_lent()
        items = self._outbox(chunks)
        if not items:
            return
        if self._mode == "post":
            self._in_flight = self._post(items)
            return
        if self._sender is None:
            self._sender = ThreadPoolExecutor(
                1, thread_name_prefix="tdreplay-writer-send", initializer=background_thread
            )
        self._in_flight = self._sender.submit(self._send_in_background, items).result

    def _send_kept(self) -> None:
        """A full writer's send of what is kept (``_send_lock`` held; :mod:`.writer_base`)."""
        self._wait_in_flight()
        self._raise_pending()
        try:
            self._send(self._outbox([]))
        except Exception as err:
            self._tell_full(err)
            raise

    def _send_now(self, buf: ChunkBuffer, *, final: bool = False) -> None:
        """Send what may be sent now, after the chunks in flight, from this thread
        (``_send_lock`` held); unless ``final``, none while an error waits to be raised."""
        self._wait_in_flight()
        if self._errors and not final:
            return
        with self._cond:
            chunks = final_chunks(buf) if final else buf.take(expired=True, borrow=True)
        self._send(self._outbox(chunks))

    def wait_sent(self, rows: int, timeout: float | None = None) -> bool:
        """Block until ``rows`` steps in all have been sent (e.g. by the time limit).

        Returns:
            Whether they were, within ``timeout`` seconds.

        Raises:
            The error of a chunk sent in the background, if one failed meanwhile.
        """
        if self._in_flight is not None and self._mode == "post":
            with self._send_lock:  # a posted chunk's answer is read by a send, or here
                self._wait_in_flight()
        with self._sent:
            done = self._sent.wait_for(
                lambda: self.sent_rows >= rows or bool(self._errors),
                None if timeout is None else bounded(timeout),
            )
        self._raise_pending()
        return bool(done)

    def append(self, step: Any) -> None:
        """Buffer one step (batch ``[]``) or several (``[k]``); sends the chunks that are due.

        Raises:
            KeyError, ValueError, TypeError: the step's keys, shapes or dtypes differ from
                the first step's (see :class:`~tdreplay.client.chunking.ChunkBuffer`).
            The error of the send this append made; what it did not send stays (module doc).
            RuntimeError: the writer is closed.
            The error of an earlier chunk's send (background or time limit), or of the
                send of what is kept by a full writer (``max_pending``); this step is then
                not taken (append it again to keep it).
        """
        if self._closed:
            raise RuntimeError("append() on a closed writer")
        if self._errors:
            self._raise_pending()
        buf = self._buffer or self._buf()
        with self._send_lock:
            if self._closed:  # closed by another thread since the check above: its last
                raise RuntimeError("append() on a closed writer")  # send is past
            if self._full():
                self._send_kept()
            if self._timer is not None and buf.waiting:
                # the timer reads what this append changes (see ChunkBuffer.waiting);
                # any other append changes nothing it reads, and takes no second lock
                with self._cond:
                    due = buf.append(step)
                    if not buf.waiting and self._timer_idle:
                        self._cond.notify_all()  # the timer has a deadline now
            else:
                due = buf.append(step)
            if due:
                self._send_due(buf)

    def flush(self) -> None:
        """Send what is buffered now (trajectory tables: the whole episodes only).

        Returns once every chunk sent so far, in the background too, is
        acknowledged by the server.

        Raises:
            The error of this send, or of an earlier one (background or time limit).
        """
        self._raise_pending()
        if self._buffer is None:
            return
        with self._send_lock:
            self._send_now(self._buffer)
        self._raise_pending()

    def _send_expired(self) -> None:
        """The time limit's send, from its timer thread (see :meth:`WriterBase._send_expired`)."""
        assert self._buffer is not None
        with self._send_lock:
            try:
                self._send_now(self._buffer)
            except BaseException as err:
                with self._sent:
                    self._keep(err)
                    self._sent.notify_all()  # a wait_sent raises it now

    def close(self, *, discard: bool = False) -> None:
        """Send what is left (see the module doc for unfinished episodes) and stop the threads.

        Returns once everything sent is acknowledged by the server. What is left
        is sent even when an earlier chunk's send failed (in the background or by
        the time limit), after the chunks that failed (kept, under their request
        ids); that error is raised afterwards. What this close could not send is
        kept: a further ``close()`` sends it again, ``close(discard=True)`` drops it.
        Should several sends have failed, each further ``close()`` raises the next
        one's error.

        Args:
            discard: drop the buffer and the chunks kept from failed sends instead of
                sending them (a chunk already in flight is waited for, and an error of
                its send dropped too).

        Raises:
            The error of an earlier send (background or time limit), else of the last sends.
        """
        if not self._closed:
            with self._cond:
                self._closed = True
                self._cond.notify_all()
            if self._timer is not None:
                self._timer.join()
        buf = self._buffer
        if buf is None:
            return
        try:
            with self._send_lock:
                if discard:
                    self._wait_in_flight()
                    buf.clear()
                    self._kept = []
                    with self._sent:
                        self._errors.clear()
                    return
                # what is kept and the rest go out even after an earlier chunk failed (a
                # connection lost for a while, a table re-created); its error is raised first
                try:
                    self._send_now(buf, final=True)
                except Exception as err:
                    with self._sent:
                        self._keep(err)
                self._raise_pending()
        finally:
            if self._sender is not None:
                self._sender.shutdown()
                self._sender = None

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.close(discard=exc_type is not None)


def _answer_came(read: Callable[[], object]) -> bool:
    """Read a posted chunk's answer: whether it came (a lost one is sent again through the
    plan, with its retries; the server stores it once, by its request id)."""
    try:
        read()
    except ConnectionFailed:
        return False
    return True
