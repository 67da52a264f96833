"""The table as the modules that consume it see it: checkpoint, restore, export, import.

Those modules work on a table's public surface only (its name and spec, a
:meth:`~tdreplay.storage.Table.snapshot`, its :meth:`~tdreplay.storage.Table.items`,
``extend``) and the :class:`~tdreplay.storage.Table` calls them from its
``checkpoint`` / ``restore`` / ``export`` / ``import_parquet``. They name these
protocols, not the class: the dependency goes one way, table to consumers
(``tests/test_import_cycles.py`` counts type-only imports too).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch

from .backends import Backend
from .last_checkpoint import Written
from .slot_policy import SlotPolicy
from .spec import NestedKey, TableSpec

if TYPE_CHECKING:  # the table package imports its consumers, which import this module
    from .table.snapshot import Snapshot


class Named(Protocol):
    """Any table: what errors and progress bars name."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> TableSpec: ...

    @property
    def capacity(self) -> int: ...


class Checkpointable(Named, Protocol):
    """What a checkpoint reads: a snapshot, where the table's own data lies, its writer."""

    @property
    def backend(self) -> Backend: ...

    @property
    def root(self) -> Path: ...

    @property
    def writer(self) -> SlotPolicy: ...

    @property
    def closed(self) -> bool: ...

    #: its change count, and the checkpoint it last wrote (see ``TableBase.changes``)
    changes: int
    last_checkpoint: Written | None

    def snapshot(
        self, *, hold: bool = False, live_only: bool = False
    ) -> AbstractContextManager[Snapshot]: ...


class Restorable(Protocol):
    """What a restore fills: a fresh table's rows and state."""

    @property
    def backend(self) -> Backend: ...

    @property
    def generator(self) -> torch.Generator: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def destroy(self) -> None: ...


class ItemChunks(Protocol):
    """Live items to export, oldest first, a chunk at a time (a table's
    :class:`~tdreplay.storage.table.snapshot.Items`, or a checkpoint's)."""

    def __len__(self) -> int: ...

    def chunks(self, rows: int) -> Iterator[tuple[dict[NestedKey, torch.Tensor], int]]:
        """``(items, slots read)``, about ``rows`` at a time: items of the spec's fields,
        ``[n, *shape]`` each; the slots read add up to ``len()``."""
        ...


class Exportable(Named, Protocol):
    """What an export reads: the live items, oldest first (a table, or a checkpoint read
    offline: :class:`~tdreplay.storage.checkpoint.items.CheckpointTable`)."""

    def items(self) -> ItemChunks: ...


class Importable(Named, Protocol):
    """What an import writes through: ``extend``."""

    def extend(self, data: Any, *, timeout: float | None = None) -> torch.Tensor: ...
