"""What a door lays out buffers by: a table's rows, without the table (:class:`Shape`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tensordict import TensorDictBase

from tdreplay.codec.ipc import Schema
from tdreplay.storage import SampleTarget


@dataclass(frozen=True)
class Shape:
    """What a door needs to lay out buffers for one table's rows, without touching the table.

    Attributes:
        owner: the table served (its identity: a table of the same name made since is
            another, whose buffers are laid out anew).
        rows: rows the buffers hold (checked: a sample's batch size, or an extend's rows
            up to the capacity).
        schema: the columns, ``{key: (shape, dtype)}`` (a sample's include the sample info).
        item_nbytes: bytes of one row of the table's fields (what a row moves, for metrics).
        target: for a sample, makes the checked target of a TensorDict over the buffers.
        inline: for a sample, whether it is small enough to be drawn on the event loop.
    """

    owner: object
    rows: int
    schema: Schema
    item_nbytes: int
    target: Callable[[TensorDictBase], SampleTarget] | None = None
    inline: bool = False


#: a door's placement of a sample: given its :class:`Shape`, the buffers to gather into
Place = Callable[[Shape], "TensorDictBase | SampleTarget"]
