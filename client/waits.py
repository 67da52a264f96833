"""How long the client's own waits may last: what a socket, a lock or a timer can be armed for.

A call's timeout may be any finite number of seconds (the contract's rule: the server holds
the call at most its own maximum), but ``socket.settimeout`` and a lock's wait overflow
past about 9.2e9 seconds (``OverflowError``). A wait is armed for at most :data:`MAX_WAIT`
seconds, which is as long as it takes.

    >>> bounded(30.0)
    30.0
    >>> bounded(1e12) == MAX_WAIT
    True
"""

from __future__ import annotations

#: the longest wait armed (about 31 years: far below what the OS's timers take)
MAX_WAIT = 1e9


def bounded(seconds: float) -> float:
    """``seconds``, at most :data:`MAX_WAIT`."""
    return min(seconds, MAX_WAIT)
