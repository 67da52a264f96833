"""tdreplay.codec: the wire format shared by the storage, the service and the client.

Depends only on torch, tensordict and pyarrow, so the client can use it
without pulling in the service or the storage.
"""

from .arrow import (
    CodecError,
    decode,
    encode,
    from_column,
    from_record_batch,
    read_batches,
    to_leaves,
    to_record_batch,
)
from .protocol import ARROW_STREAM, ERROR_STATUS

__all__ = [
    "ARROW_STREAM",
    "ERROR_STATUS",
    "CodecError",
    "decode",
    "encode",
    "from_column",
    "from_record_batch",
    "read_batches",
    "to_leaves",
    "to_record_batch",
]
