"""The same-host transport of the client: a Unix socket and shared-memory slots.

When the server runs on this host (``GET /v1/info`` names its socket and a
host id equal to this one's), samples and extends skip HTTP: the server
gathers a sample straight into a shared-memory slot this connection holds,
and the client wraps the slot's columns as tensors - no socket copy, no
decode. An extend writes its rows into a slot and the server copies them
from there. See :mod:`tdreplay.codec.shm` for the wire.

**The lease.** A sampled batch's tensors *are* the slot. Each thread's
connection keeps a ring of ``lease_slots`` slots per table and batch size,
used in turn: a batch stays as it is until ``lease_slots`` more samples of
that table and size were drawn on that thread; clone what must live longer
(``batch.clone()``). The loader copies each batch into its own buffers, so
its batches keep their documented lifetime.

A :class:`ShmLink` is one server's: a connection per thread, made on first
use, closed with the client.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from ..codec import operations as ops
from . import commands as C
from . import errors, forking
from .shm_channel import MAX_SLOTS, Channel, ShmUnavailable, host_id, usable

__all__ = [
    "CARRIED",
    "HTTP",
    "MAX_SLOTS",
    "UNRESOLVED",
    "Channel",
    "background_thread",
    "ShmLink",
    "ShmUnavailable",
    "host_id",
    "open_link",
    "run",
    "usable",
]


class ShmLink:
    """One server's same-host transport: a :class:`Channel` per thread.

    A thread's channel is closed when the thread ends (the loader starts
    fetcher threads per pass), and a forked child starts with none of its
    parent's (the socket and slots are the parent's).

    Args:
        path: the server's socket.
        token: the bearer token, if the server needs one.
        timeout: seconds a read of an answer may take (beyond the call's wait).
        lease_slots: slots per table and batch size each thread cycles through (see the lease).
        instance: the server's identity from ``/v1/info``; a socket answering with
            another is refused.
        poll_us: microseconds a call polls for its answer (see :class:`Channel`).
    """

    def __init__(
        self,
        path: str,
        token: str | None,
        timeout: float,
        lease_slots: int,
        instance: str | None = None,
        poll_us: int = 0,
    ) -> None:
        self.path = path
        self.poll_us = poll_us
        self.token = token
        self.timeout = timeout
        self.lease_slots = max(1, lease_slots)
        self.instance = instance
        self.after_fork()
        forking.forget_in_child(self)

    def after_fork(self) -> None:
        """Start with no channel (and, in a forked child, none of the parent's: the child's
        calls open their own connections)."""
        self._lock = threading.Lock()
        self._local = threading.local()
        # Weak: a thread's channel lives in its thread-local data only, and is closed when
        # the thread ends (the loader starts fetcher threads for every pass).
        self._channels: weakref.WeakSet[Channel] = weakref.WeakSet()

    def channel(self) -> Channel:
        """This thread's channel (connected on first use).

        Raises:
            ShmUnavailable: the socket cannot be reached or refuses this client.
        """
        chan = getattr(self._local, "channel", None)
        if chan is None or chan.sock.fileno() < 0:
            poll_us = 0 if getattr(_THREAD, "background", False) else self.poll_us
            chan = Channel(
                self.path, self.token, self.timeout, self.lease_slots, self.instance, poll_us
            )
            self._local.channel = chan
            with self._lock:
                self._channels.add(chan)
        return chan

    def close(self) -> None:
        """Close every thread's channel; one a call is using (another thread's, or an
        asyncio client's worker's) is closed when that call ends. Closed under it, the
        call failed with a bad descriptor, or read a descriptor number reused meanwhile
        and waited out its timeout."""
        with self._lock:
            channels = list(self._channels)
            self._channels = weakref.WeakSet()
        for chan in channels:
            if chan.in_use.acquire(blocking=False):
                try:
                    chan.close()
                finally:
                    chan.in_use.release()
            else:
                chan.closing = True
        self._local = threading.local()


#: what this thread is (see :func:`background_thread`)
_THREAD = threading.local()


def background_thread() -> None:
    """Mark the calling thread as one no caller waits on (a loader's fetcher, a writer's
    sender): its same-host calls do not poll for their answers. Polling is for a thread
    waiting on its own call; a background thread polling would take the GIL from the
    threads doing the work (a loader of one-item batches lost 15% to it)."""
    _THREAD.background = True


#: the operations this client sends over the same-host socket (the others go over HTTP);
#: each is one the contract says the socket carries
CARRIED = frozenset({ops.SAMPLE, ops.EXTEND, ops.UPDATE_PRIORITY})
assert all(op.same_host for op in CARRIED)
#: :func:`run`'s answer for a call that must go over HTTP after all
HTTP = object()
#: a server whose same-host transport a client has not looked at yet
UNRESOLVED = object()


def run(link: ShmLink, command: C.Command[Any], strict: bool = False) -> Any:
    """Execute ``command`` (of an operation in :data:`CARRIED`) over ``link``; :data:`HTTP` when an
    extend's rows do not fit the table's layout (HTTP's answer names what is wrong), or
    a slot would pass the server's shared-memory limits (HTTP has its own; ``strict``:
    the limit's error is raised instead)."""
    while True:
        chan = link.channel()
        with chan.in_use:  # ShmLink.close leaves it open until the call ends
            if chan.sock.fileno() >= 0:  # else closed since channel() gave it: a new one
                try:
                    return _run(chan, command, strict)
                finally:
                    if chan.closing:
                        chan.close()


def _run(chan: Channel, command: C.Command[Any], strict: bool) -> Any:
    op = command.op
    if op is ops.SAMPLE:
        assert isinstance(command, C.Sample)
        alloc = None if command.lease else command.alloc
        try:
            return chan.sample(command.table, command.batch_size, command.wait or 0.0, alloc)
        except errors.InsufficientStorage as err:
            if strict or err.field != "batch_size":
                raise
            return HTTP  # a slot that big is past the shared-memory limits: HTTP carries it
    if op is ops.EXTEND:
        assert isinstance(command, C.Extend)
        index = chan.extend(
            command.table, command.data, command.wait or 0.0, command.request_id, strict=strict
        )
        return HTTP if index is None else index
    if op is ops.UPDATE_PRIORITY:
        assert isinstance(command, C.UpdatePriority)
        return chan.update_priority(command.table, command.payload())
    raise TypeError(f"the same-host transport does not carry {type(command).__name__}")


def open_link(
    settings: Any, shard: int, info: dict[str, Any] | None, why: str | None
) -> ShmLink | None:
    """The link to server ``shard`` its ``/v1/info`` (``info``) allows, connected; or ``None``.

    ``why`` is a reason already known not to try (the info could not be read).
    Shared by both client twins, which only fetch ``info`` their own way.

    Raises:
        ShmUnavailable: ``settings.transport == "shm"`` and the link cannot be made.
    """
    if why is None:
        why = usable(info)
    link = None
    if why is None and info is not None:
        found = ShmLink(
            info["shm"]["socket"],
            settings.token,
            settings.timeout,
            settings.lease_slots,
            instance=info["shm"].get("instance"),
            poll_us=settings.shm_poll_us,
        )
        try:
            found.channel()
            link = found
        except errors.ReplayError as err:
            why = str(err)
    if link is None and settings.transport == "shm":
        raise ShmUnavailable(f"{settings.urls[shard]}: no shared-memory transport: {why}")
    return link
