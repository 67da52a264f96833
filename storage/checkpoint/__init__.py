"""Checkpoints: a table's data and state in one folder, written atomically.

Layout of a checkpoint folder (format 2)::

    <path>/
      metadata.json        format version, the table's spec, counts, TED flag
      state.safetensors    slot, sampler, writer and rate-limiter state, RNG state
                           (JSON + raw tensors, see :mod:`~tdreplay.storage.statefile`)
      storage/             the written rows [0, hi) as a memmapped TensorDict
                           (or TorchRL's flat TED layout when ted2flat is on)

One module per concern:

* :mod:`.write`: :func:`checkpoint`, the folder written beside ``path`` and
  renamed into place; a crash leaves the old or the new checkpoint readable.
* :mod:`.snapshot`: the rows of one instant, copied while the table keeps
  serving (a copy-on-write hook saves the rows an insert overwrites).
* :mod:`.restore`: :func:`restore`; nothing read from a checkpoint can run code.
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
from .restore import restore
from .write import CheckpointPath, checkpoint

__all__ = [
    "FORMAT_VERSION",
    "CheckpointPath",
    "READABLE_FORMATS",
    "checkpoint",
    "find",
    "held_table",
    "holds_other",
    "is_checkpoint",
    "read_metadata",
    "restore",
]
