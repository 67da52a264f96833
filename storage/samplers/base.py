"""The sampler protocol: samplers see slot indices and priorities, never data."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InvalidRequest
from ..scalars import Scalars
from ..slots import Slots


class Sampler(Scalars):
    """Chooses which slots a sample returns.

    The table calls :meth:`on_insert` once new items are live and
    :meth:`on_remove` before items stop being live (overwritten or evicted);
    :meth:`ready` says whether :meth:`sample` can return ``n`` slots now.
    Everything runs under the table's lock.

    Attributes:
        consumes: items are removed once returned (queues and stacks).
        needs_episodes: :meth:`on_insert` wants an episode id per item.
        has_priorities: the sampler keeps a priority per item (:meth:`update_priority`);
            the table refuses priorities to one that does not (:func:`no_priorities`).
        weighted: its weights are not all 1: each is divided by :meth:`max_weight`,
            which its samples carry (``sample_info.max_weight``).
    """

    kind = ""
    consumes = False
    needs_episodes = False
    has_priorities = False
    weighted = False

    def __init__(self, slots: Slots, generator: torch.Generator | None = None) -> None:
        self.slots = slots
        self.generator = generator

    def columns(self) -> dict[str, torch.Tensor]:
        """Per-slot tensors holding state to keep across a crash (see :mod:`tdreplay.storage.durable`)."""
        return {}

    def bind_columns(self, columns: dict[str, torch.Tensor]) -> None:
        """Use ``columns`` (same shapes and dtypes) instead of the own tensors of :meth:`columns`."""
        for name, tensor in columns.items():
            setattr(self, name.rpartition(".")[2], tensor)

    def before_live(self, index: torch.Tensor, episode: torch.Tensor | None) -> None:
        """Write the per-slot state of new items, before the slots become live.

        A crash between this and :meth:`on_insert` leaves the items not live;
        one after leaves them live with their own state, never a predecessor's.
        """

    def on_insert(self, index: torch.Tensor, episode: torch.Tensor | None = None) -> None:
        """``index`` (in insertion order) now holds live items."""

    def on_remove(self, index: torch.Tensor) -> None:
        """``index`` stops holding live items."""

    def check_batch_size(self, n: int, table: str) -> None:
        """Raise :class:`~tdreplay.storage.InvalidRequest` naming ``table`` if no sample of
        ``n`` slots is possible (the table checks every batch size before :meth:`sample`)."""

    def ready(self, n: int) -> bool:
        """Whether :meth:`sample` can return ``n`` slots now."""
        return self.slots.n_live > 0

    def sample(self, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``n`` live slots and their importance weights (``None``: all 1)."""
        raise NotImplementedError

    def max_weight(self) -> float:
        """The largest importance weight it could give now, before normalising: what each
        weight :meth:`sample` returns now is divided by (1 unless :attr:`weighted`)."""
        return 1.0

    def update_priority(
        self, index: torch.Tensor, priority: torch.Tensor, key: torch.Tensor | None = None
    ) -> int:
        """Set the priorities of the live slots ``index`` whose ``ordinal`` is ``key`` (if given).

        Only a sampler that :attr:`has_priorities` is called: the table checks ``index``
        (slots in range), ``priority`` and ``key`` first. Returns the number of priorities
        applied.
        """
        raise NotImplementedError(f"the {self.kind!r} sampler keeps no priorities")

    def priority(self, index: torch.Tensor) -> torch.Tensor | None:
        """Priorities of ``index`` (``None`` when the sampler has none)."""
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass

    def info(self) -> dict[str, Any]:
        return {"kind": self.kind}


def no_priorities(table: str, kind: str) -> InvalidRequest:
    """The error for priorities given to ``table``, whose ``kind`` of sampler keeps none
    (an extend's or an ``update_priority``'s)."""
    return InvalidRequest(
        f"table {table!r}: the {kind!r} sampler keeps no priorities; a table that takes "
        "them declares sampler 'prioritized'",
        table=table,
        field="priority",
        expected="a 'prioritized' sampler",
        got=kind,
    )


def draw_live(slots: Slots, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """``n`` uniform draws among live slots, with replacement (see :func:`draw_masked`)."""
    return draw_masked(slots.live, slots.n_live, slots.hi, n, generator)


def draw_masked(
    mask: torch.Tensor, count: int, hi: int, n: int, generator: torch.Generator | None
) -> torch.Tensor:
    """``n`` uniform draws, with replacement, among the ``count`` set entries of ``mask[:hi]``.

    When every entry below ``hi`` is set (the common case) this is one
    ``randint``. Otherwise it draws over ``[0, hi)`` and redraws the misses; when
    few entries are set it chooses among ``nonzero(mask)`` instead. The cost
    does not grow with the table unless most of it is unset.
    """
    idx = torch.randint(hi, (n,), generator=generator)
    if count == hi:
        return idx
    if count * 4 >= hi:
        for _ in range(32):
            miss = (~mask[idx]).nonzero().squeeze(1)
            if len(miss) == 0:
                return idx
            idx[miss] = torch.randint(hi, (len(miss),), generator=generator)
    where = mask[:hi].nonzero().squeeze(1)
    miss = (~mask[idx]).nonzero().squeeze(1)
    idx[miss] = where[torch.randint(len(where), (len(miss),), generator=generator)]
    return idx
