"""A checkpoint's live items, oldest first, read from its files: what an offline export writes.

``tdreplay export --checkpoint`` needs no table: :meth:`CheckpointTable.open` reads the
checkpoint as a restore does (:mod:`.load`: its metadata, its state, its row files
mapped copy-on-write, every check a restore makes of them) and orders the live slots as a
table's export does (by ordinal: :func:`~tdreplay.storage.slots.oldest_first`),
and :func:`tdreplay.storage.export.export` writes them with the very writers
:meth:`Table.export <tdreplay.storage.Table.export>` uses: the same table gives the same
file, byte for byte, whichever way it is exported. What it loads follows what the
checkpoint holds (its rows, and the state of the slots ever written), never the
capacity its spec declares: nothing per slot of the capacity is allocated, no sampler
is built. The state of the sampler, writer and rate limiter is not read (an export
writes none of it).

    >>> import tempfile, torch
    >>> from pathlib import Path
    >>> from tensordict import TensorDict
    >>> from tdreplay.storage import Table, TableSpec
    >>> spec = TableSpec.model_validate({"name": "demo", "capacity": 1 << 20,
    ...     "backend": {"kind": "memory"}, "fields": {"obs": {"shape": [2], "dtype": "float32"}}})
    >>> tmp = Path(tempfile.mkdtemp())
    >>> table = Table.create(spec, root=tmp / "a")
    >>> _ = table.extend(TensorDict({"obs": torch.ones(3, 2)}, [3]))
    >>> path = table.checkpoint(tmp / "ckpt")
    >>> export_checkpoint(path, tmp / "c.csv").read_text() == table.export(tmp / "t.csv").read_text()
    True
    >>> import shutil; table.destroy(); shutil.rmtree(tmp)
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tdreplay.codec.exports import ExportedPath

from ..export import export
from ..sizing import check_table_bytes
from ..slots import SlotState, oldest_first
from ..spec import NestedKey, TableSpec
from .folder import path_lock
from .load import Rows, check_state_parts, read_head, read_rows, read_state, reading


@dataclass(eq=False)
class CheckpointItems:
    """The live items of a checkpoint, oldest first (:class:`~tdreplay.storage.consumers.ItemChunks`).

    Attributes:
        rows: every field's rows as the checkpoint stores them (mapped, or unflattened).
        order: the rows of the live items, oldest first.
    """

    rows: Rows
    order: torch.Tensor

    def __len__(self) -> int:
        return len(self.order)

    def chunks(self, rows: int) -> Iterator[tuple[dict[NestedKey, torch.Tensor], int]]:
        """``(items, items read)``, ``rows`` at a time (the last chunk fewer), as a table's
        :meth:`~tdreplay.storage.table.snapshot.Items.chunks` gives them."""
        for start in range(0, len(self.order), rows):
            index = self.order[start : start + rows]
            yield {k: v.index_select(0, index) for k, v in self.rows.items()}, len(index)


@dataclass(eq=False)
class CheckpointTable:
    """The table a checkpoint holds, as an export reads it
    (:class:`~tdreplay.storage.consumers.Exportable`); build it with :meth:`open`."""

    spec: TableSpec
    live: CheckpointItems

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def capacity(self) -> int:
        return self.spec.capacity

    def items(self) -> CheckpointItems:
        return self.live

    @classmethod
    def open(
        cls, path: str | Path, *, expect: TableSpec | None = None, limit: int | None = None
    ) -> CheckpointTable:
        """Read the checkpoint at ``path`` (or the copy an interrupted swap set aside).

        Args:
            path: the checkpoint folder.
            expect: the spec the caller read from its metadata and checked (a checkpoint
                that holds another one by now is refused).
            limit: the most bytes it may load (``--max-table-bytes``): its rows held and
                the bookkeeping of its slots ever written
                (:func:`~tdreplay.storage.sizing.check_table_bytes` with ``held``),
                checked before a row is read.

        Raises:
            CheckpointError: no checkpoint at ``path``, or a file could not be read.
            InvalidCheckpoint: the checkpoint is damaged, of an unsupported format, or
                holds something unsafe to load, as :meth:`Table.restore
                <tdreplay.storage.Table.restore>` refuses it; the message names the file.
            SchemaError: its spec is invalid, or what it holds exceeds ``limit``.
        """
        path = Path(path).absolute()
        with path_lock(path):  # one checkpoint's metadata, state and rows (see restore)
            head = read_head(path, expect)
            spec, hi = head.spec, head.hi
            with reading(head, "export"):
                state = read_state(head)
                check_state_parts(state, hi)
                slots = SlotState.checked(state["slots"], spec.capacity)
                if limit is not None:
                    held = slots.n_live if head.live_only else hi
                    check_table_bytes(spec, limit, held=(held, hi))
                rows, stored = read_rows(head, state)
        live, ordinal = slots.live[:hi], slots.ordinal[:hi]
        if stored is not None:  # live_only: its rows are the live slots', in slot order
            live, ordinal = torch.ones(len(stored), dtype=torch.bool), ordinal[stored]
        order = oldest_first(live, ordinal)
        if rows is None:  # nothing written
            fields = spec.torch_schema().items()
            rows = {k: torch.empty([0, *s], dtype=d) for k, (s, d) in fields}
        return cls(spec, CheckpointItems(rows, order))


def export_checkpoint(
    path: str | Path,
    output: str | Path,
    *,
    format: str | None = None,
    progress: bool | None = None,
    replace: bool = True,
    expect: TableSpec | None = None,
    limit: int | None = None,
) -> ExportedPath:
    """Export the live items of the checkpoint at ``path`` to ``output``, without a table:
    the file :meth:`Table.export <tdreplay.storage.Table.export>` writes of the table
    checkpointed (``expect`` and ``limit``: see :meth:`CheckpointTable.open`; the other
    arguments and the errors: :func:`tdreplay.storage.export.export`)."""
    return export(
        CheckpointTable.open(path, expect=expect, limit=limit),
        output,
        format=format,
        progress=progress,
        replace=replace,
    )
