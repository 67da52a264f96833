"""Shared-memory slots: ``memfd_create`` buffers one socket connection holds.

A :class:`Slot` is an anonymous memory file (``memfd_create``, no name in
any file system, no ``/dev/shm``), sized and reserved up front
(``posix_fallocate``: a full memory answers 507 here, not SIGBUS later),
sealed against resizing (the client holds its descriptor and could
otherwise truncate it under the server's mapping), mapped once. The server keeps only the mapping: the descriptor is handed to
the client with the reply that created the slot and then closed, so a
connection costs no file descriptors while it holds its slots.
:class:`Slots` bounds what one connection may hold, in bytes and in count.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
from typing import Any

from tdreplay.codec.shm import ALIGN, SlotLayout
from tdreplay.storage import InsufficientStorage, InvalidRequest, SampleTarget

#: slots one connection may hold at most (each is a mapping of the server's)
MAX_SLOTS = 256
#: a slot's size is fixed for good before its descriptor leaves the server
SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


def supported() -> bool:
    """Whether this OS offers what the transport needs (``memfd_create``, ``SCM_RIGHTS``)."""
    import socket

    return (
        hasattr(os, "memfd_create") and hasattr(socket, "AF_UNIX") and hasattr(socket, "SCM_RIGHTS")
    )


class Slot:
    """One memfd buffer laid out as ``layout``.

    Attributes:
        kind: ``"sample"`` or ``"extend"``.
        owner: what the slot was laid out for (the table's handle): a slot is
            laid out again when the table was replaced since.
        fd: the descriptor, until it was sent to the client (then ``-1``).
        out: for a sample slot, the views the table gathers into (checked once).
        generation: how many times the server filled it.
    """

    def __init__(self, kind: str, owner: Any, layout: SlotLayout) -> None:
        self.kind = kind
        self.owner = owner
        self.layout = layout
        self.size = max(ALIGN, layout.nbytes)
        self.generation = 0
        self.out: SampleTarget | None = None
        self.fd = os.memfd_create(f"tdreplay-{kind}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, self.size)
            try:
                os.posix_fallocate(self.fd, 0, self.size)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.ENOMEM):
                    raise
                raise InsufficientStorage(
                    f"no memory for a shared-memory slot of {self.size} bytes",
                    field="batch_size",
                    got=self.size,
                ) from None
            # The client gets this descriptor: sealed, it cannot shrink the file under the
            # server's mapping (a read or write past the end would be SIGBUS here).
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, SEALS)
            self.map = mmap.mmap(self.fd, self.size)
        except BaseException:
            os.close(self.fd)
            raise

    def views(self) -> dict[tuple[str, ...], Any]:
        return self.layout.views(self.map)

    def sent(self) -> None:
        """The client has the descriptor now: the server keeps only the mapping."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Unmap (once no view of the server's is left) and close."""
        self.out = None
        self.sent()
        with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
            self.map.close()


class Slots:
    """The slots of one connection, by the client's number, bounded in bytes and count.

    Args:
        max_bytes: bytes the slots may hold together.
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._slots: dict[int, Slot] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def get(
        self, number: Any, kind: str, owner: Any = None, rows: int | None = None
    ) -> Slot | None:
        """Slot ``number`` if it is a ``kind`` slot of ``owner`` (and ``rows`` rows), else ``None``."""
        slot = self._slots.get(number) if isinstance(number, int) else None
        if slot is None or slot.kind != kind or (owner is not None and slot.owner is not owner):
            return None
        if rows is not None and slot.layout.rows != rows:
            return None
        return slot

    def make(self, number: Any, kind: str, owner: Any, layout: SlotLayout) -> Slot:
        """A new slot ``number`` (replacing the one of that number).

        Raises:
            InvalidRequest: ``number`` is not an integer in ``[0, MAX_SLOTS)``.
            InsufficientStorage: the connection's slots would exceed ``max_bytes``,
                or the memory is full.
        """
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number < MAX_SLOTS:
            raise InvalidRequest(
                f"slot must be an integer in [0, {MAX_SLOTS}), got {number!r:.40}",
                field="slot",
                got=number if isinstance(number, int) else None,
            )
        self.drop(number)
        size = max(ALIGN, layout.nbytes)
        if self.nbytes + size > self.max_bytes:
            raise InsufficientStorage(
                f"a slot of {size} bytes would take this connection's shared memory past its "
                f"limit of {self.max_bytes} bytes (--shm-connection-bytes; it holds "
                f"{self.nbytes} in {len(self._slots)} slots)",
                field="batch_size",
                expected=f"<= {self.max_bytes - self.nbytes} bytes",
                got=size,
            )
        slot = Slot(kind, owner, layout)
        self._slots[number] = slot
        self.nbytes += slot.size
        return slot

    def drop(self, number: Any) -> None:
        slot = self._slots.pop(number, None)
        if slot is not None:
            self.nbytes -= slot.size
            slot.close()

    def close(self) -> None:
        for number in list(self._slots):
            self.drop(number)
