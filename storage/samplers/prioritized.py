"""Proportional prioritized replay (Schaul et al., 2016) on a torch sum-tree."""

from __future__ import annotations

from typing import Any

import torch

from .. import statefile as SF
from .base import Sampler
from .sumtree import SumTree


class PrioritizedSampler(Sampler):
    """Samples item ``i`` with probability ``(p_i + eps)^alpha / sum_j (p_j + eps)^alpha``.

    New items get ``initial_priority``, or the largest priority seen so far.
    Importance weights are ``(N * P(i))^-beta`` normalized by the largest
    possible weight, ``(N * P_min)^-beta`` (N: live items), so they lie in (0, 1];
    :meth:`max_weight` is that largest weight (samples carry it per item, so that
    weights drawn from several tables can be normalised over all of them).
    Draws and priority updates cost O(batch * log capacity).

    Args:
        slots: the table's slot state.
        alpha: how strongly priorities skew sampling (0: uniform).
        beta: how strongly importance weights correct for it (1: fully).
        eps: added to every priority so no live item is unreachable.
        initial_priority: priority of new items; ``None``: the running maximum.
    """

    kind = "prioritized"
    has_priorities = True
    weighted = True
    #: new items' priority
    SCALARS = {"max_priority": float}

    def __init__(
        self,
        slots,
        generator=None,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        initial_priority: float | None = None,
    ) -> None:
        super().__init__(slots, generator)
        self.alpha, self.beta, self.eps = alpha, beta, eps
        self.initial_priority = initial_priority
        self.max_priority = initial_priority or 1.0
        self.tree = SumTree(slots.capacity)
        self.priorities = torch.zeros(slots.capacity, dtype=torch.float64)

    def _leaf(self, p: torch.Tensor) -> torch.Tensor:
        return (p + self.eps) ** self.alpha

    def columns(self) -> dict[str, torch.Tensor]:
        return {"sampler.priorities": self.priorities}

    def before_live(self, index: torch.Tensor, episode: torch.Tensor | None) -> None:
        p = self.initial_priority if self.initial_priority is not None else self.max_priority
        self.priorities[index] = p

    def on_insert(self, index: torch.Tensor, episode: torch.Tensor | None = None) -> None:
        self.before_live(index, episode)
        self.tree.set(index, self._leaf(self.priorities[index]))

    def on_remove(self, index: torch.Tensor) -> None:
        self.tree.set(index, torch.zeros(len(index), dtype=torch.float64))

    def ready(self, n: int) -> bool:
        return self.slots.n_live > 0 and self.tree.total() > 0

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        total = self.tree.total()
        mass = torch.rand(n, dtype=torch.float64, generator=self.generator) * total
        idx = self.tree.find(mass)
        leaf = self.tree.get(idx)
        # Rounding can land a draw on an empty leaf at a boundary; redraw those.
        for _ in range(8):
            bad = (leaf <= 0).nonzero().squeeze(1)
            if len(bad) == 0:
                break
            mass = torch.rand(len(bad), dtype=torch.float64, generator=self.generator) * total
            idx[bad] = self.tree.find(mass)
            leaf = self.tree.get(idx)
        prob = leaf / total
        n_live = max(self.slots.n_live, 1)
        weight = ((n_live * prob) ** -self.beta) / self.max_weight()
        return idx, weight.to(torch.float32)

    def max_weight(self) -> float:
        """``(N * P_min)^-beta``: the weight of the least likely live item, before normalising."""
        total = self.tree.total()
        if total <= 0:
            return 1.0
        n_live = max(self.slots.n_live, 1)
        return float((n_live * (self.tree.min() / total)) ** -self.beta)

    def update_priority(
        self, index: torch.Tensor, priority: torch.Tensor, key: torch.Tensor | None = None
    ) -> int:
        # Checked by the table, naming it: slots in range, one finite priority >= 0 (float64)
        # and one key per slot (Table.update_priority; an extend's priorities alike).
        if len(index) == 0:
            return 0
        # Only live slots are updated: removed items are skipped. Without keys
        # an item overwritten since it was sampled cannot be told from its
        # successor; with them, the successor (a new ordinal) is skipped.
        s = self.slots  # the client's slots: none past hi is read (a hole there)
        keep = s.at(s.live, index)
        if key is not None:
            keep &= s.at(s.ordinal, index) == key
        index, priority = index[keep], priority[keep]
        self.priorities[index] = priority
        self.tree.set(index, self._leaf(priority))
        if len(priority):
            self.max_priority = max(self.max_priority, float(priority.max()))
        return len(index)

    def priority(self, index: torch.Tensor) -> torch.Tensor | None:
        return self.priorities[index].to(torch.float32)

    def state_dict(self) -> dict[str, Any]:
        return {"priorities": self.slots.written(self.priorities), **self.scalars()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        priorities = self.slots.loaded(state, "priorities", "sampler", self.priorities)
        if not bool(torch.isfinite(priorities).all()) or bool((priorities < 0).any()):
            raise SF.StateError("sampler.priorities: expected finite priorities >= 0")
        max_priority = SF.number(state, "max_priority", "sampler", finite=True)
        if max_priority < 0:  # new items' priority: a negative one makes the tree's total NaN
            raise SF.StateError(f"sampler.max_priority: expected >= 0, got {max_priority}")
        self.slots.load_written(self.priorities, priorities)
        self.max_priority = max_priority
        n = self.slots.reach()  # past it: no item, a zero leaf (the columns are not read there)
        written = self._leaf(self.priorities[:n])
        leaves = written.new_zeros(len(self.priorities))
        leaves[:n] = torch.where(self.slots.live[:n], written, torch.zeros_like(written))
        self.tree.rebuild(leaves)

    def info(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "alpha": self.alpha,
            "beta": self.beta,
            "max_priority": self.max_priority,
            "total_priority": self.tree.total(),
            "max_weight": self.max_weight(),
        }
