"""Checkpoints: a table's data and state in one folder, written atomically.

Layout of a checkpoint folder (format 3)::

    <path>/
      metadata.json        format version, the table's spec, counts, TED and live_only flags
      state.safetensors    slot, sampler, writer and rate-limiter state, RNG state
                           (JSON + raw tensors, see :mod:`~tdreplay.storage.statefile`)
      storage/             live_only: the rows of the slots live then (slots.live in the
                           state), in slot order, as a memmapped TensorDict; else every
                           written row [0, hi) (TorchRL's flat TED layout when ted2flat is
                           on: its ring of rows; format 1 and 2 always)

A dead slot's row is not kept: no sampler, writer or export reads it, and a slot is written
again before it is live again. A restored table holds zeros there.

One module per concern:

* :mod:`.write`: :func:`checkpoint`, the folder written beside ``path`` and
  renamed into place; a crash leaves the old or the new checkpoint readable.
* :mod:`.snapshot`: the rows of one instant, copied while the table keeps
  serving (a copy-on-write hook saves the rows an insert overwrites).
* :mod:`.restore`: :func:`restore`; nothing read from a checkpoint can run code.
* :mod:`.load`: the steps of reading a checkpoint a restore and an offline export share.
* :mod:`.items`: :func:`export_checkpoint`, a checkpoint's live items exported without
  a table (what it loads follows what the checkpoint holds, not the declared capacity).
* :mod:`.reader`: reading a checkpoint's files safely (no pickle, every file
  inside the folder, sizes and dtypes as the spec says).
* :mod:`.folder`: the names in a checkpoint folder, :func:`find` (the
  checkpoint itself or the copy an interrupted swap set aside),
  :func:`read_metadata`.

What interrupted checkpoints leave, and its cleanup, is :mod:`tdreplay.storage.debris`.
"""

from .folder import (
    FORMAT_VERSION,
    READABLE_FORMATS,
    find,
    held_table,
    holds_other,
    is_checkpoint,
    read_metadata,
)
from .items import CheckpointTable, export_checkpoint
from .restore import restore
from .write import CheckpointPath, checkpoint

__all__ = [
    "FORMAT_VERSION",
    "CheckpointPath",
    "CheckpointTable",
    "READABLE_FORMATS",
    "checkpoint",
    "export_checkpoint",
    "find",
    "held_table",
    "holds_other",
    "is_checkpoint",
    "read_metadata",
    "restore",
]
