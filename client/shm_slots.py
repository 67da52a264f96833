"""A same-host slot as the client maps it (:class:`Mapped`): the mapping, the views of its
columns kept from batch to batch (:class:`Views`), and the copy of an extend's rows into
it (:func:`fill`). The wire's layout is :class:`tdreplay.codec.shm.SlotLayout`.
"""

from __future__ import annotations

import operator
import os
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from ..codec.arrow import key_tree, nest_by
from ..codec.shm import SlotLayout
from ..system import SharedMap


class Mapped:
    """A slot as this side maps it: the mapping, its column views, and how they nest."""

    def __init__(self, fd: int, nbytes: int, layout: SlotLayout) -> None:
        try:
            self.map = SharedMap(fd, nbytes)
        finally:
            os.close(fd)
        self.layout = layout
        self.views = Views(layout, self.map.buffer)
        self.tree = key_tree(list(self.views.columns))
        self.batch = torch.Size([layout.rows])

    def batch_of(self, columns: dict[tuple[str, ...], torch.Tensor]) -> TensorDict:
        """A TensorDict of ``columns`` (this slot's views, or a copy's) nested as the slot's."""
        return nest_by(self.tree, columns, self.batch)


class Views:
    """A slot's layout on a buffer, kept from batch to batch: the bytes (``flat``, to copy
    a whole slot in or out) and the columns they hold (``columns``, as the batches' tensors:
    a leased slot's own, or those of a loader's receive buffer); one storage."""

    def __init__(self, layout: SlotLayout, buf: Any) -> None:
        self.layout, self.buf = layout, buf
        self._view()

    def _view(self) -> None:
        self.flat = self.layout.whole(self.buf)
        self.columns = self.layout.views_of(self.flat)
        self._tensors = list(self.columns.values())
        self._at = self.flat.data_ptr()

    def intact(self) -> Views:
        """These views, for the next batch: made anew where a caller moved one of the last
        batch's tensors (``share_memory_()``, as a torch.multiprocessing queue does: it
        moves their one storage, and every later batch on this buffer would be the old
        bytes) or had one require grad (its gradient would build up over batches). Shapes
        changed in place are not looked at.

        No torch call: one storage address and a flag a column. A loader of one-item
        batches ran 5% slower with a check of every column's address (10.0k against 10.5k
        batches/s, 2 cores), hence the one storage.
        """
        if self.flat.data_ptr() != self._at or any(map(_REQUIRES_GRAD, self._tensors)):
            self._view()
        return self


_REQUIRES_GRAD = operator.attrgetter("requires_grad")


def fill(mapped: Mapped, td: TensorDictBase, n: int) -> bool:
    """Copy ``td``'s rows into the slot; ``False`` if its leaves are not exactly the layout's."""
    leaves = {k if isinstance(k, tuple) else (k,): v for k, v in td.items(True, True)}
    columns = mapped.views.columns  # the extend slot's: no caller holds them
    if len(leaves) != len(columns):
        return False
    for key, view in columns.items():
        t = leaves.get(key)
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype != view.dtype
            or tuple(t.shape) != (n, *view.shape[1:])
        ):
            return False
    for key, view in columns.items():
        view[:n].copy_(leaves[key])
    return True
