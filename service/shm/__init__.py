"""The same-host transport: a Unix socket and shared-memory slots onto the core.

:mod:`.listener` binds the socket; :mod:`.connection` serves one client;
:mod:`.slots` are the memfd buffers. The wire: :mod:`tdreplay.codec.shm`.
"""

from .buffers import supported
from .listener import ShmServer, host_id

__all__ = ["ShmServer", "host_id", "supported"]
