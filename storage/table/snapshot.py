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
``Backend.read``, so it serves every backend. With ``live_only`` a snapshot gives the
slots live at the instant only, in slot order (a drained queue gives none): a dead
row is neither read nor saved. Should it fail to save rows (a
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
from ..slots import oldest_first
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
        changes: the table's change count then (see ``TableBase.changes``).
    """

    table: TableBase
    state: dict[str, Any]
    hi: int
    size: int
    #: the table's locks are held for the snapshot's life (:meth:`Table.snapshot`'s ``hold``)
    held: bool = False
    changes: int = 0
    taken_at: float = field(default_factory=time.time)
    #: rows ``[0, done)`` are copied: the hook leaves them alone
    done: int = 0
    #: the side buffer: (rows, their contents at the snapshot)
    pieces: list[tuple[torch.Tensor, dict[NestedKey, torch.Tensor]]] = field(default_factory=list)
    error: Exception | None = None
    #: give only the slots live at the instant, in slot order (:attr:`rows` of them)
    live_only: bool = False

    def __post_init__(self) -> None:
        self.saved = torch.zeros(self.hi, dtype=torch.bool)
        #: the slots :meth:`copy` gives (``None``: all of ``[0, hi)``), and where each slot's
        #: row goes in what it gives (the kept slots before it)
        self.keep: torch.Tensor | None = None
        self.pos = torch.arange(self.hi, dtype=torch.int64)
        if self.live_only:
            self.keep = self.state["slots"]["live"][: self.hi].to(torch.bool)
            self.pos = torch.cumsum(self.keep, 0) - self.keep.to(torch.int64)

    @property
    def rows(self) -> int:
        """The rows :meth:`copy` gives: the slots live then (``live_only``), else ``hi``."""
        return self.hi if self.keep is None else int(self.keep.sum())

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
            if self.keep is not None:  # a dead row is not given: nothing of it to save
                index = index[self.keep[index]]
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
            at, kept = int(self.pos[start]), self._kept(start, stop)
            with contextlib.nullcontext() if self.held else table._data_lock.read():
                self._check()
                got = None
                if kept is not None and not kept.any():
                    pass  # no row of the chunk is given: none is read
                elif whole is not None:
                    for key, rows in whole.items():
                        sink.put(key, at, _pick(rows[start:stop], kept))
                else:
                    got = backend.read_range(start, stop)
                self.done = stop
            if got is not None:
                for key, src in got.items():
                    sink.put(key, at, _pick(row_bytes(src), kept))
        for index, saved in self.pieces:
            for key, src in saved.items():
                sink.overlay(key, self.pos[index], row_bytes(src))
        sink.finish()

    def _kept(self, start: int, stop: int) -> np.ndarray | None:
        """Which slots of ``[start, stop)`` are given (``None``: all)."""
        if self.keep is None:
            return None
        kept = self.keep[start:stop].numpy()
        return None if kept.all() else kept

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


def _pick(rows: np.ndarray, kept: np.ndarray | None) -> np.ndarray:
    """``rows`` (``[n, row bytes]``) where ``kept`` (all of them: ``None``, no copy)."""
    return rows if kept is None else rows[kept]


@dataclass(eq=False)
class Items:
    """A table's live items at one instant, oldest first; :meth:`chunks` reads them
    (:meth:`Table.items <tdreplay.storage.Table.items>`).

    An item is in it if it was live at that instant: it is live now with an ordinal
    at most ``newest`` (every item inserted since has a higher one, and a slot
    overwritten since holds such an item), in a slot no insert was writing then (an
    insert takes its ordinals before it writes: a live export counted 90 items and
    wrote 100). A table whose writer fills slots in ring
    order (round robin: ``ring``, the oldest item's slot) keeps its items in slot order
    from there, so they are read in that order and nothing per item is held; its
    ordinals are checked to rise along the ring first (a restored state need not
    agree), else, as for every other writer, the live slots are sorted by ordinal
    (``order``: 8 bytes an item).

    Attributes:
        table: the table.
        count: the live items at that instant.
        newest: the table's ``inserted`` then (the newest item's ordinal).
        hi: the table's ``hi`` then (no live slot at or past it).
        ring: the oldest item's slot, for a ring; ``None`` otherwise.
        order: the slots oldest first, when not read along the ring.
    """

    table: TableBase
    count: int
    newest: int
    hi: int
    ring: int | None = None
    order: torch.Tensor | None = None
    #: the slots an insert was writing then (its ordinals were taken, at most ``newest``,
    #: but its items were not live): ``None`` when there were none
    busy: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.count

    def chunks(self, rows: int) -> Iterator[tuple[dict[NestedKey, torch.Tensor], int]]:
        """``(items, slots read)``, about ``rows`` slots at a time: each chunk read under the
        data read lock, and an item overwritten or removed meanwhile left out (the slots
        read add up to :attr:`count`, for a progress bar)."""
        if self.ring is not None and not self._rises_along_ring(rows):
            self.ring, self.order = None, self.sorted()
        done = 0
        for idx in self._slots(rows):
            data = self._read(idx)
            read = min(len(idx), self.count - done)
            done += read
            yield data, read
        if done < self.count:  # removed since: the bar still ends full
            yield self.table.backend.empty(0), self.count - done

    def _of_instant(self, slots: torch.Tensor | slice) -> torch.Tensor:
        """Which of ``slots`` hold an item of the instant: live, with an ordinal at most
        :attr:`newest` (the table's lock held)."""
        s = self.table.slots
        ok = s.live[slots] & (s.ordinal[slots] <= self.newest)
        return ok if self.busy is None else ok & ~self.busy[slots]

    def _slots(self, rows: int) -> Iterator[torch.Tensor]:
        """The slots to read, oldest first, ``rows`` at a time (the last chunk fewer)."""
        if self.order is not None:
            for start in range(0, len(self.order), rows):
                yield self.order[start : start + rows]
            return
        pending: list[torch.Tensor] = []
        count = 0
        for idx, _ in self._held(rows):
            pending.append(idx)
            count += len(idx)
            if count >= rows:
                ready = torch.cat(pending)
                for start in range(0, len(ready) - rows + 1, rows):
                    yield ready[start : start + rows]
                rest = ready[len(ready) // rows * rows :]
                pending, count = [rest], len(rest)
        if count:
            yield torch.cat(pending)

    def _held(self, rows: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Along the ring, ``rows`` slots at a time: those still holding an item of the
        instant, and their ordinals (read together, under one hold of the table's lock)."""
        ring = self.ring or 0
        for lo, hi in ((ring, self.hi), (0, min(ring, self.hi))):
            for a in range(lo, hi, rows):
                window = slice(a, min(a + rows, hi))
                with self.table._cond:
                    held = self._of_instant(window).nonzero().squeeze(1)
                    ordinal = self.table.slots.ordinal[window][held]
                if len(held):
                    yield held + a, ordinal

    def _rises_along_ring(self, rows: int) -> bool:
        """Whether the items of the instant have rising ordinals along the ring."""
        last = 0
        for _, ordinal in self._held(rows):
            if int(ordinal[0]) <= last or bool((ordinal[1:] <= ordinal[:-1]).any()):
                return False
            last = int(ordinal[-1])
        return True

    def sorted(self) -> torch.Tensor:
        """The slots of the items of the instant still live, sorted by ordinal."""
        with self.table._cond:
            # none of the instant at or past hi (nor read there: see Slots.written)
            return oldest_first(self._of_instant(slice(0, self.hi)), self.table.slots.ordinal)

    def _read(self, idx: torch.Tensor) -> dict[NestedKey, torch.Tensor]:
        """The rows of slots ``idx`` whose items are of the instant, read now.

        The rows are read under the data read lock. A slot still live with an ordinal
        at most :attr:`newest` after the read was not written during it: an insert marks
        the slots it claims dead before it writes them and gives them a new, higher
        ordinal after. Other rows are left out. (The check is made after the read lock
        is released: sampling takes that lock while holding the table's, so taking them
        the other way round could deadlock.)
        """
        with self.table._data_lock.read():
            data = self.table.backend.read(idx)
        with self.table._cond:
            intact = self._of_instant(idx)
        if not bool(intact.all()):
            keep = intact.nonzero().squeeze(1)
            data = {k: v.index_select(0, keep) for k, v in data.items()}
        return data
