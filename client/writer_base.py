"""What both writers (:class:`~.writer.Writer`, :class:`~.aio_writer.AsyncWriter`) share:
the target and chunking settings, the buffer, the counts, the errors of sends made
elsewhere (each raised once, in order), and the chunks a close sends."""

from __future__ import annotations

import warnings
from typing import Any

from tensordict import TensorDictBase

from ..codec.params import seconds
from .chunking import ChunkBuffer, check_chunk, check_max_delay


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
    ) -> None:
        self.client = client
        self.table = table
        self.chunk = check_chunk(chunk)
        self.max_delay = check_max_delay(max_delay)
        self.timeout = seconds(timeout)  # the contract's rule, before any chunk is sent
        self._keys = (episode_key, end_key)
        self._buffer: ChunkBuffer | None = None
        #: errors of sends made by another thread (or the timer), each raised once, in order
        self._errors: list[BaseException] = []
        self._closed = False
        self.sent_rows = 0
        self.sent_chunks = 0

    def _keep(self, err: BaseException) -> None:
        """Keep the error of a send made elsewhere for the next call to raise (after those
        kept before it: every failed chunk is told, none dropped)."""
        self._errors.append(err)

    def _raise_pending(self) -> None:
        if self._errors:
            raise self._errors.pop(0)


def final_chunks(buf: ChunkBuffer) -> list[TensorDictBase]:
    if buf.end_key is not None and buf.unfinished():
        n = buf.unfinished()
        chunks = buf.take(expired=True, borrow=True)
        _warn_dropped(n, ".".join(buf.end_key))
        buf.clear()
        return chunks
    return buf.take(final=True, borrow=True)
