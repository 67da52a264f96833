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

import contextlib
import json
import os
import socket
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensorclass

from ..codec import protocol
from ..codec.arrow import nest
from ..codec.shm import (
    HEADER,
    MAX_FRAME,
    VERSION,
    SharedMap,
    ShmProtocolError,
    SlotLayout,
    frame,
    frame_length,
    parse_frame,
)
from . import commands as C
from . import errors
from .commands import Alloc, as_batch

#: slot numbers a connection uses at most (the server's bound)
MAX_SLOTS = 256


class ShmUnavailable(errors.TransportError):
    """The same-host transport cannot be used here (no socket, another host, no memfd)."""


def host_id() -> str:
    """This host's identity, as the server computes it (the kernel's boot id)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return socket.gethostname()


def usable(info: dict[str, Any] | None) -> str | None:
    """Why the server's ``/v1/info`` rules the transport out, or ``None`` if it may be tried."""
    if not hasattr(socket, "AF_UNIX") or not hasattr(socket, "SCM_RIGHTS"):
        return "this OS has no Unix sockets with descriptor passing"
    shm = (info or {}).get("shm")
    if not isinstance(shm, dict) or not isinstance(shm.get("socket"), str):
        return "the server offers no shared-memory socket"
    if shm.get("host") != host_id():
        return "the server runs on another host"
    if not os.path.exists(shm["socket"]):
        return f"its socket {shm['socket']!r} is not reachable from here"
    return None


class _Mapped:
    """A slot as this side maps it: the mapping and its column views."""

    def __init__(self, fd: int, nbytes: int, layout: SlotLayout) -> None:
        try:
            self.map = SharedMap(fd, nbytes)
        finally:
            os.close(fd)
        self.layout = layout
        self.columns = layout.views(self.map.buffer)


