"""A vectorized sum-tree (with a min-tree beside it) in plain torch.

TorchRL's ``PrioritizedSampler`` needs a C++ extension that does not load with
every torch release; this one needs nothing but torch. Updates and draws are
batched, a few torch ops per tree level, so both are O(batch * log capacity).

The tree is ``BRANCHING``-ary rather than binary: every torch op costs a few
microseconds however small its input, so the number of levels, not the work
per level, sets the price. Its top level holds up to ``BRANCHING**2`` nodes,
searched in one go: a million leaves take 3 levels where a binary tree takes
20, ten thousand take 2.

    >>> t = SumTree(4)
    >>> t.set(torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 0.0, 3.0, 0.0], dtype=torch.float64))
    >>> t.total(), t.min()
    (4.0, 1.0)
    >>> t.find(torch.tensor([0.5, 1.5, 3.9], dtype=torch.float64)).tolist()
    [0, 2, 2]
"""

from __future__ import annotations

import torch

BRANCHING = 32


class SumTree:
    """Sums (and minimums of the positive values) over ``capacity`` float64 leaves.

    Attributes:
        sums: every node's sum, level by level from the leaves up (one tensor).
        mins: every node's minimum over its positive leaves (``inf`` if none).
    """

    def __init__(self, capacity: int, branching: int = BRANCHING) -> None:
        self.capacity = capacity
        self.k = k = branching
        sizes = []  # nodes per level, leaves first; each below the top a multiple of k
        n = capacity
        while n > k * k:
            n = -(-n // k) * k
            sizes.append(n)
            n //= k
        sizes.append(n)
        self.depth = len(sizes)
        self.sums = torch.zeros(sum(sizes), dtype=torch.float64)
        self.mins = torch.full((sum(sizes),), float("inf"), dtype=torch.float64)
        starts = [sum(sizes[:i]) for i in range(len(sizes))]
        #: per level, leaves first: views into ``sums`` / ``mins``
        self._sums = [self.sums[s : s + n] for s, n in zip(starts, sizes, strict=True)]
        self._mins = [self.mins[s : s + n] for s, n in zip(starts, sizes, strict=True)]
        self._total = 0.0
        self._min = float("inf")

    def set(self, index: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves ``index`` to ``values`` (0 removes a leaf from sampling)."""
        k = self.k
        self._sums[0][index] = values
        self._mins[0][index] = torch.where(values > 0, values, float("inf"))
        # Parents are recomputed from their children level by level. Duplicate
        # parents all compute the same value, so no de-duplication is needed.
        node = index
        for level in range(1, self.depth):
            node = node // k
            below_sums = self._sums[level - 1].view(-1, k)
            below_mins = self._mins[level - 1].view(-1, k)
            self._sums[level][node] = below_sums.index_select(0, node).sum(1)
            self._mins[level][node] = below_mins.index_select(0, node).amin(1)
        self._total = float(self._sums[-1].sum())
        self._min = float(self._mins[-1].min())

    def get(self, index: torch.Tensor) -> torch.Tensor:
        return self._sums[0][index]

    def total(self) -> float:
        return self._total

    def min(self) -> float:
        return self._min

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """Leaves where the cumulative sum first exceeds each of ``mass``."""
        k = self.k
        top = self._sums[-1]
        cum = top.cumsum(0)
        # the first node whose running sum exceeds the mass (the last on rounding)
        node = torch.searchsorted(cum, mass, right=True).clamp_(max=len(top) - 1)
        mass = (mass - (cum - top).index_select(0, node)).reshape(-1, 1)
        for level in range(self.depth - 2, -1, -1):
            children = self._sums[level].view(-1, k).index_select(0, node)  # [n, k]
            cum = children.cumsum(1)
            # the first child whose running sum exceeds the mass (the last on rounding)
            child = torch.searchsorted(cum, mass, right=True).clamp_(max=k - 1)
            mass = mass - (cum - children).gather(1, child)
            node = node * k + child.squeeze(1)
        return node

    def rebuild(self, leaves: torch.Tensor) -> None:
        """Set every leaf at once (``leaves`` has ``capacity`` values)."""
        k = self.k
        self.sums.zero_()
        self.mins.fill_(float("inf"))
        self._sums[0][: self.capacity] = leaves
        self._mins[0][: self.capacity] = torch.where(leaves > 0, leaves, float("inf"))
        for level in range(1, self.depth):
            n = len(self._sums[level - 1]) // k
            self._sums[level][:n] = self._sums[level - 1].view(-1, k).sum(1)
            self._mins[level][:n] = self._mins[level - 1].view(-1, k).amin(1)
        self._total = float(self._sums[-1].sum())
        self._min = float(self._mins[-1].min())
