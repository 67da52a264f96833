"""Disk for a file backend's rows (and a memmap table's per-slot state files), and shared
memory for a ``shared`` table's, reserved in extents ahead of the write position.

A memory-mapped write into a hole of a sparse file on a full disk ends the
process with SIGBUS. A file backend's row files are sparse (``from_schema``
sizes them, writes nothing), and so are a shared table's segments in ``/dev/shm``
(a tmpfs: measured, a write into a page it has no room for is a SIGBUS too), so
before rows land the blocks under them are reserved with ``posix_fallocate``: a
full disk (or ``/dev/shm``) is then an :class:`~tdreplay.storage.InsufficientStorage`
(507) before any row is written, and the table keeps serving what it holds.

Rows are reserved from the first one up, an *extent* at a time: when an
insert would reach past the reserved rows, the reservation grows to cover
it and then some - the larger of :data:`MIN_EXTENT_BYTES` and an eighth of
what is reserved already (a geometric growth: few reservations for a big
table, little waste for a small one; measured in ``bench/footprint_bench.py``).
Disk then follows the data: an empty table holds next to nothing, a table
that wrapped around holds its capacity and reuses it. With ``preallocate``
the whole capacity is reserved at once (the operator's choice: ENOSPC at
create rather than later).

    >>> extent_rows(reserved=0, row_bytes=45, capacity=10**7) * 45 >= MIN_EXTENT_BYTES
    True
    >>> extent_rows(reserved=16_000_000, row_bytes=45, capacity=10**8)  # an eighth
    2000000
    >>> extent_rows(reserved=9_900_000, row_bytes=45, capacity=10**7)  # what is left
    100000
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .diskspace import FALLOCATE_UNSUPPORTED, free_bytes, on_full_disk
from .errors import InsufficientStorage

log = logging.getLogger("tdreplay.storage")

#: the smallest extent, in bytes of rows (all fields together)
MIN_EXTENT_BYTES = 64 << 20


def extent_rows(reserved: int, row_bytes: int, capacity: int) -> int:
    """Rows the next extent adds to ``reserved`` (at least one; at most what is left)."""
    rows = max(-(-MIN_EXTENT_BYTES // max(1, row_bytes)), reserved // 8, 1)
    return min(rows, capacity - reserved)


@dataclass(frozen=True)
class Span:
    """Where one field's rows live: ``file``, from byte ``base``, ``row_bytes`` each.

    ``file`` is a path, or the descriptor of a file its backend holds open for as long as
    the :class:`Extents` lives (a shared table's segment: unlinked, it has no path).
    """

    file: Path | int
    base: int
    row_bytes: int


@dataclass(frozen=True)
class Room:
    """Where reserved rows take room, as a full one is reported: its free bytes are
    measured at ``path``; ``where`` and ``remedy`` go into the message."""

    path: Path
    where: str
    remedy: str

    @classmethod
    def disk(cls, path: Path) -> Room:
        """The disk under ``path`` (a file backend's folder)."""
        return cls(path, f"at {path}", "Free disk space or move the data root to a larger volume")

    def full(self, table: str, needed: str, why: str) -> InsufficientStorage:
        """The error for ``needed`` (what did not fit, e.g. ``"more rows: 640 more bytes
        needed"``); ``why`` says what was held and what the system said."""
        free = free_bytes(self.path)
        return InsufficientStorage(
            f"table {table!r}: no room for {needed} {self.where} ({free} free; {why}). "
            f"{self.remedy}",
            table=table,
            field="rows",
            expected=f"<= {free} bytes",
            got=needed,
        )


@contextlib.contextmanager
def _opened(file: Path | int, flags: int) -> Iterator[int]:
    """A descriptor of ``file``: opened (and closed) here if it is a path."""
    if isinstance(file, int):
        yield file
        return
    fd = os.open(file, flags)
    try:
        yield fd
    finally:
        os.close(fd)


class Extents:
    """The rows ``[0, reserved)`` whose disk blocks are reserved, for every field.

    Args:
        spans: one per field.
        capacity: rows in all.
        table: the table's name (for errors).
        preallocate: reserve the whole capacity now.
        room: where the rows take room (default: the disk under the first span's file).

    Raises:
        InsufficientStorage: (``preallocate``) the capacity does not fit.
    """

    def __init__(
        self,
        spans: list[Span],
        capacity: int,
        table: str,
        preallocate: bool = False,
        *,
        room: Room | None = None,
    ):
        self.spans = spans
        self.capacity = capacity
        self.table = table
        if room is None:
            assert not isinstance(spans[0].file, int), "a descriptor names no disk: pass room"
            room = Room.disk(spans[0].file.parent)
        self.room = room
        self.row_bytes = sum(s.row_bytes for s in spans)
        self.reserved = min((_backed_rows(s, capacity) for s in spans), default=capacity)
        if preallocate:
            self.reserve(capacity, exact=True)

    @property
    def nbytes(self) -> int:
        """Bytes reserved for rows (every span's)."""
        return self.reserved * self.row_bytes

    def add(self, spans: list[Span]) -> None:
        """Reserve more files with the rows: ``spans`` (a memmap table's per-slot state
        files) get the rows reserved now at once, and every later extent with the others.

        When the disk has no room for them (a table reopened on a full disk whose state
        files were not reserved as far as its rows), the reservation shrinks to what every
        file holds: the rows written are served, the next insert past them is a 507.
        """
        self.spans = [*self.spans, *spans]
        self.row_bytes += sum(s.row_bytes for s in spans)
        if not self.reserved:
            return
        try:
            self._fallocate(0, self.reserved, spans)
        except InsufficientStorage:
            self.reserved = min(self.reserved, *(_backed_rows(s, self.capacity) for s in spans))

    def reserve(self, end: int, *, exact: bool = False) -> None:
        """Make sure rows ``[0, end)`` are backed by disk: those first, then (unless
        ``exact``) an extent ahead if the disk's free bytes hold it. A no-op (one
        comparison) when they are backed.

        Raises:
            InsufficientStorage: the disk (or quota) has no room for them; nothing
                was written, the rows reserved before stay reserved.
        """
        if end <= self.reserved:
            return
        end = min(end, self.capacity)
        start = self.reserved
        # Field by field: a field's share of an extent that did not fit stayed reserved
        # when the next field's was refused (uncounted, taking the room the rows needed).
        # So the rows needed first, then the extent ahead if the room holds it now.
        self._fallocate(start, end)
        self.reserved = max(self.reserved, end)
        stop = start + extent_rows(start, self.row_bytes, self.capacity)
        if exact or stop <= self.reserved:
            return
        margin = len(self.spans) * mmap.PAGESIZE  # each field's range may end in a new page
        if (stop - end) * self.row_bytes + margin <= free_bytes(self.room.path):
            with contextlib.suppress(InsufficientStorage):  # the room shrank meanwhile
                self._fallocate(end, stop)
                self.reserved = max(self.reserved, stop)

    def _fallocate(self, start: int, stop: int, spans: list[Span] | None = None) -> None:
        spans = self.spans if spans is None else spans
        needed = (stop - start) * sum(s.row_bytes for s in spans)

        def full(err: Exception) -> InsufficientStorage:
            return self.room.full(
                self.table,
                f"more rows: {needed} more bytes needed",
                f"{self.reserved} of {self.capacity} rows reserved, "
                f"{getattr(err, 'strerror', None) or err}; the table keeps serving what it holds",
            )

        for span in spans:
            with _opened(span.file, os.O_RDWR) as fd:
                try:
                    with on_full_disk("reserving rows", self.room.path, error=full):
                        os.posix_fallocate(
                            fd, span.base + start * span.row_bytes, (stop - start) * span.row_bytes
                        )
                except OSError as err:
                    if err.errno not in FALLOCATE_UNSUPPORTED:
                        raise
                    log.warning(
                        "table %r: %s cannot reserve blocks (%s); running out of room %s "
                        "may end in SIGBUS", self.table, span.file, err, self.room.where,
                    )  # fmt: skip
                    self.reserved = self.capacity
                    return


def _backed_rows(span: Span, capacity: int) -> int:
    """Rows of ``span`` from the first up that have disk blocks (a reopened table's rows):
    the first hole ends them. Conservative: blocks reserved but never written may count as
    a hole (ext4), and are then reserved again, which costs nothing."""
    end = span.base + capacity * span.row_bytes
    try:
        with _opened(span.file, os.O_RDONLY) as fd:
            hole = os.lseek(fd, span.base, os.SEEK_HOLE)
            # a file system without holes says "data to the end": no more than its blocks hold
            hole = min(hole, span.base + os.fstat(fd).st_blocks * 512)
    except OSError:  # gone, or no SEEK_HOLE here: reserve again from the start (idempotent)
        return 0
    if not span.row_bytes:
        return capacity
    return max(0, min(hole, end) - span.base) // span.row_bytes
