"""A boolean mask whose set entries can be picked by rank: the ``r``-th set one.

Counts of set entries are kept per block of ``BLOCK`` entries, per block of
those blocks, and so on until a level holds at most ``TOP`` counts; every
change updates them. Finding the ``r``-th set entry is then a cumulative sum
over the top level and one ``[n, BLOCK]`` scan per level below it (two for
two million entries, three for 60M): a few dozen small array ops, whatever
the mask holds, run in numpy on views of the same memory (a torch op on a
few dozen entries costs about 2 us, a numpy one a fraction of that). Memory is the mask's byte per entry and a counter per
``BLOCK`` entries; a float64 sum tree would take 16 bytes per entry.

    >>> m = CountedMask(10)
    >>> m.assign(torch.tensor([7, 2, 5]), torch.tensor([True, True, True]))
    >>> m.count, m.select(np.array([0, 1, 2])).tolist()
    (3, [2, 5, 7])
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK = 64
TOP = 4096


class CountedMask:
    """Set entries of a ``size``-long boolean mask, countable and selectable by rank.

    Attributes:
        mask: the entries (a ``[size]`` view; change them with :meth:`assign`).
        count: how many are set.
    """

    def __init__(self, size: int) -> None:
        n = -(-size // BLOCK) * BLOCK
        self._bits = torch.zeros(n, dtype=torch.bool)
        self.mask = self._bits[:size]
        #: counts of set entries per BLOCK**(i+1) entries, the lowest level first
        self._levels: list[torch.Tensor] = []
        n //= BLOCK
        while n > TOP:
            n = -(-n // BLOCK) * BLOCK
            self._levels.append(torch.zeros(n, dtype=torch.int64))
            n //= BLOCK
        self._levels.append(torch.zeros(n, dtype=torch.int64))
        self.count = 0
        # numpy views of the same memory, for select
        self._np_bits = self._bits.numpy().reshape(-1, BLOCK)
        self._np_levels = [level.numpy() for level in self._levels]

    def clear(self) -> None:
        """Unset every entry."""
        self._bits.zero_()
        for level in self._levels:
            level.zero_()
        self.count = 0

    def assign(self, index: slice | torch.Tensor, values: torch.Tensor) -> None:
        """Set ``mask[index] = values``; ``index`` is a slice (step 1) or distinct positions."""
        delta = values.to(torch.int64) - self.mask[index].to(torch.int64)
        changed = delta.nonzero().squeeze(1)
        if not len(changed):
            return
        pos = changed + (index.start or 0) if isinstance(index, slice) else index[changed]
        d = delta[changed]
        self.mask[pos] = d > 0
        for level in self._levels:
            pos = pos // BLOCK
            level.index_add_(0, pos, d)
        self.count += int(d.sum())

    def select(self, ranks: np.ndarray) -> np.ndarray:
        """Positions (int64) of the set entries of rank ``ranks`` (0: the lowest set position).

        Every rank must lie in ``[0, count)``.
        """
        top = self._np_levels[-1]
        cum = top.cumsum()
        at = np.searchsorted(cum, ranks, side="right")
        rest = ranks - (cum - top)[at]
        # a row's searchsorted (right) is how many of its cumulative counts are <= the rank
        for level in reversed(self._np_levels[:-1]):
            rows = level.reshape(-1, BLOCK)[at]
            cum = rows.cumsum(1)
            col = (cum <= rest[:, None]).sum(1)
            rest = rest - (cum - rows)[np.arange(len(at)), col]
            at = at * BLOCK + col
        cum = self._np_bits[at].cumsum(1)
        return at * BLOCK + (cum <= rest[:, None]).sum(1)
