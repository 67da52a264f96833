"""What both writers (:class:`~.writer.Writer`, :class:`~.aio_writer.AsyncWriter`) share:
the target and chunking settings, the buffer, the counts, the errors of sends made
elsewhere (each raised once, in order), the chunks a close sends, and what a failed send
leaves.

**When a send fails.** Rows leave a writer only once the server has acknowledged them,
as a production queue's records do (and Reverb's items, until confirmed): the chunk whose
``extend`` failed, and the chunks after it that the same send had not sent yet, stay in
the writer, in order, ahead of the steps appended since. The next send (a chunk due at
``append``, the time limit (:mod:`.time_limit`), ``flush``, ``close``) sends them first, each under the
request id (``X-Request-Id``) it was first sent with, so that a chunk that reached the
server before its answer was lost is not stored twice (within the server's memory of
ids, ``idempotency_ttl``). The error carries a note with the rows acknowledged so far and
the rows kept. On a sharded client a chunk whose send may have reached its server is not
sent again (the next send could go to another server, which would store it twice): it
leaves the writer, and the note says so and how many rows it held. An error of a send made
elsewhere (the sender thread, the time limit) is raised by the next call; until then
nothing more is sent. ``close`` sends what is kept, then raises; what it could not send is
kept still: ``close()`` again sends it, ``close(discard=True)`` drops it. A writer dropped
with steps it never sent warns (``RuntimeWarning``, naming the table and the steps).

**A chunk refused for good** (:func:`~.errors.refused_for_good`: a 400, 413, 415 or 422 —
data the table's schema does not take, a value outside a field's categories, a body over the
server's limit) would be refused by every later send, and the collector's writer with it: it
leaves the writer when its send fails, and the note says how many rows were dropped and why
(:attr:`WriterBase.dropped_rows` counts them). A chunk that failed otherwise is kept: a lost
connection, a timeout, a 503, a 429, a 404 or 409 (the table re-created), and a 507 too —
a full disk or an over-limit server is the server's state, not the chunk's, and the operator
may free room; the cap below bounds what waiting costs.

**The cap on what is kept** (``max_pending``, in chunks, 8 by default): once a failed send
has left rows kept and the writer holds ``max_pending * chunk`` rows not acknowledged (kept
and buffered), ``append`` first sends what is kept, from the calling thread (as a production
queue's producer blocks when its buffer is full, Kafka's ``max.block.ms``, and Reverb's
writer waits on its ``max_in_flight_items``; here the client's retry policy bounds the
wait). Should that send fail, its error is raised, with a note that the writer is full, and
the step is not taken: memory stays bounded while the server is down, the collector learns
of it at once, and once the server answers again the next ``append`` delivers what was kept
(under its request ids: once) and goes on.
"""

from __future__ import annotations

import uuid
import warnings
from typing import Any

from tensordict import TensorDictBase

from ..codec.params import seconds
from .chunking import ChunkBuffer, check_chunk, check_max_delay
from .errors import ReplayError, ServerError, TransportError, may_have_arrived, refused_for_good

#: chunks to send, in order, each with its request id
Outbox = list[tuple[TensorDictBase, str]]


def _warn_dropped(n: int, key: str) -> None:
    warnings.warn(
        f"writer closed with {n} step(s) of an unfinished episode (no {key!r} flag set); "
        "they are dropped, since sending them would join them to the next insert's episode",
        RuntimeWarning,
        stacklevel=3,
    )


