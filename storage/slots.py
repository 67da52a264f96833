"""Per-slot bookkeeping shared by a table's parts.

The table, its writer and its sampler agree on the state of every slot:

* ``live``  — holds an item a sampler may return;
* ``busy``  — claimed by an insert whose data is being copied in (not live yet);
* ``ordinal`` — the item's place in insertion order: 1 for the table's first
  item, ``inserted`` for the newest (0: the slot was never written). It lets
  the slice sampler check contiguity and is the item's key (unique for the
  table's life, checkpoints included) that a sample hands out and
  ``update_priority`` checks;
* ``times_sampled`` — how often the item in the slot was returned;
* ``tag``   — the tag of the insert that wrote the item (a hash of the client's
  request id; 0: none), durable with the rest, so that a server restarted
  after a crash still knows which requests its live items came from (a
  retried extend is then not inserted twice; see :meth:`Slots.tagged`).

A never-written slot's state is zeros in every per-slot tensor (here and in the
samplers' and writers' columns): the durable state files of a memmap table
start as holes and take disk only as slots are written (see
:mod:`tdreplay.storage.durable`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from . import statefile as SF
from .scalars import Scalars

if TYPE_CHECKING:
    from .validation import Words

#: the largest ordinal a table may reach (int64 arithmetic on it stays exact)
MAX_ORDINAL = 1 << 62


class Slots(Scalars):
    #: the item count the ordinals go up to is kept; the live count and the high-water
    #: mark are counted again from ``live`` and ``ordinal`` when a durable table reopens
    SCALARS = {"inserted": int}
    DERIVED = ("n_live", "hi")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.live = torch.zeros(capacity, dtype=torch.bool)
        self.busy = torch.zeros(capacity, dtype=torch.bool)
        # A slot's times_sampled and ordinal side by side: a sample updates the first
        # and reads both, one cache line per slot however large the table.
        self._bind_pairs(torch.zeros((capacity, 2), dtype=torch.int64))
        self.tag = torch.zeros(capacity, dtype=torch.int64)
        self.n_live = 0
        #: slots ``[0, hi)`` have been written at least once
        self.hi = 0
        #: the largest ``hi`` before a load lowered it (see :meth:`reach`)
        self._reached = 0
        #: items inserted in the table's life (the newest item's ordinal)
        self.inserted = 0
        #: :meth:`written` gives views, not copies (see :meth:`viewed`)
        self._viewed = False

    def columns(self) -> dict[str, torch.Tensor]:
        """The per-slot tensors that hold durable state (see :mod:`tdreplay.storage.durable`)."""
        return {"slots.live": self.live, "slots.sampled_ordinal": self.pairs, "slots.tag": self.tag}

    def bind_columns(self, columns: dict[str, torch.Tensor]) -> None:
        """Use ``columns`` (same shapes and dtypes, e.g. memory-mapped) instead of the own tensors."""
        self.live = columns["slots.live"]
        self._bind_pairs(columns["slots.sampled_ordinal"])
        self.tag = columns["slots.tag"]

    def _bind_pairs(self, pairs: torch.Tensor) -> None:
        """``pairs`` and the views over it: ``times_sampled``, ``ordinal``, and ``words``, the
        same memory as one flat int64 memoryview (slot ``r``'s count at ``2 r``, its ordinal
        at ``2 r + 1``: a small sample reads and counts them item by item)."""
        self.pairs = pairs
        self.times_sampled = pairs[:, 0]
        self.ordinal = pairs[:, 1]
        self.words = pairs.numpy().data.cast("B").cast("q")

    def count_drawn(self, rows: list[int], words: Words) -> None:
        """Count a small draw of slots ``rows`` through :attr:`words` (no torch call costs
        less), and write each item's slot, times sampled and key into a target's ``words``
        (:attr:`~tdreplay.storage.validation.SampleTarget.words`)."""
        pairs = self.words
        for r in rows:
            pairs[2 * r] += 1
        index, times, keys = words.index, words.times, words.key
        for j, r in enumerate(rows):  # an item drawn twice has its count after both, twice
            index[j], times[j], keys[j] = r, pairs[2 * r], pairs[2 * r + 1]

    def tagged(self, limit: int) -> dict[int, torch.Tensor]:
        """The live items' slots by the tag of the insert that wrote them, for the ``limit``
        most recent tags (0, no tag, left out); each tensor in the order the items were
        inserted (as the insert answered them, less any overwritten since)."""
        hi = self.hi  # past it nothing is live (nor read: see written)
        slots = (self.live[:hi] & (self.tag[:hi] != 0)).nonzero().squeeze(1)
        if not len(slots) or limit <= 0:
            return {}
        ordinal = self.ordinal[slots]
        # Only the newest items matter: the newest m by ordinal (topk, not a sort of
        # them all: a 10M-item table reopens in 0.1 s, not 1.7), m grown until the runs in
        # the window but its oldest (which may be cut short) hold `limit` tags, or m is all.
        m = min(len(slots), 64 * limit)
        while True:
            newest = slots[torch.topk(ordinal, m, sorted=True).indices.flip(0)]
            # one insert's items have consecutive ordinals: a run of equal tags each
            tags, counts = torch.unique_consecutive(self.tag[newest], return_counts=True)
            if m == len(slots) or len(torch.unique(tags[1:])) >= limit:
                break
            m = min(len(slots), 4 * m)
        groups = torch.split(newest, counts.tolist())
        out: dict[int, torch.Tensor] = {}
        for tag, group in zip(reversed(tags.tolist()), reversed(groups), strict=True):
            if len(out) == limit:
                break
            out.setdefault(tag, group)
        return out

    def free(self) -> torch.Tensor:
        """Mask of slots neither live nor busy (the live mask read over ``[0, hi)`` only)."""
        free = ~self.busy
        free[: self.hi] &= ~self.live[: self.hi]
        return free

    def written(self, column: torch.Tensor) -> torch.Tensor:
        """A copy of the per-slot ``column`` (here, or a sampler's or writer's) over the slots
        written at least once, ``[0, hi)``: past them it is zeros (see the module docstring),
        so a state carries only these and follows the items, not the capacity (a checkpoint
        of 10 items in a 20M-slot prioritized table wrote a 500 MB state file). Reading past
        them could also end the process: a memmap table's state files are holes there, and
        a tmpfs backs a hole's page when it is read; on a full one, that read is a SIGBUS.
        Within :meth:`viewed`, a view of the column over those slots instead.
        """
        return column[: self.hi] if self._viewed else column[: self.hi].clone()

    @contextlib.contextmanager
    def viewed(self) -> Iterator[None]:
        """Within it, a state the parts give (:meth:`written`) views their columns instead of
        copying them: the state of a reopened table, read from its files to be loaded back
        into the very same files (:mod:`tdreplay.storage.durable`), then costs no copy, and
        loading it writes nothing (:meth:`load_written`). Such a state is only good while the
        columns do not change."""
        self._viewed = True
        try:
            yield
        finally:
            self._viewed = False

    def at(self, column: torch.Tensor, where: slice | torch.Tensor) -> torch.Tensor:
        """The per-slot ``column`` at slots ``where`` (a slice of step 1 from 0 up, or an
        index tensor of checked slots, each in ``[0, capacity)``: a client's go through
        :func:`~tdreplay.codec.indices.slot_tensor` first), reading only the written ones,
        ``[0, hi)``: past them it is zeros (see :meth:`written`), given as such without a
        read there. One comparison when all are written (a sampler's windows around new
        items reach past them)."""
        assert not isinstance(where, slice) or (where.step in (None, 1) and (where.start or 0) >= 0)
        hi = self.hi
        if isinstance(where, slice):
            start, stop = where.start or 0, where.stop
            if stop <= hi:
                return column[where]
            out = column.new_zeros((stop - start, *column.shape[1:]))
            if start < hi:
                out[: hi - start] = column[start:hi]
            return out
        if not len(where) or int(where.max()) < hi:
            return column[where]
        inside = where < hi
        out = column.new_zeros((len(where), *column.shape[1:]))
        out[inside] = column[where[inside]]
        return out

    def reach(self) -> int:
        """Slots ``[0, reach)`` may hold state in the per-slot columns: those written at
        least once, and those a load that lowered ``hi`` left to zero (past them every
        column is zeros and untouched, see :meth:`load_written`)."""
        return max(self._reached, self.hi)

    def loaded(
        self, state: Any, key: str, where: str, column: torch.Tensor, *, hi: int | None = None
    ) -> torch.Tensor:
        """``state[key]``, the per-slot state of ``column`` (here, or a sampler's or
        writer's), checked: ``column``'s dtype, and a row for each slot written at least
        once, ``[0, hi)`` (``hi`` default :attr:`hi`), as :meth:`written` gives; or a row for
        every slot, zeros past ``hi``, as states were saved before.

        Raises:
            StateError: it is missing, not a tensor, of another dtype or shape, or holds
                state at or past slot ``hi`` (the message names ``where.key``).
        """
        hi = self.hi if hi is None else hi
        return per_slot(
            state,
            key,
            where,
            column.dtype,
            hi=hi,
            capacity=self.capacity,
            trailing=column.shape[1:],
        )

    def load_written(self, column: torch.Tensor, value: torch.Tensor) -> None:
        """``value`` (checked by :meth:`loaded`) into ``column``, the mirror of :meth:`written`:
        over slots ``[0, reach)`` only, zeros past ``value``'s rows, so a restored memmap
        table's state files stay holes past its rows (its disk follows the data, and a full
        tmpfs is never asked to back a page there: that write is a SIGBUS). A ``value`` that
        is the column itself (a state :meth:`viewed`) is not copied: nothing is written."""
        n = self.reach()
        k = min(n, len(value))
        if not _same_memory(column[:k], value[:k]):
            column[:k].copy_(value[:k])
        column[k:n].zero_()

    @staticmethod
    def check_unwritten(value: torch.Tensor, name: str, hi: int) -> None:
        """A never-written slot's state is zeros: refuse a loaded ``value`` holding anything
        at or past slot ``hi``."""
        if bool(value[hi:].any()):
            raise SF.StateError(f"{name}: a slot at or past slots.hi ({hi}) holds state")

    def state_dict(self) -> dict[str, Any]:
        return {
            "live": self.written(self.live),
            "ordinal": self.written(self.ordinal),
            "times_sampled": self.written(self.times_sampled),
            **self.scalars(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Load what :meth:`state_dict` gave, checked first (nothing changes on a bad state).

        Raises:
            StateError: a part is missing or of the wrong kind, shape or dtype,
                ``n_live`` is not the number of live slots, or a live slot lies
                at or past ``hi``.
        """
        checked = SlotState.checked(state, self.capacity)
        hi, live, ordinal = checked.hi, checked.live, checked.ordinal
        self._reached = self.reach()
        self.hi = hi
        self.load_written(self.live, live)
        self.busy.zero_()
        self.load_written(self.ordinal, ordinal)
        self.load_written(self.times_sampled, checked.times_sampled)
        self.n_live = checked.n_live
        self.inserted = checked.inserted


