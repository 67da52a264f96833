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


class FifoSampler(Sampler):
    """Oldest first. ``head`` is the slot of the oldest unread item."""

    kind = "fifo"
    consumes = True

    def __init__(self, slots, generator=None) -> None:
        super().__init__(slots, generator)
        self.head = 0

    def ready(self, n: int) -> bool:
        if self.slots.n_live < n:
            return False
        return _all_in_ring(self.slots.live, self.head, n)

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        idx = _ring(self.head, n, self.slots.capacity)
        self.head = (self.head + n) % self.slots.capacity
        return idx, None

    def state_dict(self) -> dict[str, Any]:
        return {"head": self.head}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.head = SF.integer(state, "head", "sampler", hi=self.slots.capacity - 1)

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "head": self.head}


class LifoSampler(Sampler):
    """Newest first, popping from the top of the :class:`~tdreplay.storage.slot_policy.StackPolicy`."""

    kind = "lifo"
    consumes = True

    def __init__(self, slots, generator=None, *, stack: Any) -> None:
        super().__init__(slots, generator)
        self.stack = stack

    def ready(self, n: int) -> bool:
        top = self.stack.top
        return top >= n and bool(self.slots.live[top - n : top].all())

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        top = self.stack.top
        idx = torch.arange(top - 1, top - n - 1, -1, dtype=torch.int64)
        self.stack.top = top - n
        return idx, None
