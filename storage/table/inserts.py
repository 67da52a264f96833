"""Inserting: ``extend`` / ``try_extend`` and the episode bookkeeping of trajectory samplers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from tdreplay.codec.priorities import priorities

from ..errors import InvalidRequest
from ..samplers import no_priorities
from ..spec import NestedKey, join_key
from .base import TableBase, _HeldBack


class Inserts(TableBase):
    """The insert operations of :class:`~.table.Table`."""

    # ------------------------------------------------------------ extend
    def tagged(self, limit: int = 10_000) -> dict[int, torch.Tensor]:
        """The slots of live items by the (nonzero) tag of the insert that wrote them, for
        the ``limit`` most recent tags (see :meth:`Slots.tagged
        <tdreplay.storage.slots.Slots.tagged>`)."""
        with self._cond:
            return self.slots.tagged(limit)

    def can_insert(self, n: int = 1) -> bool:
        """Whether an insert of ``n`` items would proceed now, without waiting."""
        with self._cond:
            return self.rate_limiter.can_insert(n, self.slots.n_live) and self.writer.can_claim(n)

    def try_extend(
        self, td: Any, *, priority: torch.Tensor | None = None, tag: int = 0
    ) -> torch.Tensor | None:
        """:meth:`extend` if the rate limiter lets it through now, else ``None`` (nothing
        written, nothing counted). For callers that wait their own way: a server
        waiting asynchronously tries again as the table changes (:meth:`add_listener`),
        counting its wait with :meth:`begin_wait` / :meth:`end_wait`."""
        try:
            return self._extend(td, priority, None, tag, attempt=True)
        except _HeldBack:
            return None

    def extend(
        self,
        td: Any,
        *,
        timeout: float | None = None,
        priority: torch.Tensor | None = None,
        tag: int = 0,
    ) -> torch.Tensor:
        """Insert the rows of ``td``: a TensorDict or tensorclass of batch ``[N]``, or its
        flat columns ``{nested key: tensor [N, *shape]}`` (no nesting needed: a server
        hands over decoded columns as they are).

        Waits while the rate limiter (or a full queue/stack) holds inserts back; by
        default (``timeout=None``) for good, until another thread samples (see
        :meth:`sample`).

        Args:
            td: the items; exactly the schema's keys, shapes and dtypes.
            timeout: seconds to wait for the rate limiter; ``None`` (the default) waits as
                long as it takes.
            priority: initial priorities (prioritized sampler only; default: its initial priority).
            tag: a nonzero int64 naming this insert (e.g. a hash of the client's request
                id), kept with each item, durably for memmap tables: ``tagged()``
                answers which live items an insert wrote, after a restart too.

        Returns:
            The slot of each row, int64 ``[N]`` in the order of ``td``'s rows; ``-1`` for a
            row the max-value writer dropped (below the table's minimum), as TorchRL's
            ``TensorDictMaxValueWriter`` answers.

        Raises:
            SchemaError: a key is missing or extra, or a shape, dtype or the batch dims are wrong.
                Nothing is written and no counter moves.
            InvalidRequest: ``N`` is 0 or above capacity, or could never pass the rate limiter.
            RateLimitTimeout: the insert waited ``timeout`` seconds.
            TableClosed: the table is closed, or was closed while the insert waited.
            BackendError: the storage failed to write.
        """
        return self._extend(td, priority, timeout, tag)

    def check_insert(self, td: Any, *, priority: Any = None) -> int:
        """Check an insert of ``td`` (and its initial ``priority``, one per row or one for
        all) as :meth:`extend` would, writing nothing; returns its rows. What checks several
        tables before inserting the same rows into each (nothing goes in if one refuses).

        Raises:
            SchemaError, InvalidRequest: as :meth:`extend`'s.
        """
        return self._checked(td, priority)[1]

    def _checked(
        self, td: Any, priority: Any
    ) -> tuple[Any, int, torch.Tensor | None, torch.Tensor | None]:
        """``td``'s rows checked: the data, its row count, the priorities (one per row) and
        the max-value writer's values."""
        data, n = self._check.rows(td)
        if priority is not None:
            if not self.sampler.has_priorities:
                raise no_priorities(self.name, self.sampler.kind)
            priority = priorities(priority, f"table {self.name!r}", table=self.name)
            if len(priority) == 1 and n != 1:
                priority = priority.expand(n)
            if len(priority) != n:
                raise InvalidRequest(
                    f"table {self.name!r}: {len(priority)} priorities for {n} rows",
                    table=self.name,
                    field="priority",
                    expected=n,
                    got=len(priority),
                )
        values = data[self._value_key] if self._value_key else None
        if values is not None and bool(torch.isnan(values).any()):
            # a NaN would outrank every value and never leave the table
            key = join_key(self._value_key or ())
            raise InvalidRequest(
                f"table {self.name!r}: key {key!r} holds NaN; the max_value writer ranks items by it",
                table=self.name,
                field=key,
                expected="a number",
                got="nan",
            )
        return data, n, priority, values

    def _extend(
        self,
        td: Any,
        priority: torch.Tensor | None,
        timeout: float | None,
        tag: int = 0,
        *,
        attempt: bool = False,
    ) -> torch.Tensor:
        data, n, priority, values = self._checked(td, priority)
        with self._cond:
            if self.rate_limiter.insert_never_fits(n):
                raise InvalidRequest(
                    f"table {self.name!r}: an insert of {n} items can never pass the rate limiter "
                    f"(samples_per_insert {self.rate_limiter.samples_per_insert}, error_buffer "
                    f"{self.rate_limiter.error_buffer}); send smaller chunks",
                    table=self.name,
                    field="batch_size",
                )
            self._admit(
                "insert",
                n,
                lambda: (
                    self.rate_limiter.can_insert(n, self.slots.n_live) and self.writer.can_claim(n)
                ),
                timeout,
                attempt=attempt,
            )
            # Disk for the rows before anything changes: a full disk is a 507 here, with
            # no slot claimed, nothing evicted, no episode id used (a no-op once reserved).
            self.backend.reserve(self.writer.reach(n))
            # episode ids once admitted: a call held back must not use any up
            episode = self._episodes(data, n) if self.sampler.needs_episodes else None
            claim = self.writer.claim(n, values)
            index = claim.index
            k = len(index)
            if k == 0:  # nothing inserted; episode ids may be used up all the same
                self._notify()
                return _per_row(index, claim.rows, n)
            # A slice target (a contiguous run) makes the slot updates views, not gathers.
            target = claim.target
            evicted = index[self.slots.live[target]]
            if len(evicted):
                self._remove(evicted)
            self.slots.busy[target] = True
            ordinal = torch.arange(
                self.slots.inserted + 1, self.slots.inserted + k + 1, dtype=torch.int64
            )
            self.slots.inserted += k
        if claim.rows is not None:
            data = {key: v.index_select(0, claim.rows) for key, v in data.items()}
            if episode is not None:
                episode = episode[claim.rows]
            if priority is not None:
                priority = priority[claim.rows]
        try:
            self._data_lock.acquire_write()
            try:
                for hook in self._before_write:  # e.g. a checkpoint saving the rows' old contents
                    hook(target)
                self.backend.write(target, data)
            finally:
                self._data_lock.release_write()
            if self._fsync:
                self.backend.flush()
        except BaseException:
            with self._cond:  # the slots stay empty; what they held was evicted above
                self.slots.busy[target] = False
                self._notify()
            raise
        with self._cond:
            s = self.slots
            s.busy[target] = False
            # An item's own state first, "live" last (see durable.py): a crash in
            # between leaves the slots empty, never live with a predecessor's state.
            s.ordinal[target] = ordinal
            s.times_sampled[target] = 0
            s.tag[target] = tag
            self.sampler.before_live(index, episode)
            s.live[target] = True
            s.n_live += k
            top = target.stop if isinstance(target, slice) else int(index.max()) + 1
            s.hi = max(s.hi, top)
            self.sampler.on_insert(index, episode)
            if priority is not None:
                self.sampler.update_priority(index, priority)
            self.rate_limiter.inserted(k)
            self.bytes_in += k * self._item_nbytes
            self._persist()
            self._notify()
        return _per_row(index, claim.rows, n)

    def _episodes(self, data: Mapping[NestedKey, torch.Tensor], n: int) -> torch.Tensor:
        """Episode id per item: the trajectory key as given, or counted from end flags (lock held)."""
        if self._traj_key is not None:
            return data[self._traj_key].reshape(n).to(torch.int64)
        assert self._end_key is not None
        ends = data[self._end_key].reshape(n).to(torch.int64)
        base = self.episode_base
        self.episode_base += int(ends.sum())
        return base + torch.cumsum(ends, 0) - ends


def _per_row(index: torch.Tensor, rows: torch.Tensor | None, n: int) -> torch.Tensor:
    """The slot of each of ``n`` rows: ``index`` where the writer kept them all
    (``rows`` is ``None``), else -1 for the rows it dropped."""
    if rows is None:
        return index
    out = torch.full((n,), -1, dtype=torch.int64)
    out[rows] = index
    return out
