"""Slot policies: which slots an insert fills, and so which items it evicts.

A schema chooses its table's policy in its ``writer`` section (TorchRL's word:
round robin, stack, max value); the classes here are named for what they
decide, so that "writer" means one thing in the code: the client's collector
buffer (:class:`tdreplay.client.Writer`). A policy sees the slot state and,
for max value, one scalar per new item; it never touches data.
:meth:`SlotPolicy.claim` returns a :class:`Claim`: which rows of the batch
are kept, and the slots they go to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import spec as S
from . import statefile as SF
from .scalars import Scalars
from .slots import Slots


@dataclass
class Claim:
    #: slots the kept rows go to, in batch order
    index: torch.Tensor
    #: the same as a ``slice`` when contiguous (the backends' fast path)
    target: slice | torch.Tensor
    #: rows of the batch that are kept; ``None``: all of them
    rows: torch.Tensor | None = None


def _claim_range(start: int, n: int, capacity: int) -> Claim:
    index = torch.arange(start, start + n, dtype=torch.int64)
    if start + n <= capacity:
        return Claim(index, slice(start, start + n))
    index %= capacity
    return Claim(index, index)


def _any_in_ring(mask: torch.Tensor, start: int, n: int, hi: int | None = None) -> bool:
    """Whether any of the ``n`` entries of ``mask`` from ``start`` on (ring order) is set,
    reading only those below ``hi`` (a per-slot column: past the written slots nothing is
    set, and its file is a hole there that a read would back, see :meth:`Slots.written`)."""
    hi = len(mask) if hi is None else hi
    end = start + n
    if end <= len(mask):
        return bool(mask[start : min(end, hi)].any())
    return bool(mask[start:hi].any()) or bool(mask[: min(end - len(mask), hi)].any())


class SlotPolicy(Scalars):
    kind = ""

    def __init__(self, slots: Slots) -> None:
        self.slots = slots

    def can_claim(self, n: int) -> bool:
        return True

    def claim(self, n: int, values: torch.Tensor | None = None) -> Claim:
        raise NotImplementedError

    def reach(self, n: int) -> int:
        """The end (exclusive) of the slots a claim of ``n`` items may write, for the table
        to reserve disk up to before it claims. New items take the lowest free slots, so
        never past the written ones (``slots.hi``) plus ``n``."""
        return min(self.slots.capacity, self.slots.hi + n)

    def ring_start(self) -> int | None:
        """The slot of the oldest item when the policy writes slots in ring order (then
        the items, oldest first, are slots ``[start, hi)`` and ``[0, start)``); ``None``
        when items are not in slot order (their ordinals tell)."""
        return None

    def columns(self) -> dict[str, torch.Tensor]:
        """Per-slot tensors holding state to keep across a crash (see :mod:`tdreplay.storage.durable`)."""
        return {}

    def bind_columns(self, columns: dict[str, torch.Tensor]) -> None:
        """Use ``columns`` (same shapes and dtypes) instead of the own tensors of :meth:`columns`."""
        for name, tensor in columns.items():
            setattr(self, name.rpartition(".")[2], tensor)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind}


class RoundRobinPolicy(SlotPolicy):
    """Fills slots in ring order from ``cursor``; the oldest item is overwritten.

    With ``overwrite=False`` (queues) an insert waits instead while its slots
    still hold unread items.
    """

    kind = "round_robin"
    SCALARS = {"cursor": int}

    def __init__(self, slots: Slots, *, overwrite: bool = True) -> None:
        super().__init__(slots)
        self.overwrite = overwrite
        self.cursor = 0

    def can_claim(self, n: int) -> bool:
        # Only the n slots from the cursor are looked at: O(n), not O(capacity).
        # A slot still being written by an earlier insert cannot be reused yet;
        # without overwrite (queues) neither can one holding an unread item.
        # Asked before the table reserves those slots: live is read below hi only (busy
        # is in memory).
        s = self.slots
        if self.overwrite:
            return not _any_in_ring(s.busy, self.cursor, n)
        busy = _any_in_ring(s.busy, self.cursor, n)
        return not (busy or _any_in_ring(s.live, self.cursor, n, s.hi))

    def claim(self, n: int, values: torch.Tensor | None = None) -> Claim:
        c = _claim_range(self.cursor, n, self.slots.capacity)
        self.cursor = (self.cursor + n) % self.slots.capacity
        return c

    def reach(self, n: int) -> int:
        return min(self.slots.capacity, max(self.slots.hi, self.cursor) + n)

    def ring_start(self) -> int:
        return self.cursor

    def state_dict(self) -> dict[str, Any]:
        return self.scalars()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor = SF.integer(state, "cursor", "writer", hi=self.slots.capacity - 1)

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "cursor": self.cursor}


class StackPolicy(SlotPolicy):
    """Pushes at ``top``; the LIFO sampler pops from there. Waits while full."""

    kind = "stack"
    SCALARS = {"top": int}

    def __init__(self, slots: Slots) -> None:
        super().__init__(slots)
        self.top = 0

    def can_claim(self, n: int) -> bool:
        return self.top + n <= self.slots.capacity

    def claim(self, n: int, values: torch.Tensor | None = None) -> Claim:
        c = _claim_range(self.top, n, self.slots.capacity)
        self.top += n
        return c

    def reach(self, n: int) -> int:
        return min(self.slots.capacity, max(self.slots.hi, self.top) + n)

    def state_dict(self) -> dict[str, Any]:
        return self.scalars()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        top = SF.integer(state, "top", "writer", hi=self.slots.capacity)
        # slots loaded first (Table.load_state_dict): none is live past hi, whose files are
        # holes there (not read, see Slots.written)
        if top > self.slots.hi:  # pushes fill slots from the bottom: none was written there
            raise SF.StateError(f"writer.top is {top}, past slots.hi ({self.slots.hi})")
        above = self.slots.live[top : self.slots.hi].nonzero()
        if len(above):  # the next push would overwrite it
            raise SF.StateError(
                f"writer.top is {top}, but slot {top + int(above[0])} (at or above it) is live"
            )
        self.top = top

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "top": self.top}


class MaxValuePolicy(SlotPolicy):
    """Keeps the ``capacity`` items with the largest value of ``key``.

    New items fill free slots first; after that an item replaces the stored
    item with the smallest value when its own is larger, and is dropped
    otherwise. Pairing the largest newcomers with the smallest residents is
    exact for a batch. Cost per insert: O(capacity) for the top-k scan.
    """

    kind = "max_value"

    def __init__(self, slots: Slots, *, key: str) -> None:
        super().__init__(slots)
        self.key = key
        self.values = torch.zeros(slots.capacity, dtype=torch.float64)  # 0: no item (slots.py)

    def can_claim(self, n: int) -> bool:
        return True

    def claim(self, n: int, values: torch.Tensor | None = None) -> Claim:
        assert values is not None
        v = values.reshape(-1).to(torch.float64)
        order = torch.argsort(v, descending=True, stable=True)  # of equal values, the earlier row
        free = self.slots.free().nonzero().squeeze(1)
        take_free = min(len(free), n)
        rows = [order[:take_free]]
        index = [free[:take_free]]
        rest = order[take_free:]
        if len(rest):
            # residents that may be replaced: live and not being written
            hi = self.slots.hi  # past it nothing is live (nor read)
            resident = torch.full((self.slots.capacity,), float("inf"), dtype=self.values.dtype)
            resident[:hi] = torch.where(self.slots.live[:hi], self.values[:hi], resident[:hi])
            m = min(len(rest), self.slots.capacity)
            low_vals, low_idx = torch.topk(resident, m, largest=False)
            new_vals = v[rest[:m]]
            wins = int((new_vals > low_vals).sum())  # a prefix: new sorted desc, old asc
            rows.append(rest[:wins])
            index.append(low_idx[:wins])
        rows_t = torch.cat(rows)
        index_t = torch.cat(index)
        keep = torch.argsort(rows_t)  # the kept rows in batch order, as Claim promises
        rows_t, index_t = rows_t[keep], index_t[keep]
        self.values[index_t] = v[rows_t]
        return Claim(index_t, index_t, rows_t)

    def columns(self) -> dict[str, torch.Tensor]:
        return {"writer.values": self.values}

    def state_dict(self) -> dict[str, Any]:
        return {"values": self.slots.written(self.values)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.slots.load_written(
            self.values, self.slots.loaded(state, "values", "writer", self.values)
        )

    def info(self) -> dict[str, Any]:
        hi = self.slots.hi
        live = self.values[:hi][self.slots.live[:hi]]
        return {
            "kind": self.kind,
            "key": self.key,
            "min_value": float(live.min()) if len(live) else None,
            "max_value": float(live.max()) if len(live) else None,
        }


def make_slot_policy(spec: S.TableSpec, slots: Slots) -> SlotPolicy:
    """The slot policy ``spec``'s writer section declares (queues and stacks bring their own)."""
    if isinstance(spec.sampler, S.FifoSamplerSpec):
        return RoundRobinPolicy(slots, overwrite=False)
    if isinstance(spec.sampler, S.LifoSamplerSpec):
        return StackPolicy(slots)
    if isinstance(spec.writer, S.MaxValueWriterSpec):
        return MaxValuePolicy(slots, key=spec.writer.key)
    return RoundRobinPolicy(slots)
