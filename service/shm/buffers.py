"""Shared-memory slots: ``memfd_create`` buffers one socket connection holds.

A :class:`SlotBuffer` is an anonymous memory file (``memfd_create``, no name in
any file system, no ``/dev/shm``), sized and reserved up front
(``posix_fallocate``: a full memory answers 507 here, not SIGBUS later),
sealed against resizing (the client holds its descriptor and could
otherwise truncate it under the server's mapping), mapped once. The server
keeps only the mapping (:class:`~tdreplay.system.SharedMap`, which holds
no descriptor): the descriptor goes to the client with the reply that made
the slot and is closed then, so slots cost the server no file descriptors.
:class:`SlotBuffers` bounds what one connection holds, in bytes and in count;
:class:`Budget` bounds what all connections hold together.
"""

from __future__ import annotations

import errno
import logging
import os
import time
import weakref
from collections import deque

import torch

from tdreplay.codec.shm import ALIGN, SlotLayout
from tdreplay.storage import InsufficientStorage, InvalidRequest, SampleTarget
from tdreplay.system import SharedMap, sealed_memfd

log = logging.getLogger("tdreplay.service")

#: errors that mean "no more memory or descriptors": 507, not 500
FULL = (errno.ENOSPC, errno.ENOMEM, errno.EMFILE, errno.ENFILE)


def _full(what: str, size: int, err: OSError) -> InsufficientStorage:
    return InsufficientStorage(
        f"no room for a shared-memory slot of {size} bytes ({what}: {err.strerror})",
        field="batch_size",
        got=size,
    )


class Budget:
    """Bytes of slots all connections hold together, at most ``limit`` (``--shm-total-bytes``).

    A slot the server let go of (dropped, replaced, or its connection ended)
    may still be mapped by its client, who got its descriptor: it stays
    counted, as *lingering*, until the server reclaims it - punches its
    memory out (:meth:`~tdreplay.system.SharedMap.discard`), in the
    client's mapping too. Lingering slots are reclaimed oldest first when a
    new slot needs their room, when more than ``max_lingering`` linger, and
    ``linger`` seconds after they were let go (:meth:`sweep`). So a client
    that reconnects again and again, keeping every descriptor, holds no more
    than the limit; a departed client's last batches stay readable for a
    while, unless the room is needed.

    Args:
        limit: bytes at most.
        linger: seconds a let-go slot is kept before it is reclaimed.
        max_lingering: let-go slots kept at most (each holds a mapping).
    """

    def __init__(self, limit: int, linger: float = 600.0, max_lingering: int = 1024) -> None:
        self.limit = limit
        self.linger = linger
        self.max_lingering = max_lingering
        self.used = 0
        self._lingering: deque[tuple[float, SlotBuffer]] = deque()

    def take(self, size: int) -> None:
        """Count ``size`` more bytes, reclaiming let-go slots first where needed.

        Raises:
            InsufficientStorage: ``size`` more would pass the limit.
        """
        self.sweep()
        while self.used + size > self.limit and self._lingering:
            self._reclaim()
        if self.used + size > self.limit:
            raise InsufficientStorage(
                f"a slot of {size} bytes would take the server's shared memory past its limit "
                f"of {self.limit} bytes (--shm-total-bytes; {self.used} held by all connections)",
                field="batch_size",
                expected=f"<= {self.limit - self.used} bytes",
                got=size,
            )
        self.used += size

    def give(self, size: int) -> None:
        """``size`` bytes that no client can hold are free again."""
        self.used -= size

    def let_go(self, slot: SlotBuffer) -> None:
        """The server is done with ``slot``; its client may still map it."""
        if slot.fresh:  # its descriptor never left the server: nobody else holds it
            slot.close()
            self.give(slot.size)
            return
        slot.close()
        self._lingering.append((time.monotonic(), slot))
        while len(self._lingering) > self.max_lingering:
            self._reclaim()

    def sweep(self) -> None:
        """Reclaim the slots let go of more than ``linger`` seconds ago."""
        deadline = time.monotonic() - self.linger
        while self._lingering and self._lingering[0][0] <= deadline:
            self._reclaim()

    def _reclaim(self) -> None:
        _, slot = self._lingering.popleft()
        try:
            slot.map.discard()
        except OSError as err:  # not expected on Linux memfds; the count must not lie
            log.error("could not reclaim a shared-memory slot of %d bytes: %s", slot.size, err)
            self._lingering.appendleft((time.monotonic(), slot))
            raise InsufficientStorage(
                f"a lingering shared-memory slot could not be reclaimed: {err.strerror}",
                field="batch_size",
            ) from None
        self.give(slot.size)


