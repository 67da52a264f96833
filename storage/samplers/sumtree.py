"""A vectorized sum-tree (with a min-tree beside it) in plain torch.

TorchRL's ``PrioritizedSampler`` needs a C++ extension that does not load with
every torch release; this one needs nothing but torch. Updates and draws are
batched: one torch op per tree level, so both are O(batch * log capacity).

    >>> t = SumTree(4)
    >>> t.set(torch.tensor([0, 1, 2, 3]), torch.tensor([1.0, 0.0, 3.0, 0.0], dtype=torch.float64))
    >>> t.total(), t.min()
    (4.0, 1.0)
    >>> t.find(torch.tensor([0.5, 1.5, 3.9], dtype=torch.float64)).tolist()
    [0, 2, 2]
"""

from __future__ import annotations

import torch


class SumTree:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        size = 1
        while size < capacity:
            size *= 2
        self.size = size  # leaves live at [size, 2*size)
        self.depth = size.bit_length() - 1
        self.sums = torch.zeros(2 * size, dtype=torch.float64)
        self.mins = torch.full((2 * size,), float("inf"), dtype=torch.float64)

    def set(self, index: torch.Tensor, values: torch.Tensor) -> None:
        """Set leaves ``index`` to ``values`` (0 removes a leaf from sampling)."""
        node = index + self.size
        self.sums[node] = values
        self.mins[node] = torch.where(values > 0, values, torch.full_like(values, float("inf")))
        # Parents are recomputed from their children level by level. Duplicate
        # parents all compute the same value, so no de-duplication is needed.
        for _ in range(self.depth):
            node = node // 2
            left, right = 2 * node, 2 * node + 1
            self.sums[node] = self.sums[left] + self.sums[right]
            self.mins[node] = torch.minimum(self.mins[left], self.mins[right])

    def get(self, index: torch.Tensor) -> torch.Tensor:
        return self.sums[index + self.size]

    def total(self) -> float:
        return float(self.sums[1])

    def min(self) -> float:
        return float(self.mins[1])

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """Leaves where the cumulative sum first exceeds each of ``mass``."""
        node = torch.ones_like(mass, dtype=torch.int64)
        mass = mass.clone()
        for _ in range(self.depth):
            left = 2 * node
            left_sum = self.sums[left]
            right = mass >= left_sum
            mass = torch.where(right, mass - left_sum, mass)
            node = left + right.long()
        return node - self.size

    def rebuild(self, leaves: torch.Tensor) -> None:
        """Set every leaf at once (``leaves`` has ``capacity`` values)."""
        self.sums.zero_()
        self.sums[self.size : self.size + self.capacity] = leaves
        self.mins.fill_(float("inf"))
        self.mins[self.size : self.size + self.capacity] = torch.where(
            leaves > 0, leaves, torch.full_like(leaves, float("inf"))
        )
        for level in range(self.depth - 1, -1, -1):
            lo, hi = 2**level, 2 ** (level + 1)
            self.sums[lo:hi] = self.sums[2 * lo : 2 * hi : 2] + self.sums[2 * lo + 1 : 2 * hi : 2]
            self.mins[lo:hi] = torch.minimum(
                self.mins[2 * lo : 2 * hi : 2], self.mins[2 * lo + 1 : 2 * hi : 2]
            )
