"""Fixed-length sequences inside episodes.

A slot ``s`` is a *valid start* when the ``slice_len`` slots from ``s`` on
(ring order) are live, hold consecutive inserts, and belong to one episode.
A *trajectory* is a maximal run of such linked slots (an episode, or what is
left of it); the valid starts of one that holds a slice are the first
``length - slice_len + 1`` of its slots. A sample draws as TorchRL's
``SliceSampler`` (``strict_length=True``, no ``span``) does: a trajectory
uniformly among those that hold a slice, then a start uniformly inside it, so a
short episode is drawn as often as a long one.

Validity is kept up to date on every insert and removal for just the starts
whose window the change touches (O(items * slice_len)), and with it the
*edges* of each trajectory's valid starts (its first, the head, and its last,
the tail), so a sample never rescans the table: it picks the ``j``-th head
and its tail by rank in slot order (:class:`~.ranks.CountedMask`), so that
the draw depends on the table's contents and the generator alone.

A sample of ``batch_size`` items is ``batch_size // slice_len`` slices laid
end to end, as TorchRL's ``SliceSampler`` returns them:
``batch.reshape(-1, slice_len)`` gives one slice per row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import InvalidRequest
from .base import Sampler
from .ranks import CountedMask


class SliceSampler(Sampler):
    kind = "slice"
    needs_episodes = True

    def __init__(self, slots, generator=None, *, slice_len: int) -> None:
        super().__init__(slots, generator)
        self.slice_len = slice_len
        cap = slots.capacity
        self.episode = torch.zeros(cap, dtype=torch.int64)
        self.valid = torch.zeros(cap, dtype=torch.bool)
        self.n_valid = 0
        self._offsets = torch.arange(slice_len, dtype=torch.int64)
        self._np_offsets = self._offsets.numpy()
        #: each trajectory's first valid start ``s`` (entry ``2s``) and last (``2s + 1``)
        self.edges = CountedMask(2 * cap)
        self._wraps = False

    def _refresh(self, index: torch.Tensor) -> None:
        """Recompute validity of every start whose window contains a slot of ``index``."""
        if len(index) and self._refresh_run(index):
            return
        cap = self.slots.capacity
        starts = torch.unique((index[:, None] - self._offsets) % cap)
        window = (starts[:, None] + self._offsets) % cap
        s = self.slots  # windows may reach past the written slots: read up to them only
        first = s.at(s.ordinal, starts)
        ok = (
            s.at(s.live, window.reshape(-1)).reshape(window.shape).all(1)
            & (
                s.at(s.ordinal, window.reshape(-1)).reshape(window.shape)
                == first[:, None] + self._offsets
            ).all(1)
            & (
                s.at(self.episode, window.reshape(-1)).reshape(window.shape)
                == s.at(self.episode, starts)[:, None]
            ).all(1)
            & (first > 0)
        )
        self.n_valid += int(ok.sum()) - int(self.valid[starts].sum())
        self.valid[starts] = ok
        self._edges(starts)

    def _refresh_run(self, index: torch.Tensor) -> bool:
        """:meth:`_refresh` for a run of consecutive slots (ring order), as inserts and
        evictions come; ``False`` (nothing done) for any other ``index``.

        The starts to recompute are then a run too, and their windows overlap
        one span of slots: a start is valid when its slot holds an item and the
        ``slice_len - 1`` links after it all hold (next slot live, next insert,
        same episode), counted with a cumulative sum over the span's links
        instead of gathering a ``[starts, slice_len]`` window.
        """
        cap, length, n = self.slots.capacity, self.slice_len, len(index)
        m = n + length - 1  # starts whose window holds a slot of the run
        size = m + length - 1  # the slots those windows cover
        if size > cap or not self._is_run(index):
            return False
        first = int(index[0]) - (length - 1)
        if first >= 0 and first + size <= cap:
            span: slice | torch.Tensor = slice(first, first + size)
            starts: slice | torch.Tensor = slice(first, first + m)
        else:
            span = torch.arange(first, first + size, dtype=torch.int64) % cap
            starts = span[:m]
        s = self.slots
        # the span reaches past the written slots (and round the ring): read up to them only
        live, ordinal, episode = s.at(s.live, span), s.at(s.ordinal, span), s.at(self.episode, span)
        link = live[1:] & (ordinal[1:] - ordinal[:-1] == 1) & (episode[1:] == episode[:-1])
        links = torch.zeros(size, dtype=torch.int64)
        torch.cumsum(link, 0, out=links[1:])
        ok = live[:m] & (ordinal[:m] > 0) & (links[length - 1 :] - links[:m] == length - 1)
        self.n_valid += int(ok.sum()) - int(self.valid[starts].sum())
        self.valid[starts] = ok
        self._edges(starts)
        return True

    def _edges(self, starts: slice | torch.Tensor) -> None:
        """Recompute the heads and tails a change of ``valid[starts]`` may have moved.

        A valid start continues into the next slot when that one is a valid
        start too and the two slots are linked (next insert, same episode: for
        ``slice_len > 1`` both being valid implies it). A head is a valid start
        no valid start continues into; a tail one that continues into none.
        Only the starts changed and their two neighbours can change role.
        """
        at, head, tail = self._roles(starts)
        both = torch.stack([head, tail], 1).reshape(-1)
        if isinstance(at, slice):
            self.edges.assign(slice(2 * at.start, 2 * at.stop), both)
        else:
            self.edges.assign(torch.stack([2 * at, 2 * at + 1], 1).reshape(-1), both)
        # A trajectory wraps from the last slot to slot 0 when slot 0 is a valid start
        # but no head. Then its tail is the first edge in slot order and its head the
        # last; in every other case the edges alternate head, tail, head, ...
        self._wraps = bool(self.valid[0]) and not bool(self.edges.mask[0])

    def _roles(
        self, starts: slice | torch.Tensor
    ) -> tuple[slice | torch.Tensor, torch.Tensor, torch.Tensor]:
        """The starts ``at`` around ``starts`` and whether each is a head, a tail."""
        cap, s = self.slots.capacity, self.slots
        if isinstance(starts, slice) and starts.start >= 2 and starts.stop + 2 <= cap:
            span = slice(starts.start - 2, starts.stop + 2)
            valid, ordinal, episode = (
                self.valid[span],
                s.at(s.ordinal, span),
                s.at(self.episode, span),
            )
            cont = (
                valid[:-1]
                & valid[1:]
                & (ordinal[1:] - ordinal[:-1] == 1)
                & (episode[1:] == episode[:-1])
            )
            at: slice | torch.Tensor = slice(starts.start - 1, starts.stop + 1)
            head, tail = valid[1:-1] & ~cont[:-1], valid[1:-1] & ~cont[1:]
        else:
            if isinstance(starts, slice):
                starts = torch.arange(starts.start, starts.stop, dtype=torch.int64)
            pos = torch.unique(torch.cat([starts - 1, starts, starts + 1]) % cap)
            before, after = (pos - 1) % cap, (pos + 1) % cap
            valid, ordinal, episode = self.valid[pos], s.at(s.ordinal, pos), s.at(self.episode, pos)
            into = (
                self.valid[before]
                & (ordinal - s.at(s.ordinal, before) == 1)
                & (episode == s.at(self.episode, before))
            )
            onto = (
                self.valid[after]
                & (s.at(s.ordinal, after) - ordinal == 1)
                & (s.at(self.episode, after) == episode)
            )
            at, head, tail = pos, valid & ~into, valid & ~onto
        return at, head, tail

    def _is_run(self, index: torch.Tensor) -> bool:
        """Whether ``index`` is consecutive slots in ring order."""
        cap = self.slots.capacity
        return len(index) < 2 or bool(((index[1:] - index[:-1]) % cap == 1).all())

    def _run_starts(self, index: torch.Tensor) -> slice | torch.Tensor | None:
        """The starts whose window holds a slot of ``index`` when it is a run; else ``None``."""
        cap, length = self.slots.capacity, self.slice_len
        m = len(index) + length - 1
        if m > cap or not self._is_run(index):
            return None
        first = int(index[0]) - (length - 1)
        if first >= 0 and first + m <= cap:
            return slice(first, first + m)
        return torch.arange(first, first + m, dtype=torch.int64) % cap

    def columns(self) -> dict[str, torch.Tensor]:
        return {"sampler.episode": self.episode}

    def before_live(self, index: torch.Tensor, episode: torch.Tensor | None) -> None:
        assert episode is not None, "the slice sampler needs episode ids"
        self.episode[index] = episode

    def on_insert(self, index: torch.Tensor, episode: torch.Tensor | None = None) -> None:
        self.before_live(index, episode)
        self._refresh(index)

    def on_remove(self, index: torch.Tensor) -> None:
        # The slots are no longer live, so every start whose window holds one
        # is invalid: what _refresh would find, without looking at the windows.
        if not len(index):
            return
        starts = self._run_starts(index)
        if starts is None:
            starts = torch.unique((index[:, None] - self._offsets) % self.slots.capacity)
        self.n_valid -= int(self.valid[starts].sum())
        self.valid[starts] = False
        self._edges(starts)

    def ready(self, n: int) -> bool:
        return self.n_valid > 0

    def check_batch_size(self, n: int, table: str) -> None:
        if n % self.slice_len:
            raise InvalidRequest(
                f"table {table!r}: batch size {n} is not a multiple of slice_len {self.slice_len}",
                table=table,
                field="batch_size",
                expected=f"a multiple of {self.slice_len}",
                got=n,
            )

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        # n is a multiple of slice_len: the table checked it (check_batch_size)
        cap, m, k = self.slots.capacity, self.edges.count // 2, n // self.slice_len
        g = self.generator
        rank = 2 * torch.randint(m, (k,), generator=g).numpy() + int(self._wraps)
        u = torch.rand(k, dtype=torch.float64, generator=g).numpy()
        edge = self.edges.select(np.concatenate([rank, (rank + 1) % (2 * m)])) // 2
        head = edge[:k]
        span = (edge[k:] - head) % cap  # the trajectory's valid starts, less one
        starts = head + np.minimum((u * (span + 1)).astype(np.int64), span)
        idx = (starts[:, None] + self._np_offsets) % cap
        return torch.from_numpy(idx.reshape(-1)), None

    def state_dict(self) -> dict[str, Any]:
        return {"episode": self.slots.written(self.episode)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        episode = self.slots.loaded(state, "episode", "sampler", self.episode)
        self.slots.load_written(self.episode, episode)
        self.valid.zero_()
        self.n_valid = 0
        self.edges.clear()
        self._wraps = False
        hi = self.slots.hi  # past it nothing was written (nor is read)
        written = (self.slots.ordinal[:hi] > 0).nonzero().squeeze(1)
        if len(written):
            self._refresh(written)

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind, "slice_len": self.slice_len, "valid_starts": self.n_valid}
