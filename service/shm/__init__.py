"""The same-host transport: a Unix socket and shared-memory slots onto the core.

:mod:`.listener` binds the socket; :mod:`.connection` serves one client;
:mod:`.buffers` are the memfd buffers. The wire: :mod:`tdreplay.codec.shm`; what it
asks of the operating system: :mod:`tdreplay.system`.
"""

from .listener import ShmServer

__all__ = ["ShmServer"]