class Channel:
    """One connection to the server's socket (one thread's; not thread safe)."""

    def __init__(
        self,
        path: str,
        token: str | None,
        timeout: float,
        lease_slots: int,
        instance: str | None = None,
    ) -> None:
        self.timeout = timeout
        self.lease_slots = lease_slots
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(path)
        except OSError as err:
            self.sock.close()
            raise ShmUnavailable(f"cannot connect to {path}: {err}") from None
        self._slots: dict[int, _Mapped] = {}
        #: slot numbers by (op, table, batch size), least recently used first
        self._numbers: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._turn: dict[tuple[Any, ...], int] = {}
        self._free: list[int] = []
        self._next = 0
        try:
            reply, _ = self.call({"op": "hello", "version": VERSION, "token": token or ""}, wait=0)
        except errors.ReplayError as err:  # refused (token, too many connections) or cut off
            self.close()
            raise ShmUnavailable(f"the socket refused this client: {err}") from None
        self.max_slots = min(MAX_SLOTS, int(reply.get("max_slots", MAX_SLOTS)))
        if reply.get("host") != host_id():
            self.close()
            raise ShmUnavailable("the socket's server runs on another host")
        if instance is not None and reply.get("instance") != instance:
            self.close()
            raise ShmUnavailable(
                f"the server listening on {path} is not the one asked over HTTP (two servers "
                "publish that path: give each its own --shm-socket)"
            )

    # -- framing ------------------------------------------------------------
    def call(self, message: dict[str, Any], *, wait: float) -> tuple[dict[str, Any], int]:
        """Send ``message``, read the reply and the descriptor it carries (``-1``: none)."""
        self.sock.settimeout(self.timeout + wait)
        try:
            self.sock.sendall(frame(message))
            header, fds = self._recv_header()
            body = self._recv_exactly(frame_length(header, MAX_FRAME))
        except (OSError, ShmProtocolError) as err:
            self.close()
            raise errors.ConnectionFailed(f"shared-memory socket: {err}", sent=True) from None
        reply = parse_frame(body)
        fd = fds[0] if fds else -1
        for extra in fds[1:]:
            os.close(extra)
        if not reply.get("ok"):
            if fd >= 0:
                os.close(fd)
            raise _error(reply.get("error"))
        return reply, fd

    def _recv_header(self) -> tuple[bytes, list[int]]:
        data, fds, _, _ = socket.recv_fds(self.sock, HEADER.size, 4)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        data += self._recv_exactly(HEADER.size - len(data))
        return data, list(fds)

    def _recv_exactly(self, n: int) -> bytes:
        buf = bytearray(n)
        view, got = memoryview(buf), 0
        while got < n:
            k = self.sock.recv_into(view[got:])
            if k == 0:
                raise ConnectionResetError("the server closed the connection")
            got += k
        return bytes(buf)

    def _number(self, key: tuple[Any, ...], ring: int) -> int:
        """The slot number for the next call of ``key``: its ``ring`` numbers in turn.

        Numbers of the least recently used keys are released (to the server too)
        when the connection's ``max_slots`` would be passed.
        """
        numbers = self._numbers.setdefault(key, [])
        self._numbers.move_to_end(key)
        while len(numbers) < ring:
            if self._free:
                numbers.append(self._free.pop())
            elif self._next < self.max_slots:
                numbers.append(self._next)
                self._next += 1
            elif len(self._numbers) > 1:
                self._release(next(iter(self._numbers)))
            else:
                break
        turn = self._turn.get(key, -1) + 1
        self._turn[key] = turn
        return numbers[turn % len(numbers)]

    def _release(self, key: tuple[Any, ...]) -> None:
        for number in self._numbers.pop(key, []):
            self._slots.pop(number, None)
            self.call({"op": "release", "slot": number}, wait=0)
            self._free.append(number)
        self._turn.pop(key, None)

    def _forget(self, number: int) -> None:
        """A slot the server no longer has as this side does: map it anew next time."""
        self._slots.pop(number, None)

    def _map(self, reply: dict[str, Any], fd: int, number: int) -> _Mapped:
        if fd >= 0:
            try:
                nbytes = int(reply["nbytes"])
                layout = SlotLayout.from_json(reply["layout"], int(reply["rows"]), limit=nbytes)
            except (KeyError, TypeError, ValueError, ShmProtocolError) as err:
                os.close(fd)
                raise errors.ProtocolError(f"bad shared-memory slot: {err}") from None
            self._slots[number] = _Mapped(fd, nbytes, layout)
        mapped = self._slots.get(number)
        if mapped is None:
            raise errors.ProtocolError(f"the server answered for slot {number}, never sent")
        return mapped

    # -- operations ---------------------------------------------------------
    def sample(self, table: str, batch_size: int, wait: float, alloc: Alloc | None) -> TensorDict:
        """A batch viewing this thread's next slot for ``(table, batch_size)`` (see the lease),
        or, with ``alloc``, a copy in the buffer it gives (the loader's own buffers)."""
        number = self._number(("sample", table, batch_size), self.lease_slots)
        message = {"op": "sample", "table": table, "batch_size": batch_size, "slot": number}
        message["timeout"] = wait
        reply, fd = self.call(message, wait=wait)
        mapped = self._map(reply, fd, number)
        if alloc is None:
            return nest(mapped.columns, batch_size)
        nbytes = mapped.layout.nbytes
        buf = alloc(nbytes)
        if nbytes:
            dst = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes)
            dst.copy_(torch.frombuffer(mapped.map.buffer, dtype=torch.uint8, count=nbytes))
        return nest(mapped.layout.views(buf), batch_size)

    def extend(
        self, table: str, data: Any, wait: float, request_id: str, *, strict: bool = False
    ) -> torch.Tensor | None:
        """Insert ``data``; ``None`` when it does not fit the table's slot layout exactly
        (the caller sends it over HTTP, whose answer names what is wrong), or a slot that
        big would exceed the connection's shared memory (HTTP carries it)."""
        td = as_batch(data._tensordict if is_tensorclass(data) else data)
        n = td.batch_size[0] if td.batch_dims == 1 else 0
        if n == 0:
            return None
        key = ("extend", table)
        number = self._number(key, 1)
        for attempt in range(2):
            mapped = self._slots.get(number)
            if mapped is None or mapped.layout.rows < n:
                ask = {"op": "extend_slot", "table": table, "rows": max(n, 64), "slot": number}
                try:
                    reply, fd = self.call(ask, wait=0)
                except errors.InsufficientStorage:  # over the shared-memory limits: HTTP
                    if strict:
                        raise
                    return None
                mapped = self._map(reply, fd, number)
            if mapped.layout.rows < n or not _fill(mapped, td, n):
                return None  # more rows than the table holds, or keys that do not fit: HTTP says
            message = {"op": "extend", "table": table, "slot": number, "rows": n}
            message.update(timeout=wait, request_id=request_id)
            try:
                reply, _ = self.call(message, wait=wait)
            except errors.InvalidRequest as err:
                if err.field != "slot" or attempt:
                    raise
                self._forget(number)  # the table was replaced since the slot was laid out
                continue
            return torch.tensor(reply["index"], dtype=torch.int64)
        return None

    def update_priority(self, table: str, payload: dict[str, Any]) -> int:
        reply, _ = self.call({"op": "update_priority", "table": table, **payload}, wait=0)
        return int(reply["updated"])

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        self._slots.clear()
        self._numbers.clear()
        with contextlib.suppress(OSError):
            self.sock.close()


