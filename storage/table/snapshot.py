"""A table at one instant, read while it keeps serving: what a checkpoint and an export consume.

:meth:`Table.snapshot <tdreplay.storage.Table.snapshot>` takes, under the
table's own locks, its state (slots, sampler, writer, limiter, RNG: small
tensors of ``capacity`` entries at most) and ``hi``, and registers
:meth:`Snapshot.before_write`, a copy-on-write hook that every extend calls,
under the data write lock, with the rows it is about to overwrite. The rows
``[0, hi)`` are then copied by :meth:`Snapshot.copy` in chunks of about
:data:`CHUNK_BYTES`, each under a short read lock on the data (samples share
it; an extend waits for at most one chunk), straight into a sink (a
checkpoint's row files, or tensors in memory). The hook saves the old
contents of the rows not copied yet (each row at most once) into a side
buffer, whose rows replace the copied ones at the end: the side buffer is
bounded by the rows overwritten while the copy runs, and by ``hi`` rows at
worst. Sampling, priority updates and evictions change state, never rows, so
they never wait on a snapshot beyond its capture. The hook works through
``Backend.read``, so it serves every backend. Should it fail to save rows (a
Redis error), the extend still goes on and the copy fails; so does closing
the table meanwhile. An insert in flight at the snapshot (slots claimed, rows
not written) is not in it, as it was not live.

:meth:`Table.items <tdreplay.storage.Table.items>` is the export's view: the
live items oldest first, read a chunk at a time, each item whole as it was
(an item overwritten meanwhile is left out).

Nothing outside the table touches its locks: checkpoint and export take what
these give.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from ..backends import Rows, TensorBackend
from ..errors import CheckpointError
from ..spec import NestedKey
from ..tensordicts import row_bytes

if TYPE_CHECKING:
    from .base import TableBase

#: a snapshot's rows are copied in chunks of about this many bytes, each under a short
#: read lock on the table's data
CHUNK_BYTES = 4 << 20


class Sink(Protocol):
    """Where :meth:`Snapshot.copy` puts rows (as ``[rows, row bytes]`` uint8 arrays)."""

    def put(self, key: NestedKey, start: int, rows: np.ndarray) -> None: ...

    def overlay(self, key: NestedKey, index: torch.Tensor, rows: np.ndarray) -> None: ...

    def finish(self) -> None: ...


@dataclass(eq=False)
class Snapshot:
    """A table as it was at :attr:`taken_at`: its state, and rows ``[0, hi)`` to copy.

    Attributes:
        state: ``Table.state_dict()`` at the instant.
        hi: rows ever written then (the rows :meth:`copy` gives).
        size: live items then.
        taken_at: when (``time.time()``).
    """

    table: TableBase
    state: dict[str, Any]
    hi: int
    size: int
    #: the table's locks are held for the snapshot's life (:meth:`Table.snapshot`'s ``hold``)
    held: bool = False
    taken_at: float = field(default_factory=time.time)
    #: rows ``[0, done)`` are copied: the hook leaves them alone
    done: int = 0
    #: the side buffer: (rows, their contents at the snapshot)
    pieces: list[tuple[torch.Tensor, dict[NestedKey, torch.Tensor]]] = field(default_factory=list)
    error: Exception | None = None

    def __post_init__(self) -> None:
        self.saved = torch.zeros(self.hi, dtype=torch.bool)

    def before_write(self, rows: Rows) -> None:
        """The copy-on-write hook: an extend calls it (data write lock held) before it
        overwrites ``rows``."""
        if self.error is not None:
            return
        try:
            if isinstance(rows, slice):
                lo, up = max(rows.start or 0, self.done), min(rows.stop, self.hi)
                if lo >= up:
                    return
                index = torch.arange(lo, up, dtype=torch.int64)
            else:
                index = rows[(rows >= self.done) & (rows < self.hi)]
            index = index[~self.saved[index]]
            if len(index):
                self.pieces.append((index, self.table.backend.read(index)))
                self.saved[index] = True
        except Exception as err:  # the extend goes on; the copy fails
            self.error = err

    def copy(self, sink: Sink) -> None:
        """Copy the snapshot's rows into ``sink``, chunk by chunk, then the saved rows over them.

        The GIL is let go of as seldom as can be (each time, a sampling thread
        may take it, and this thread, niced, wait for the CPU to get it back):
        rows move as byte arrays, and a chunk costs about one ``pwrite`` per
        large field.

        Raises:
            CheckpointError: the table was closed meanwhile, or the rows an insert
                overwrote could not be saved.
        """
        table, backend = self.table, self.table.backend
        step = max(1, CHUNK_BYTES // max(1, table.spec.item_nbytes))
        whole = None
        if isinstance(backend, TensorBackend):  # memory, memmap, shared: no extra copy
            whole = {k: row_bytes(t) for k, t in backend.view_range(0, self.hi).items()}
        for start in range(0, self.hi, step):
            stop = min(self.hi, start + step)
            with contextlib.nullcontext() if self.held else table._data_lock.read():
                self._check()
                if whole is not None:
                    for key, rows in whole.items():
                        sink.put(key, start, rows[start:stop])
                    got = None
                else:
                    got = backend.read_range(start, stop)
                self.done = stop
            if got is not None:
                for key, src in got.items():
                    sink.put(key, start, row_bytes(src))
        for index, saved in self.pieces:
            for key, src in saved.items():
                sink.overlay(key, index, row_bytes(src))
        sink.finish()

    def _check(self) -> None:
        if self.table.closed:
            raise CheckpointError(
                f"table {self.table.name!r} was closed while its snapshot was read",
                table=self.table.name,
            )
        if self.error is not None:
            raise CheckpointError(
                f"table {self.table.name!r}: the rows an insert overwrote during the checkpoint "
                f"could not be saved: {self.error}",
                table=self.table.name,
            ) from self.error


@dataclass(eq=False)
class Items:
    """A table's live items at one instant, oldest first: their slots and ordinals.
    :meth:`chunks` reads them (:meth:`Table.items <tdreplay.storage.Table.items>`)."""

    table: TableBase
    index: torch.Tensor
    ordinal: torch.Tensor

    def __len__(self) -> int:
        return len(self.index)

    def chunks(self, rows: int) -> Iterator[tuple[dict[NestedKey, torch.Tensor], int]]:
        """``(items, slots read)``, ``rows`` slots at a time (see :func:`intact_items`)."""
        return intact_items(self.table, self.index, self.ordinal, rows)


def intact_items(
    table: TableBase, index: torch.Tensor, ordinal: torch.Tensor, rows: int
) -> Iterator[tuple[dict[NestedKey, torch.Tensor], int]]:
    """``(items, slots read)`` for the slots of ``index``, ``rows`` at a time.

    Each chunk is read under the data read lock. A slot whose item is still
    live with the same ordinal after the read was not written during it:
    an insert marks the slots it claims dead before it writes them and gives
    them a new ordinal after. Other rows are left out. (The check is made after
    the read lock is released: sampling takes that lock while holding the
    table's, so taking them the other way round could deadlock.)
    """
    for start in range(0, len(index), rows):
        idx, want = index[start : start + rows], ordinal[start : start + rows]
        with table._data_lock.read():
            data = table.backend.read(idx)
        with table._cond:
            intact = table.slots.live[idx] & (table.slots.ordinal[idx] == want)
        if not bool(intact.all()):
            keep = intact.nonzero().squeeze(1)
            data = {k: v.index_select(0, keep) for k, v in data.items()}
        yield data, len(idx)