class SlotBuffer:
    """One memfd buffer laid out as ``layout``.

    Attributes:
        kind: ``"sample"`` or ``"extend"``.
        owner: what the slot was laid out for (the table's handle), or ``None`` once
            it is gone: a slot is laid out again when the table was replaced since. Held
            weakly: a slot the client keeps (or one lingering after it was let go) must
            not keep a deleted or cleared table's storage alive.
        fd: the descriptor, until it was sent to the client (then ``-1``).
        out: for a sample slot, the views the table gathers into (checked once).
        generation: how many times the server filled it.

    Raises:
        InsufficientStorage: no memory, or no descriptor, for it.
    """

    def __init__(self, kind: str, owner: object, layout: SlotLayout) -> None:
        self.kind = kind
        self._owner = weakref.ref(owner)
        self.layout = layout
        self.size = max(ALIGN, layout.nbytes)
        self.generation = 0
        self.out: SampleTarget | None = None
        try:
            self.fd = sealed_memfd(f"tdreplay-{kind}", self.size)
        except OSError as err:
            if err.errno in FULL:
                raise _full("memfd", self.size, err) from None
            raise
        try:
            self.map = SharedMap(self.fd, self.size)
        except OSError as err:
            os.close(self.fd)
            if err.errno in FULL:
                raise _full("map", self.size, err) from None
            raise
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def owner(self) -> object:
        return self._owner()

    def views(self) -> dict[tuple[str, ...], torch.Tensor]:
        return self.layout.views(self.map.buffer)

    @property
    def fresh(self) -> bool:
        """Whether its descriptor is still to be sent to the client."""
        return self.fd >= 0

    def sent(self) -> None:
        """The client has the descriptor now (or never will): the server keeps only the mapping."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """The server is done with it: no views of its own, no descriptor (the mapping stays
        for :meth:`Budget.let_go`, which reclaims the memory; it goes with the object)."""
        self.out = None
        self.sent()


class SlotBuffers:
    """The slots of one connection, by the client's number, bounded in bytes and count.

    Args:
        max_bytes: bytes the slots may hold together (``--shm-connection-bytes``).
        max_slots: slots at most (``--shm-max-slots``).
        budget: the server's, shared by every connection.
    """

    def __init__(self, max_bytes: int, max_slots: int, budget: Budget) -> None:
        self.max_bytes = max_bytes
        self.max_slots = max_slots
        self.budget = budget
        self.nbytes = 0
        self._slots: dict[int, SlotBuffer] = {}

    def __len__(self) -> int:
        return len(self._slots)

    def get(
        self, number: object, kind: str, owner: object = None, rows: int | None = None
    ) -> SlotBuffer | None:
        """SlotBuffer ``number`` if it is a ``kind`` slot of ``owner`` (and ``rows`` rows), else ``None``."""
        slot = self._slots.get(number) if type(number) is int else None
        if slot is None or slot.kind != kind or (owner is not None and slot.owner is not owner):
            return None
        if rows is not None and slot.layout.rows != rows:
            return None
        return slot

    def check_number(self, number: object) -> int:
        """Raises:
        InvalidRequest: ``number`` is not an integer in ``[0, max_slots)``."""
        if type(number) is not int or not 0 <= number < self.max_slots:
            raise InvalidRequest(
                f"slot must be an integer in [0, {self.max_slots}) (--shm-max-slots), "
                f"got {number!r:.40}",
                field="slot",
                got=number if type(number) is int else None,
            )
        return number

    def make(self, number: object, kind: str, owner: object, layout: SlotLayout) -> SlotBuffer:
        """A new slot ``number`` (replacing the one of that number).

        Raises:
            InvalidRequest: see :meth:`check_number`.
            InsufficientStorage: the connection's or the server's slots would
                exceed their limits, or the memory or descriptors ran out.
        """
        number = self.check_number(number)
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
        self.budget.take(size)
        try:
            slot = SlotBuffer(kind, owner, layout)
        except BaseException:
            self.budget.give(size)
            raise
        self._slots[number] = slot
        self.nbytes += slot.size
        return slot

    def drop(self, number: object) -> None:
        slot = self._slots.pop(number, None) if type(number) is int else None
        if slot is not None:
            self.nbytes -= slot.size
            self.budget.let_go(slot)

    def close(self) -> None:
        for number in list(self._slots):
            self.drop(number)
