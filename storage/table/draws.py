"""Drawing: ``sample`` / ``try_sample``, ``max_times_sampled``, priorities and plain reads."""

from __future__ import annotations

import operator
from typing import Any

import torch
from tensordict import TensorDictBase, is_tensorclass

from tdreplay.codec.indices import slot_tensor
from tdreplay.codec.params import check_lengths
from tdreplay.codec.priorities import priorities
from tdreplay.codec.protocol import MAX_WEIGHT

from ..backends.tensor import SMALL_BATCH
from ..errors import InvalidRequest
from ..samplers import no_priorities
from ..tensordicts import nest, nest_by
from ..validation import SampleTarget
from .base import TableBase, _HeldBack

_INDEX, _TIMES, _KEY = ("index",), ("sample_info", "times_sampled"), ("sample_info", "key")
_PRIORITY, _WEIGHT = ("sample_info", "priority"), ("sample_info", "weight")
_ONE = torch.ones((), dtype=torch.int64)


def _ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.float32)


class Draws(TableBase):
    """The sampling and reading operations of :class:`~.table.Table`."""

    # ------------------------------------------------------------ sample
    def can_sample(self, n: int = 1) -> bool:
        """Whether a sample of ``n`` items would proceed now, without waiting."""
        with self._cond:
            return self._sample_ready(n)

    def _draw(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """``n`` slots, their weights and (a weighted sampler's) what each weight was divided
        by, ``max_weight``; capped by ``max_times_sampled``. Lock held."""
        index, weight = self.sampler.sample(n)
        scale = None
        if self.sampler.weighted:
            scale = torch.full((n,), self.sampler.max_weight(), dtype=torch.float64)
        if self._cap_times:
            index, weight = self._cap_times_sampled(index, weight, scale)
        return index, weight, scale

    def _cap_times_sampled(
        self, index: torch.Tensor, weight: torch.Tensor | None, scale: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Redraw the draws that would return an item more than ``max_times_sampled`` times.

        Reverb samples a batch item by item and removes an item the moment it
        reaches ``max_times_sampled``; a batch drawn at once, with replacement,
        must not return it more often. Items that reach the limit are removed
        here so the redraws cannot pick them; :meth:`_samples_left` made sure
        enough samples remain. A redrawn weight is normalised as the sampler stands
        after the removal: its ``scale`` (``max_weight``) is updated in place. Lock held.
        """
        s, limit = self.slots, self.max_times_sampled
        while True:
            order = torch.argsort(index, stable=True)
            uniq, counts = torch.unique_consecutive(index[order], return_counts=True)
            starts = torch.cumsum(counts, 0) - counts
            rank = torch.empty_like(index)  # how many earlier draws picked the same item
            rank[order] = torch.arange(len(index)) - torch.repeat_interleave(starts, counts)
            over = (s.times_sampled[index] + rank >= limit).nonzero().squeeze(1)
            if len(over) == 0:
                return index, weight
            spent = uniq[(s.times_sampled[uniq] + counts >= limit) & s.live[uniq]]
            self._remove(spent)
            redrawn, redrawn_weight = self.sampler.sample(len(over))
            index = index.clone()
            index[over] = redrawn
            if weight is not None and redrawn_weight is not None:
                weight[over] = redrawn_weight
            if scale is not None:
                scale[over] = self.sampler.max_weight()

    def check_batch_size(self, batch_size: Any) -> int:
        """``batch_size`` as an int, if a sample of that many items is possible at all.

        Raises:
            InvalidRequest: not an integer in ``[1, capacity]``, or not a multiple
                of the slice sampler's ``slice_len``.
        """
        try:
            n = operator.index(batch_size)  # 2.5 or "8" is an error, not a silent 2 or 8
        except TypeError:
            n = -1
        if n < 1 or n > self.capacity:
            raise InvalidRequest(
                f"table {self.name!r}: batch_size must be an integer in [1, {self.capacity}], got {batch_size!r}",
                table=self.name,
                field="batch_size",
                expected=f"[1, {self.capacity}]",
                got=batch_size,
            )
        self.sampler.check_batch_size(n, self.name)
        return n

    def target(self, out: TensorDictBase, batch_size: int) -> SampleTarget:
        """``out`` and ``batch_size`` checked once for samples of that many items: pass the
        result as ``out=`` to sample into it again and again without checking either.

        Raises:
            InvalidRequest: ``batch_size`` cannot be sampled (:meth:`check_batch_size`),
                or ``out`` does not fit (see :meth:`sample`).
        """
        n = self.check_batch_size(batch_size)
        bufs, info = self._check.out_buffers(out, n)
        return SampleTarget(out, n, bufs, info, self.sampler.weighted)

    def try_sample(
        self, batch_size: int, *, out: TensorDictBase | SampleTarget | None = None
    ) -> TensorDictBase | None:
        """:meth:`sample` if the rate limiter lets it through now, else ``None`` (nothing
        drawn, nothing counted; see :meth:`try_extend`)."""
        try:
            return self._sample(batch_size, None, out, attempt=True)
        except _HeldBack:
            return None

    def sample(
        self,
        batch_size: int,
        *,
        timeout: float | None = None,
        out: TensorDictBase | SampleTarget | None = None,
    ) -> TensorDictBase:
        """Draw ``batch_size`` items.

        Waits while the rate limiter holds samples back (too few items, or
        too few inserts for ``samples_per_insert``). By default (``timeout=None``)
        it waits for good: in-process only another thread's :meth:`extend` (or a
        :meth:`close`) releases it, so a single-threaded script that samples a table
        holding fewer than ``min_size_to_sample`` items never returns. Give
        ``timeout`` there (``0``: raise at once), or ask :meth:`try_sample` (``None``
        when held back) or :meth:`can_sample`. The server and the client wait 30 s
        by default (``--default-timeout``, ``ReplayClient(wait=)``).

        Args:
            batch_size: number of items; for the slice sampler a multiple of ``slice_len``.
            timeout: seconds to wait for the rate limiter; ``None`` (the default) waits as
                long as it takes, for good if nothing else inserts.
            out: a TensorDict of batch ``[batch_size]`` with the schema's keys (and
                optionally the sample-info keys) to gather into instead of
                allocating; e.g. a previous batch. Or a :meth:`target` made of one,
                checked once for every sample into it.

        Returns:
            A TensorDict of batch ``[batch_size]``: every field plus ``index`` and
            ``sample_info`` (see the module docstring).

        Raises:
            InvalidRequest: ``batch_size`` < 1, above capacity, not a multiple of
                ``slice_len``, or ``out`` does not fit.
            RateLimitTimeout: the sample waited ``timeout`` seconds.
            EmptyTableError: the same, and the table held no item when ``timeout`` ran
                out (a :class:`RateLimitTimeout` too).
            TableClosed: the table is closed, or was closed while the sample waited.
        """
        return self._sample(batch_size, timeout, out)

    def _sample(
        self,
        batch_size: int,
        timeout: float | None,
        out: TensorDictBase | SampleTarget | None,
        *,
        attempt: bool = False,
    ) -> TensorDictBase:
        if isinstance(out, SampleTarget):  # its batch size was checked when it was made
            if type(batch_size) is not int or out.rows != batch_size:
                raise InvalidRequest(
                    f"table {self.name!r}: the target is for {out.rows} rows, not {batch_size!r}",
                    table=self.name,
                    field="out",
                    expected=out.rows,
                    got=batch_size,
                )
            n = out.rows
            bufs, out_info, dest = out.bufs, out.info, out.out
        else:
            n = self.check_batch_size(batch_size)
            if out is not None:
                (bufs, out_info), dest = self._check.out_buffers(out, n), out
            else:
                bufs, out_info, dest = None, {}, None
        with self._cond:
            if self.rate_limiter.sample_never_fits(n):
                raise InvalidRequest(
                    f"table {self.name!r}: a sample of {n} items can never pass the rate limiter "
                    f"(error_buffer {self.rate_limiter.error_buffer}); sample smaller batches",
                    table=self.name,
                    field="batch_size",
                )
            self._admit("sample", n, lambda: self._sample_ready(n), timeout, attempt=attempt)
            index, weight, scale = self._draw(n)
            s = self.slots
            # a few items into a target: counted, and their rows copied, one by one
            small = out if n <= SMALL_BATCH and isinstance(out, SampleTarget) else None
            rows = index.tolist() if small is not None else []
            words = small.words if small is not None else None
            if words is not None:
                times = keys = None
                s.count_drawn(rows, words)
            else:
                s.times_sampled.index_put_((index,), _ONE, accumulate=True)
                # read straight into the caller's buffers where it has them: a torch call less
                times = torch.index_select(s.times_sampled, 0, index, out=out_info.get(_TIMES))
                keys = torch.index_select(s.ordinal, 0, index, out=out_info.get(_KEY))
            priority = self.sampler.priority(index)
            if self.sampler.consumes:
                # queues and stacks return distinct live items, each now spent
                self._remove(index)
            elif self.max_times_sampled:
                if times is None:
                    times = out_info[_TIMES]
                done = torch.unique(index[times >= self.max_times_sampled])
                done = done[s.live[done]]
                if len(done):
                    self._remove(done)
            self.rate_limiter.sampled(n)
            self.bytes_out += n * self._item_nbytes
            self._persist()
            self._notify()  # before the read lock: nothing between it and the try below
            # Take the read lock before letting go of the table lock: slots just
            # evicted cannot be overwritten until the gather below is done.
            self._data_lock.acquire_read()
        try:
            if bufs is None:  # in the try: a failed allocation must let go of the rows too
                bufs = self.backend.empty(n)
            if small is not None:
                self.backend.gather_rows(rows, bufs, small.row_bytes)
            else:
                self.backend.gather(index, bufs)
        finally:
            self._data_lock.release_read()
        if words is not None:  # index, times and keys are in place
            words.put_weights(priority, weight, scale)
            return dest
        # a sampler without priorities or weights: every item's is 1
        info = {_INDEX: index, _PRIORITY: priority, _WEIGHT: weight, _TIMES: times, _KEY: keys}
        if scale is not None:
            info[MAX_WEIGHT] = scale
        if dest is not None:
            target = dest._tensordict if is_tensorclass(dest) else dest
            for key, value in info.items():
                buf = out_info.get(key)
                if buf is None:
                    target.set(key, _ones(n) if value is None else value)
                elif value is None:
                    buf.fill_(1.0)
                elif value is not buf:
                    buf.copy_(value)
            return dest
        bufs.update({k: _ones(n) if v is None else v for k, v in info.items()})
        # nest() with the key tree worked out once, in __init__
        return nest_by(self._batch_tree, bufs, torch.Size([n]))

    # ------------------------------------------------------------ priorities
    def update_priority(self, index: Any, priority: Any, *, key: Any = None) -> int:
        """Set the priorities of slots ``index`` (from ``batch["index"]``).

        Slots removed since they were sampled are skipped. Without ``key`` a
        slot overwritten since then is not told apart: the update applies to
        the item now in it. With ``key`` (from ``batch["sample_info", "key"]``)
        only slots whose item still has that key are updated; the others, whose
        items were overwritten, are skipped.

        Args:
            index: the slots, int64 ``[N]``.
            priority: their new priorities, ``[N]`` (finite, >= 0).
            key: the sampled items' keys, int64 ``[N]``; ``None``: no check.

        Returns:
            How many priorities were applied (``N`` less the skipped slots).

        Raises:
            InvalidRequest: the sampler has no priorities, the lengths differ, an
                index is out of range, a key is not an integer, or a priority is
                negative or not finite. Nothing is updated; the error names the table.
        """
        if not self.sampler.has_priorities:
            raise no_priorities(self.name, self.sampler.kind)
        index = self._slots_of(index)
        # the one rule of a priority
        priority = priorities(priority, f"table {self.name!r}", table=self.name)
        check_lengths(index, priority=priority, table=self.name)
        key = self._keys_of(index, key)
        with self._cond:
            updated = self.sampler.update_priority(index, priority, key)
            self._persist()
            self._notify()
        return updated

    def _slots_of(self, index: Any) -> torch.Tensor:
        """``index`` as int64 slots ``[N]``.

        Raises:
            InvalidRequest: an index not an integer, or outside ``[0, capacity)``.
        """
        return slot_tensor(index, "index", self.name, end=self.capacity)

    def _keys_of(self, index: torch.Tensor, key: Any) -> torch.Tensor | None:
        """``key`` (the sampled items' keys, one per slot of ``index``) as int64, checked.

        Raises:
            InvalidRequest: the keys are not integers, or not one per slot.
        """
        if key is None:
            return None
        key = slot_tensor(key, "key", self.name)
        check_lengths(index, key=key, table=self.name)
        return key

    def remove(self, index: Any, *, key: Any = None) -> int:
        """Remove the items in slots ``index`` (Reverb's ``mutate_priorities(deletes=...)``).

        As :meth:`update_priority`: slots removed since are skipped, and with ``key``
        (``batch["sample_info", "key"]``) a slot whose item was overwritten since the
        sample keeps its new item. A removed item is never sampled again; its slot is
        written again in the writer's turn.

        Returns:
            How many items were removed.

        Raises:
            InvalidRequest: an index outside ``[0, capacity)``, or bad keys. Nothing is removed.
        """
        index = self._slots_of(index)
        key = self._keys_of(index, key)
        with self._cond:
            self._check_open()
            s = self.slots  # the client's slots: none past hi is read (a hole there)
            held = s.at(s.live, index)
            if key is not None:
                held &= s.at(s.ordinal, index) == key
            doomed = torch.unique(index[held])
            if len(doomed):
                self._remove(doomed)
                self._persist()
                self._notify()
        return len(doomed)

    def live_index(self) -> torch.Tensor:
        """Slots of the live items, oldest first (insertion order)."""
        with self._cond:
            live = self.slots.live[: self.slots.hi].nonzero().squeeze(1)
            return live[torch.argsort(self.slots.ordinal[live])]

    def read(self, index: torch.Tensor) -> TensorDictBase:
        """The items in slots ``index`` (no sample info, no counters moved).

        Raises:
            InvalidRequest: an index is outside ``[0, capacity)``.
            TableClosed: the table is closed.
        """
        index = self._slots_of(index)
        self._check_open()
        return self._rows(index)

    def _rows(self, index: torch.Tensor) -> TensorDictBase:
        """Rows ``index`` (checked slots) of every field, as a TensorDict."""
        with self._data_lock.read():
            bufs = self.backend.read(index)
        return nest(bufs, len(index))

    def read_items(self, index: Any) -> TensorDictBase:
        """The items in slots ``index`` (:meth:`read`), each slot holding one: a slot never
        written, or emptied since, is an error rather than zeros. Checked and read under
        the table's lock, so no slot is emptied in between.

        Raises:
            InvalidRequest: an index outside ``[0, capacity)`` or holding no item.
        """
        index = self._slots_of(index)
        with self._cond:
            self._check_open()
            held = self.slots.at(self.slots.live, index)  # none past hi read (a hole there)
            if not bool(held.all()):
                bad = int(index[~held][0])
                raise InvalidRequest(
                    f"table {self.name!r}: slot {bad} holds no item (the table holds "
                    f"{self.size} items in {self.capacity} slots)",
                    table=self.name,
                    field="index",
                    got=bad,
                )
            return self._rows(index)
