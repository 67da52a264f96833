"""Queues and stacks: each item returned once, oldest (FIFO) or newest (LIFO) first.

Both consume what they return. Their slot allocation is part of the
discipline: a queue is a ring whose writer never overwrites an unread item, a
stack pushes and pops at one end. Inserts into a full queue or stack wait.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import statefile as SF
from .base import Sampler


def _ring(start: int, n: int, capacity: int) -> torch.Tensor:
    if start + n <= capacity:
        return torch.arange(start, start + n, dtype=torch.int64)
    return (torch.arange(start, start + n, dtype=torch.int64)) % capacity


def _all_in_ring(mask: torch.Tensor, start: int, n: int) -> bool:
    """Whether all ``n`` entries of ``mask`` from ``start`` on (ring order) are set."""
    end = start + n
    if end <= len(mask):
        return bool(mask[start:end].all())
    return bool(mask[start:].all()) and bool(mask[: end - len(mask)].all())


class _Taking(Sampler):
    """A queue or a stack: :meth:`ready` finds the slots the next draw takes, and
    :meth:`sample`, which the table calls next under the same lock, takes them without
    looking again (finding them twice made a one-item draw 8 us slower)."""

    consumes = True

    def __init__(self, slots, generator=None) -> None:
        super().__init__(slots, generator)
        self._found: tuple[tuple[int, ...], torch.Tensor] | None = None

    def _take(self, n: int) -> torch.Tensor | None:
        raise NotImplementedError

    def _where(self, n: int) -> tuple[int, ...]:
        """What :meth:`_take`'s answer depends on besides the live slots (which only an
        insert or a removal changes, and those move ``n_live``, the cursor or the top)."""
        raise NotImplementedError

    def ready(self, n: int) -> bool:
        idx = self._take(n)
        self._found = None if idx is None else (self._where(n), idx)
        return idx is not None

    def _taken(self, n: int) -> torch.Tensor:
        """The slots :meth:`ready` found for this draw (found again if anything moved)."""
        found, self._found = self._found, None
        if found is not None and found[0] == self._where(n):
            return found[1]
        idx = self._take(n)
        assert idx is not None, "sample() without ready()"
        return idx


class FifoSampler(_Taking):
    """Oldest first. ``head`` is the slot of the oldest unread item.

    The queued items lie in ring order from ``head`` to the writer's cursor. A slot
    there may have been emptied (``Table.remove``, an insert that failed to write):
    it is skipped, as Reverb's queue skips deleted items, so no live item is ever
    stranded behind it.
    """

    kind = "fifo"
    SCALARS = {"head": int}

    def __init__(self, slots, generator=None, *, ring: Any) -> None:
        super().__init__(slots, generator)
        self.ring = ring
        self.head = 0

    def _where(self, n: int) -> tuple[int, ...]:
        return n, self.head, self.slots.n_live, self.ring.cursor

    def _take(self, n: int) -> torch.Tensor | None:
        """The ``n`` oldest items' slots, or ``None`` while fewer are ready (an item
        still being written comes before them)."""
        s, cap = self.slots, self.slots.capacity
        if s.n_live < n:
            return None
        if _all_in_ring(s.live, self.head, n):
            return _ring(self.head, n, cap)
        # a slot emptied in the queue: look at it all, head to cursor (every slot if full)
        queued = _ring(self.head, (self.ring.cursor - self.head) % cap or cap, cap)
        busy = s.busy[queued].nonzero()
        if len(busy):
            queued = queued[: int(busy[0])]
        queued = queued[s.live[queued]]
        return queued[:n] if len(queued) >= n else None

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        idx = self._taken(n)
        self.head = (int(idx[-1]) + 1) % self.slots.capacity
        return idx, None

    def state_dict(self) -> dict[str, Any]:
        return self.scalars()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        head = SF.integer(state, "head", "sampler", hi=self.slots.capacity - 1)
        # The queue is head .. cursor (the whole ring when they meet): a live item outside
        # it would come out of order, and hold back the writer, which never passes it.
        cap, cursor = self.slots.capacity, self.ring.cursor
        outside = torch.zeros(cap, dtype=torch.bool)
        outside[: self.slots.hi] = self.slots.live[: self.slots.hi]
        outside[_ring(head, (cursor - head) % cap, cap)] = False
        if head != cursor and bool(outside.any()):
            slot = int(outside.nonzero()[0])
            raise SF.StateError(
                f"sampler.head is {head}, but slot {slot} is live outside the queue "
                f"(slots {head} .. {cursor - 1} in ring order, the writer's cursor at {cursor})"
            )
        self.head = head

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "head": self.head}


class LifoSampler(_Taking):
    """Newest first, popping from the top of the :class:`~tdreplay.storage.slot_policy.StackPolicy`."""

    kind = "lifo"

    def __init__(self, slots, generator=None, *, stack: Any) -> None:
        super().__init__(slots, generator)
        self.stack = stack

    def _where(self, n: int) -> tuple[int, ...]:
        return n, self.stack.top, self.slots.n_live

    def _take(self, n: int) -> torch.Tensor | None:
        """The ``n`` newest items' slots, or ``None`` while fewer are ready (an item still
        being written comes before them). Emptied slots (``Table.remove``, an insert that
        failed to write) are skipped."""
        s, top = self.slots, self.stack.top
        if s.n_live < n:
            return None
        if top >= n and bool(s.live[top - n : top].all()):
            return torch.arange(top - 1, top - n - 1, -1, dtype=torch.int64)
        stacked = torch.arange(top - 1, -1, -1, dtype=torch.int64)
        busy = s.busy[stacked].nonzero()
        if len(busy):
            stacked = stacked[: int(busy[0])]
        stacked = stacked[s.live[stacked]]
        return stacked[:n] if len(stacked) >= n else None

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        idx = self._taken(n)
        top = int(idx[-1])
        s = self.slots
        while top and not (s.live[top - 1] or s.busy[top - 1]):  # emptied slots below: free
            top -= 1
        self.stack.top = top
        return idx, None
