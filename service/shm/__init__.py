"""The same-host transport: a Unix socket and shared-memory slots onto the core (see :mod:`.door`)."""

from .door import ShmServer, host_id
from .slots import supported

__all__ = ["ShmServer", "host_id", "supported"]