def per_slot(
    state: Any,
    key: str,
    where: str,
    dtype: torch.dtype,
    *,
    hi: int,
    capacity: int,
    trailing: tuple[int, ...] | torch.Size = (),
) -> torch.Tensor:
    """``state[key]``, a per-slot column of a table of ``capacity`` slots with ``hi`` written
    (see :meth:`Slots.loaded`), checked: ``dtype``, rows of shape ``trailing``, and a row for
    each written slot or for every slot, zeros past ``hi``.

    Raises:
        StateError: it is missing, not a tensor, of another dtype or shape, or holds
            state at or past slot ``hi`` (the message names ``where.key``).
    """
    value = SF.tensor(state, key, where, dtype=dtype, ndim=1 + len(trailing))
    if value.shape[1:] != tuple(trailing) or len(value) not in (hi, capacity):
        raise SF.StateError(
            f"{where}.{key}: expected shape {[hi, *trailing]} (a row for each of "
            f"the slots.hi written slots) or {[capacity, *trailing]}, got {list(value.shape)}"
        )
    Slots.check_unwritten(value, f"{where}.{key}", hi)
    return value


@dataclass(frozen=True)
class SlotState:
    """A table's slot state (what :meth:`Slots.state_dict` gives), checked, not loaded: what
    :meth:`Slots.load_state_dict` loads, and what an export of a checkpoint orders its
    items by (nothing of ``capacity`` size is allocated)."""

    n_live: int
    hi: int
    inserted: int
    live: torch.Tensor
    ordinal: torch.Tensor
    times_sampled: torch.Tensor

    @classmethod
    def checked(cls, state: Any, capacity: int) -> SlotState:
        """``state`` checked for a table of ``capacity`` slots (see :meth:`Slots.load_state_dict`).

        Raises:
            StateError: a part is missing or of the wrong kind, shape or dtype, ``n_live``
                is not the number of live slots, a live slot lies at or past ``hi``, or an
                ordinal is out of range or held twice.
        """
        where = "slots"
        n_live = SF.integer(state, "n_live", where, hi=capacity)
        hi = SF.integer(state, "hi", where, hi=capacity)
        inserted = SF.integer(state, "inserted", where, hi=MAX_ORDINAL)
        live, ordinal, times_sampled = (
            per_slot(state, key, where, dtype, hi=hi, capacity=capacity)
            for key, dtype in (
                ("live", torch.bool),
                ("ordinal", torch.int64),
                ("times_sampled", torch.int64),
            )
        )
        if int(live.sum()) != n_live:
            raise SF.StateError(f"slots.n_live is {n_live} but {int(live.sum())} slots are live")
        live_ordinal = ordinal[live]
        if len(live_ordinal):
            # a live item has its own ordinal, in [1, inserted], unique in the table
            if int(live_ordinal.min()) < 1 or int(live_ordinal.max()) > inserted:
                raise SF.StateError(
                    f"slots.ordinal: a live slot's ordinal is outside [1, inserted={inserted}]"
                )
            if not _distinct(live_ordinal):
                raise SF.StateError("slots.ordinal: two live slots hold the same ordinal")
        if bool((ordinal < 0).any()) or bool((ordinal > inserted).any()):
            raise SF.StateError(f"slots.ordinal: an ordinal is outside [0, {inserted}]")
        if bool((times_sampled < 0).any()):
            raise SF.StateError("slots.times_sampled: a count is negative")
        return cls(n_live, hi, inserted, live, ordinal, times_sampled)


def oldest_first(held: torch.Tensor, ordinal: torch.Tensor) -> torch.Tensor:
    """The slots ``held`` marks (a mask over slots ``[0, len(held))``), oldest item first:
    by ``ordinal`` (a slot's item's place in insertion order, unique among live items).
    The order of an export, of a table or of a checkpoint."""
    slots = held.nonzero().squeeze(1)
    return slots[torch.argsort(ordinal[slots])]


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory."""
    return (
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
    )


def _distinct(values: torch.Tensor) -> bool:
    """Whether the int64 ``values`` are all different: a mark per value where they span
    little more than their count (a table's live ordinals do: O(n), 10M in ~30 ms),
    else a sort (``torch.unique``: 0.37 s for 10M)."""
    lo, hi = int(values.min()), int(values.max())
    if hi - lo < 8 * len(values):
        seen = torch.zeros(hi - lo + 1, dtype=torch.bool)
        seen[values - lo] = True
        return int(seen.sum()) == len(values)
    return len(torch.unique(values)) == len(values)
