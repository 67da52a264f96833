"""Uniform sampling with replacement, and epochs without replacement."""

from __future__ import annotations

from typing import Any

import torch

from .. import statefile as SF
from .base import Sampler, draw_live


class UniformSampler(Sampler):
    """Every live item equally likely, with replacement. O(batch) per call."""

    kind = "uniform"

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return draw_live(self.slots, n, self.generator), None


class WithoutReplacementSampler(Sampler):
    """Epochs: a random permutation of the live items, returned batch by batch.

    Items inserted during an epoch join the next one; items removed during an
    epoch are skipped. A batch that runs past the end of an epoch is completed
    from the next one. Cost per call is O(batch) plus O(size) once per epoch.
    """

    kind = "without_replacement"
    #: a reopened durable table starts a new epoch (its permutation is not kept)
    DERIVED = ("pos", "epoch")

    def __init__(self, slots, generator=None) -> None:
        super().__init__(slots, generator)
        self.perm = torch.empty(0, dtype=torch.int64)
        self.perm_ordinal = torch.empty(0, dtype=torch.int64)
        self.pos = 0
        self.epoch = 0
        # Slots removed (or overwritten, which removes first) since the epoch
        # began: skipped when the permutation reaches them. One lookup in a
        # bool mask per draw, none while nothing was removed.
        self._stale = torch.zeros(slots.capacity, dtype=torch.bool)
        self._any_stale = False

    def on_remove(self, index: torch.Tensor) -> None:
        if len(index):
            self._stale[index] = True
            self._any_stale = True

    def _new_epoch(self) -> None:
        live = self.slots.live[: self.slots.hi].nonzero().squeeze(1)
        self.perm = live[torch.randperm(len(live), generator=self.generator)]
        self.perm_ordinal = self.slots.ordinal[self.perm].clone()
        self.pos = 0
        self.epoch += 1
        if self._any_stale:
            self._stale.zero_()
            self._any_stale = False

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        parts: list[torch.Tensor] = []
        need = n
        fresh_epochs = 0
        while need > 0:
            if self.pos >= len(self.perm):
                self._new_epoch()
                fresh_epochs += 1
                if fresh_epochs > 2 or len(self.perm) == 0:
                    break
            chunk = self.perm[self.pos : self.pos + need]
            self.pos += len(chunk)
            if self._any_stale:  # skip items removed or overwritten since the epoch began
                chunk = chunk[~self._stale[chunk]]
            parts.append(chunk)
            need -= len(chunk)
        idx = torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)
        if len(idx) < n:  # fewer live items than n: top up uniformly
            idx = torch.cat([idx, draw_live(self.slots, n - len(idx), self.generator)])
        return idx, None

    def state_dict(self) -> dict[str, Any]:
        return {
            "perm": self.perm.clone(),
            "perm_ordinal": self.perm_ordinal.clone(),
            **self.scalars(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        where = "sampler"
        perm = SF.tensor(state, "perm", where, dtype=torch.int64, ndim=1)
        perm_ordinal = SF.tensor(state, "perm_ordinal", where, dtype=torch.int64, ndim=1)
        if perm_ordinal.shape != perm.shape:
            raise SF.StateError(
                f"sampler.perm_ordinal: expected shape {list(perm.shape)} (as sampler.perm), "
                f"got {list(perm_ordinal.shape)}"
            )
        if len(perm) and (int(perm.min()) < 0 or int(perm.max()) >= self.slots.capacity):
            raise SF.StateError(f"sampler.perm: a slot outside [0, {self.slots.capacity})")
        slots, counts = torch.unique(perm, return_counts=True)
        if len(slots) < len(perm):  # an epoch draws each item once: a repeat is drawn again
            slot = int(slots[counts > 1][0])
            raise SF.StateError(
                f"sampler.perm: slot {slot} appears {int(counts[counts > 1][0])} times; "
                "an epoch holds each slot once"
            )
        pos = SF.integer(state, "pos", where, hi=len(perm))
        epoch = SF.integer(state, "epoch", where)
        self.perm, self.perm_ordinal = perm.clone(), perm_ordinal.clone()
        self.pos, self.epoch = pos, epoch
        # what the epoch still holds that is no longer the item it drew
        rest, drawn = self.perm[self.pos :], self.perm_ordinal[self.pos :]
        gone = rest[~(self.slots.live[rest] & (self.slots.ordinal[rest] == drawn))]
        self._stale.zero_()
        self._stale[gone] = True
        self._any_stale = bool(len(gone))

    def info(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "epoch": self.epoch,
            "epoch_position": self.pos,
            "epoch_size": len(self.perm),
        }
