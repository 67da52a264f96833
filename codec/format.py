"""The names and limits of the wire format, and its one error (see :mod:`tdreplay.codec.arrow`).

Shared by the encoder (:mod:`~tdreplay.codec.to_arrow`), the decoder
(:mod:`~tdreplay.codec.from_arrow`) and the byte layouts
(:mod:`~tdreplay.codec.ipc`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    import torch

#: a column's name joins its nested key with this (``("next", "reward")`` -> ``"next.reward"``)
SEP = "."
#: field metadata: the dtype's name (:data:`tdreplay.codec.dtypes.DTypeName`)
META_DTYPE = b"tdreplay.dtype"
#: field metadata: the item shape as a JSON list (``"[84, 84, 4]"``)
META_SHAPE = b"tdreplay.shape"

#: a TensorDict key as a tuple of its parts (``("next", "reward")``)
NestedKey = tuple[str, ...]


@dataclass(frozen=True)
class Column:
    """Where one column's values lie in a buffer: ``nbytes`` bytes at ``offset``, rows of
    ``shape``-shaped ``dtype`` items (bools packed as bits in an Arrow body). The one
    description of a column of every byte layout: an Arrow body's
    (:class:`~tdreplay.codec.ipc.SampleLayout`, ``BodyLayout``) and a shared-memory slot's
    (:class:`~tdreplay.codec.shm.SlotLayout`)."""

    key: NestedKey
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]


#: most dimensions an item may have (nested fixed-size lists, or ``tdreplay.shape`` entries)
MAX_NDIM = 32
#: largest item dimension, and largest item (elements) a column may declare
MAX_DIM = (1 << 31) - 1
#: most columns a record batch may have
MAX_COLUMNS = 4096
#: longest ``tdreplay.shape`` / ``tdreplay.dtype`` metadata value, in bytes
MAX_META_BYTES = 512

#: what pyarrow raises on bytes or arrays it cannot make sense of
ARROW_ERRORS = (pa.ArrowException, OSError, ValueError, UnicodeDecodeError)
