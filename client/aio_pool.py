"""Idle keep-alive connections of the async transport, kept by the event loop that opened them.

An asyncio transport belongs to its loop: only that loop may use or close it.
A client used from several loops at once (a thread each, each under its own
``asyncio.run``) keeps each loop's connections apart here, and closes what it
lets go. One pool shared by all, emptied whenever another loop called, dropped
live sockets unclosed on every call: 4 threads' loops opened the server's 1000
connections (its ``--max-connections``) in 1.6 s. A client dropped unclosed
closes its idle connections when it is collected (its finalizer), rather than
leaving them open in a long-lived loop (20 such clients held 80 sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref
from typing import Any, Generic, Protocol, TypeVar


class Connection(Protocol):
    """What a pool needs of a connection (the transport's ``_Protocol``)."""

    @property
    def transport(self) -> asyncio.BaseTransport | None: ...

    @property
    def closed(self) -> bool: ...


P = TypeVar("P", bound=Connection)
_Pools = weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, list[Any]]


class LoopPools(Generic[P]):
    """Idle connections by loop, at most ``max_idle`` per loop.

    Args:
        max_idle: idle connections kept for reuse per loop.
    """

    def __init__(self, max_idle: int) -> None:
        self.max_idle = max_idle
        self._pools: _Pools = weakref.WeakKeyDictionary()  # an ended loop's go with it
        self._lock = threading.Lock()
        weakref.finalize(self, _close_pools, self._pools, self._lock, None)

    def _pool(self) -> list[P]:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            with self._lock:
                pool = self._pools.setdefault(loop, [])
        return pool

    def take(self) -> P | None:
        """An open idle connection of the running loop, or ``None``."""
        pool = self._pool()
        while pool:
            conn = pool.pop()
            if not conn.closed:
                return conn
        return None

    def give(self, conn: P) -> None:
        """Keep ``conn`` (the running loop's) for reuse, or close it when the pool is full."""
        pool = self._pool()
        if len(pool) < self.max_idle and not conn.closed:
            pool.append(conn)
        elif conn.transport is not None:
            conn.transport.close()

    def close(self) -> None:
        """Close every idle connection: the running loop's now, another running loop's on
        that loop; an ended loop's are dropped (their loop can no longer close them)."""
        _close_pools(self._pools, self._lock, asyncio.get_running_loop())


def _close_pools(pools: _Pools, lock: threading.Lock, here: Any) -> None:
    """Close the idle connections of every loop: ``here``'s at once, another's from its own
    thread (``call_soon_threadsafe``); also the finalizer (``here`` ``None``), which may
    run in any thread."""
    with lock:
        taken = [(loop, pool[:]) for loop, pool in pools.items()]
        for pool in pools.values():
            pool.clear()
    for loop, idle in taken:
        transports = [c.transport for c in idle if c.transport is not None]
        if loop is here:
            _close_transports(transports)
        elif transports and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # it closed meanwhile
                loop.call_soon_threadsafe(_close_transports, transports)


def _close_transports(transports: list[asyncio.BaseTransport]) -> None:
    for transport in transports:
        transport.close()
