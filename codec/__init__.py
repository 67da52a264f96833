"""tdreplay.codec: the wire format shared by the storage, the service and the client.

:mod:`~tdreplay.codec.arrow` is the format (TensorDict <-> Arrow),
:mod:`~tdreplay.codec.ipc` the byte layouts of its streams for the hot paths
(:class:`SampleLayout` out, :class:`LayoutDecoder` in),
:mod:`~tdreplay.codec.dtypes` the element types and
:mod:`~tdreplay.codec.protocol` the routes, media types and errors.

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
from .ipc import LayoutDecoder, SampleLayout
from .parts import LayoutEncoder, encode_parts
from .protocol import ARROW_STREAM, ERROR_STATUS

__all__ = [
    "ARROW_STREAM",
    "ERROR_STATUS",
    "CodecError",
    "LayoutDecoder",
    "LayoutEncoder",
    "SampleLayout",
    "decode",
    "encode",
    "encode_parts",
    "from_column",
    "from_record_batch",
    "read_batches",
    "to_leaves",
    "to_record_batch",
]
