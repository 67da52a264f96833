"""tdreplay.client: the client library (sync and async twins).

    >>> from tdreplay.client import ReplayClient
    >>> client = ReplayClient("http://replay:8000", token="secret")  # doctest: +SKIP
    >>> client.extend("cartpole", rollout)                            # doctest: +SKIP
    >>> batch = client.sample("cartpole", 256)                        # doctest: +SKIP
    >>> for batch in client.loader("cartpole", 256, prefetch=4, device="cuda"):  # doctest: +SKIP
    ...     ...
    >>> with client.writer("cartpole", chunk=256) as w:               # doctest: +SKIP
    ...     w.append(step)

Depends on :mod:`tdreplay.codec` (the wire format), torch, tensordict and
pyarrow only: never on the service or the storage.
"""

from .aio import AsyncLoader, AsyncReplayClient
from .aio_writer import AsyncWriter
from .errors import (
    BackendError,
    CheckpointError,
    CodecError,
    ConnectionFailed,
    EmptyTableError,
    Forbidden,
    InsufficientStorage,
    InternalError,
    InvalidCheckpoint,
    InvalidRequest,
    NotFound,
    PathExists,
    PayloadTooLarge,
    ProtocolError,
    RateLimitTimeout,
    ReplayError,
    SchemaError,
    ServerError,
    TableClosed,
    TableExists,
    TableLost,
    TableNotFound,
    Timeout,
    TransportError,
    Unauthorized,
    Unprocessable,
    UnsupportedMediaType,
)
from .loader import Loader, LoaderIterator
from .merging import split_batch
from .retry import NO_RETRY, RetryPolicy
from .settings import ClientSettings
from .shm_channel import ShmUnavailable
from .sync import ReplayClient
from .tensorclass import from_fields, to_tensorclass
from .writer import ChunkBuffer, Writer

__all__ = [
    "NO_RETRY",
    "AsyncLoader",
    "AsyncReplayClient",
    "AsyncWriter",
    "BackendError",
    "CheckpointError",
    "InsufficientStorage",
    "InvalidCheckpoint",
    "ChunkBuffer",
    "CodecError",
    "ConnectionFailed",
    "EmptyTableError",
    "Forbidden",
    "InternalError",
    "InvalidRequest",
    "NotFound",
    "PathExists",
    "Loader",
    "LoaderIterator",
    "PayloadTooLarge",
    "ProtocolError",
    "RateLimitTimeout",
    "ReplayClient",
    "ReplayError",
    "RetryPolicy",
    "SchemaError",
    "ServerError",
    "ShmUnavailable",
    "ClientSettings",
    "TableClosed",
    "TableExists",
    "TableLost",
    "TableNotFound",
    "Timeout",
    "TransportError",
    "Unauthorized",
    "Unprocessable",
    "UnsupportedMediaType",
    "Writer",
    "from_fields",
    "split_batch",
    "to_tensorclass",
]


def __getattr__(name: str) -> object:
    # `Settings` was renamed `ClientSettings` (the server has its own Settings);
    # the old name works, with a warning, for one release.
    if name == "Settings":
        import warnings

        warnings.warn(
            "tdreplay.client.Settings is deprecated and will be removed in the next release; "
            "use tdreplay.client.ClientSettings",
            DeprecationWarning,
            stacklevel=2,
        )
        return ClientSettings
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
