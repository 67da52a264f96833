"""Fixed-length sequences inside episodes.

A slot ``s`` is a *valid start* when the ``slice_len`` slots from ``s`` on
(ring order) are live, hold consecutive inserts, and belong to one episode.
Validity is kept up to date on every insert and removal for just the starts
whose window the change touches (O(items * slice_len)), so a sample never
rescans the table: it draws starts uniformly among the valid ones.

A sample of ``batch_size`` items is ``batch_size // slice_len`` slices laid
end to end, as TorchRL's ``SliceSampler`` returns them:
``batch.reshape(-1, slice_len)`` gives one slice per row.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidRequest
from .base import Sampler, draw_masked


class SliceSampler(Sampler):
    kind = "slice"
    needs_episodes = True

    def __init__(self, slots, generator=None, *, slice_len: int) -> None:
        super().__init__(slots, generator)
        self.slice_len = slice_len
        cap = slots.capacity
        self.episode = torch.full((cap,), -1, dtype=torch.int64)
        self.valid = torch.zeros(cap, dtype=torch.bool)
        self.n_valid = 0
        self._offsets = torch.arange(slice_len, dtype=torch.int64)

    def _refresh(self, index: torch.Tensor) -> None:
        """Recompute validity of every start whose window contains a slot of ``index``."""
        cap = self.slots.capacity
        starts = torch.unique((index[:, None] - self._offsets) % cap)
        window = (starts[:, None] + self._offsets) % cap
        s = self.slots
        seq0 = s.seq[starts]
        ok = (
            s.live[window].all(1)
            & (s.seq[window] == seq0[:, None] + self._offsets).all(1)
            & (self.episode[window] == self.episode[starts][:, None]).all(1)
            & (seq0 >= 0)
        )
        self.n_valid += int(ok.sum()) - int(self.valid[starts].sum())
        self.valid[starts] = ok

    def on_insert(self, index: torch.Tensor, episode: torch.Tensor | None = None) -> None:
        assert episode is not None, "the slice sampler needs episode ids"
        self.episode[index] = episode
        self._refresh(index)

    def on_remove(self, index: torch.Tensor) -> None:
        self._refresh(index)

    def ready(self, n: int) -> bool:
        return self.n_valid > 0

    def check_batch_size(self, n: int) -> None:
        if n % self.slice_len:
            raise InvalidRequest(
                f"batch size {n} is not a multiple of slice_len {self.slice_len}",
                field="batch_size",
                expected=f"a multiple of {self.slice_len}",
                got=n,
            )

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.check_batch_size(n)
        starts = draw_masked(
            self.valid, self.n_valid, self.slots.hi, n // self.slice_len, self.generator
        )
        idx = (starts[:, None] + self._offsets) % self.slots.capacity
        return idx.reshape(-1), None

    def state_dict(self) -> dict[str, Any]:
        return {"episode": self.episode.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.episode.copy_(state["episode"])
        self.valid.zero_()
        self.n_valid = 0
        written = (self.slots.seq >= 0).nonzero().squeeze(1)
        if len(written):
            self._refresh(written)

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "slice_len": self.slice_len, "valid_starts": self.n_valid}