def _fill(mapped: _Mapped, td: TensorDictBase, n: int) -> bool:
    """Copy ``td``'s rows into the slot; ``False`` if its leaves are not exactly the layout's."""
    leaves = {k if isinstance(k, tuple) else (k,): v for k, v in td.items(True, True)}
    if len(leaves) != len(mapped.columns):
        return False
    for key, view in mapped.columns.items():
        t = leaves.get(key)
        if (
            not isinstance(t, torch.Tensor)
            or t.dtype != view.dtype
            or tuple(t.shape) != (n, *view.shape[1:])
        ):
            return False
    for key, view in mapped.columns.items():
        view[:n].copy_(leaves[key])
    return True


def _error(body: Any) -> errors.ServerError:
    body = body if isinstance(body, dict) else {"type": "InternalError", "detail": str(body)}
    status = protocol.ERROR_STATUS.get(str(body.get("type")), 500)
    return errors.from_response(status, json.dumps(body).encode())


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
    """

    def __init__(
        self,
        path: str,
        token: str | None,
        timeout: float,
        lease_slots: int = 2,
        instance: str | None = None,
    ) -> None:
        self.path = path
        self.token = token
        self.timeout = timeout
        self.lease_slots = max(1, lease_slots)
        self.instance = instance
        self._lock = threading.Lock()
        self._reset()
        _LINKS.add(self)

    def _reset(self) -> None:
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
            chan = Channel(self.path, self.token, self.timeout, self.lease_slots, self.instance)
            self._local.channel = chan
            with self._lock:
                self._channels.add(chan)
        return chan

    def close(self) -> None:
        with self._lock:
            channels = list(self._channels)
            self._channels = weakref.WeakSet()
        for chan in channels:
            chan.close()
        self._local = threading.local()


#: every link of this process: a forked child drops its parent's connections
_LINKS: weakref.WeakSet[ShmLink] = weakref.WeakSet()


def _after_fork() -> None:
    for link in list(_LINKS):
        link._reset()  # the child's calls open their own connections


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


#: the commands the same-host transport carries (the others go over HTTP)
COMMANDS = (C.Sample, C.Extend, C.UpdatePriority)
#: :func:`run`'s answer for a call that must go over HTTP after all
HTTP = object()
#: a server whose same-host transport a client has not looked at yet
UNRESOLVED = object()


def run(link: ShmLink, command: C.Command[Any], *, strict: bool = False) -> Any:
    """Execute ``command`` (one of :data:`COMMANDS`) over ``link``; :data:`HTTP` when an
    extend's rows do not fit the table's layout (HTTP's answer names what is wrong), or
    a slot would pass the server's shared-memory limits (HTTP has its own; ``strict``:
    the limit's error is raised instead)."""
    chan = link.channel()
    if isinstance(command, C.Sample):
        alloc = None if command.lease else command.alloc
        try:
            return chan.sample(command.table, command.batch_size, command.wait or 0.0, alloc)
        except errors.InsufficientStorage as err:
            if strict or err.field != "batch_size":
                raise
            return HTTP  # a slot that big is past the shared-memory limits: HTTP carries it
    if isinstance(command, C.Extend):
        index = chan.extend(
            command.table, command.data, command.wait or 0.0, command.request_id, strict=strict
        )
        return HTTP if index is None else index
    if isinstance(command, C.UpdatePriority):
        payload = json.loads(bytes(command.request().body or b"{}"))
        return chan.update_priority(command.table, payload)
    raise TypeError(f"the same-host transport does not carry {type(command).__name__}")


def in_doubt(
    err: errors.TransportError, over_shm: errors.TransportError | None
) -> errors.TransportError:
    """The error of a call whose HTTP try failed with ``err`` after its shared-memory try
    failed with ``over_shm``: if the socket may have carried the request to the server, so
    may the call have (``sent``), whatever the HTTP try says (a sharded extend must then
    not go to another server: it may be stored already)."""
    shm_sent = isinstance(over_shm, errors.ConnectionFailed) and over_shm.sent
    if shm_sent and isinstance(err, errors.ConnectionFailed) and not err.sent:
        return errors.ConnectionFailed(
            f"{err} (after the shared-memory socket broke mid-call: {over_shm})",
            url=err.url,
            sent=True,
        )
    return err


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
        )
        try:
            found.channel()
            link = found
        except errors.ReplayError as err:
            why = str(err)
    if link is None and settings.transport == "shm":
        raise ShmUnavailable(f"{settings.urls[shard]}: no shared-memory transport: {why}")
    return link
