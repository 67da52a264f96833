"""What a table keeps of the checkpoint it last wrote, for the next one to compare with
(:func:`tdreplay.storage.checkpoint.write.up_to_date`): a table unchanged since, whose
checkpoint is still the one on disk, is not written again."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Written:
    """A checkpoint a table wrote, which the table keeps (``last_checkpoint``) for the next
    checkpoint to the same path to compare with: where, which (``checkpoint_id`` in its
    metadata), the table's change count at its snapshot, its layout as asked, and its
    files' sizes by relative path."""

    path: Path
    id: str
    changes: int
    ted2flat: bool
    files: dict[str, int]
