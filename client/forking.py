"""What a forked child must not share with its parent: connections and threads.

A client that made calls before ``os.fork`` (a learner forking workers,
multiprocessing's ``fork`` start method) reaches the child as a copy: its
pooled sockets are the parent's connections to the server, and its thread
pools name threads that do not exist there. Both processes writing requests
on one connection read each other's answers (a parent's sample of 1 row got
the child's 6, with no error); a child's sharded sample queued for the
parent's gather threads forever. Each holder of such things registers here,
and in the child its ``after_fork`` runs before any of the child's code: it
lets go of them without touching the parent's (closing a descriptor closes
the child's copy only), and the child's calls open their own.
"""

from __future__ import annotations

import os
import weakref
from typing import Protocol


class ForkAware(Protocol):
    """A holder of connections or threads (:func:`forget_in_child`)."""

    def after_fork(self) -> None:
        """In a forked child: let go of the parent's connections, threads and locks."""


#: every holder in this process (weak: a holder collected needs nothing in a child)
_HOLDERS: weakref.WeakSet[ForkAware] = weakref.WeakSet()  # type: ignore[type-var]


def forget_in_child(holder: ForkAware) -> None:
    """Call ``holder.after_fork()`` in each child this process forks from now on."""
    _HOLDERS.add(holder)


def _after_fork() -> None:
    for holder in list(_HOLDERS):
        holder.after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)