class WriterBase:
    """What both writers hold: the target, the chunking settings, the buffer and the counts."""

    def __init__(
        self,
        client: Any,
        table: str,
        chunk: int = 256,
        *,
        max_delay: float | None = 1.0,
        episode_key: str | None = None,
        end_key: str | None = None,
        timeout: float | None = None,
        max_pending: int = 8,
    ) -> None:
        self.client = client
        self.table = table
        self.chunk = check_chunk(chunk)
        self.max_pending = check_chunk(max_pending, "max_pending", "chunks kept at most")
        self.max_delay = check_max_delay(max_delay)
        self.timeout = seconds(timeout)  # the contract's rule, before any chunk is sent
        self._keys = (episode_key, end_key)
        self._buffer: ChunkBuffer | None = None
        #: errors of sends made by another thread (or the timer), each raised once, in order
        self._errors: list[BaseException] = []
        #: chunks sent and not acknowledged (copies), sent again first by the next send
        self._kept: Outbox = []
        self._closed = False
        #: whether the blocking writer's timer waits with no deadline (under its condition):
        #: only then does a new deadline wake it; one that waits for an earlier deadline reads
        #: the new one then (a deadline only moves later), instead of being woken per chunk
        self._timer_idle = True
        self.sent_rows = 0
        self.sent_chunks = 0
        #: rows of chunks the server refused for good, dropped (see the module doc)
        self.dropped_rows = 0

    @property
    def kept_rows(self) -> int:
        """Rows of failed sends kept for the next send (see the module doc)."""
        return sum(td.batch_size[0] for td, _ in self._kept)

    def _keep(self, err: BaseException) -> None:
        """Keep the error of a send made elsewhere for the next call to raise (after those
        kept before it: every failed chunk is told, none dropped)."""
        self._errors.append(err)

    def _raise_pending(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def _outbox(self, chunks: list[TensorDictBase]) -> Outbox:
        """What a send sends: the chunks kept from a failed send first, then ``chunks``,
        each with its request id (a kept chunk's is the one it was sent with)."""
        out = self._kept + [(td, uuid.uuid4().hex) for td in chunks]
        self._kept = []
        return out

    def _failed(self, rest: Outbox, err: BaseException) -> None:
        """Keep the chunks of a send not acknowledged (``rest``, the failed one first) as
        copies (they may view the buffer, which later steps write over), but the failed one
        if it was refused for good or, sharded, may be stored; tell it in ``err``."""
        rows = rest[0][0].batch_size[0]
        refused = refused_for_good(err)
        gone = not refused and len(getattr(self.client, "urls", ())) > 1 and _maybe_stored(err)
        self._kept = [(td.clone(), rid) for td, rid in (rest[1:] if refused or gone else rest)]
        told = ""
        if refused:
            self.dropped_rows += rows
            told = (
                f"the server refused a chunk of {rows} row(s) for good (HTTP "
                f"{getattr(err, 'status', '?')}: sent again it would be refused again); it has "
                f"left the writer, {self.dropped_rows} row(s) dropped so far; "
            )
        elif gone:
            told = (
                f"a chunk of {rows} row(s) may have been stored by its server (no answer came "
                "back); on a sharded client it is not sent again (another server would store "
                "it twice) and has left the writer; "
            )
        err.add_note(
            f"writer of table {self.table!r}: {self.sent_rows} row(s) acknowledged so far; "
            f"{told}{self.kept_rows} row(s) not acknowledged are kept and sent again first, "
            "under the same request ids, by the next send (flush() or close() too)"
        )

    def _send_expired(self) -> Any:
        """The time limit's send (its timer calls it, :mod:`.time_limit`): what the limit
        releases (``take(expired=True)``; an unfinished episode stays buffered), its error
        kept for the next call to raise (:meth:`_keep`), what was not acknowledged kept for
        the next send. The blocking writer's returns ``None``, the asyncio one's an awaitable."""
        raise NotImplementedError

    def _full(self) -> bool:
        """Whether an append must first send what is kept: a failed send left rows kept,
        and the writer holds ``max_pending`` chunks' worth not acknowledged (module doc)."""
        return bool(self._kept) and self._lost() >= self.max_pending * self.chunk

    def _tell_full(self, err: BaseException) -> None:
        err.add_note(
            f"writer of table {self.table!r} is full: it holds {self._lost()} row(s) not "
            f"acknowledged (max_pending={self.max_pending} chunks of {self.chunk}); this "
            "append did not take its step: append it again (it sends what is kept first), "
            "or close(discard=True)"
        )

    def _lost(self) -> int:
        """Steps a writer dropped now would lose: buffered or kept, never acknowledged."""
        buf = getattr(self, "_buffer", None)
        return (buf.n if buf is not None else 0) + sum(
            td.batch_size[0] for td, _ in getattr(self, "_kept", ())
        )

    def __del__(self) -> None:
        lost = self._lost()
        if lost:
            warnings.warn(
                f"writer of table {self.table!r} dropped with {lost} step(s) never sent "
                "(it was not closed, or its close failed): they are lost; close it, or use "
                "it as a context manager",
                RuntimeWarning,
                stacklevel=2,
            )


def _maybe_stored(err: BaseException) -> bool:
    """Whether the failed try of a send may have stored its rows: not a server's refusal
    (an insert is atomic), nor a connection that failed before the request was out."""
    if isinstance(err, ServerError):
        return False
    return not isinstance(err, TransportError) or may_have_arrived(err)


def final_chunks(buf: ChunkBuffer) -> list[TensorDictBase]:
    if buf.end_key is not None and buf.unfinished():
        n = buf.unfinished()
        chunks = buf.take(expired=True, borrow=True)
        _warn_dropped(n, ".".join(buf.end_key))
        buf.clear()
        return chunks
    return buf.take(final=True, borrow=True)


def send_mode(client: Any, background: bool | None) -> str:
    """How a blocking writer of ``client`` sends its full chunks (:mod:`.writer`): ``"thread"``
    (a sender thread), ``"post"`` (from the appending thread, the answer read by the next
    send) or ``"inline"`` (from the appending thread, waiting for the answer)."""
    if background is not None:
        return "thread" if background else "inline"
    try:
        same_host = getattr(client, "transport", "http") == "shm"
    except ReplayError:  # shm asked for and unavailable: the sends will say so
        same_host = False
    if same_host:
        return "thread"
    return "post" if len(getattr(client, "urls", ())) == 1 else "inline"
