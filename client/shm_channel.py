"""One connection to a server's same-host socket (:class:`Channel`): framing, slots, calls.

:mod:`tdreplay.client.shm` builds links (a channel per thread) and runs
commands on them; the wire is :mod:`tdreplay.codec.shm`.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import threading
import time
from collections import OrderedDict
from typing import Any

import torch
from tensordict import TensorDict, is_tensorclass

from ..codec import protocol
from ..codec.errors import TIMED_OUT
from ..codec.params import bounded
from ..codec.shm import (
    HEADER,
    IDLE_ENDED,
    MAX_FRAME,
    VERSION,
    ShmProtocolError,
    SlotLayout,
    extend_frame,
    extended_length,
    frame,
    frame_length,
    read_reply,
    release_frame,
    sample_frame,
)
from ..system import Poller, host_id
from . import errors
from .batches import as_batch
from .commands import Alloc
from .shm_slots import Mapped, Views, fill

#: slot numbers a connection uses at most (the server's bound)
MAX_SLOTS = 256
#: bytes the first read of a reply asks for (a hot reply fits; a bigger one is read on)
FIRST_READ = 4096


class ShmUnavailable(errors.ConnectionFailed):
    """The same-host transport cannot be used here (no socket, another host, another
    server, no memfd): the request was never sent (``sent`` is false), so a sharded
    extend may go to another server."""


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


class Channel:
    """One connection to the server's socket (one thread's; not thread safe)."""

    def __init__(
        self,
        path: str,
        token: str | None,
        timeout: float,
        lease_slots: int,
        instance: str | None = None,
        poll_us: int = 0,
    ) -> None:
        self.timeout = timeout
        self.lease_slots = lease_slots
        self._poller = Poller(poll_us * 1e-6)
        #: seconds the last answer took to come (an answer polled for: one that came soon)
        self._waited = math.inf
        #: held by a call (:func:`~tdreplay.client.shm.run`); ``closing``: close when it ends
        self.in_use, self.closing = threading.Lock(), False
        # every attribute close() reads is set before anything can fail (__del__ calls it)
        self._slots: dict[int, Mapped] = {}
        #: slot numbers by (op, table, batch size), least recently used first
        self._numbers: OrderedDict[tuple[Any, ...], list[int]] = OrderedDict()
        self._turn: dict[tuple[Any, ...], int] = {}
        self._free: list[int] = []
        self._next = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(bounded(timeout))
        try:
            self.sock.connect(path)
        except OSError as err:
            self.sock.close()
            raise ShmUnavailable(f"cannot connect to {path}: {err}") from None
        #: the socket without a timeout, for polling (a read with one waits in the kernel)
        self._now = socket.socket(fileno=os.dup(self.sock.fileno()))
        self._now.setblocking(False)
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
    def call(
        self, message: dict[str, Any] | bytes, *, wait: float, limit: int = MAX_FRAME
    ) -> tuple[dict[str, Any], int]:
        """Send ``message`` (a JSON request, or a binary request's frame), read the reply
        (of at most ``limit`` bytes) and the descriptor it carries (``-1``: none)."""
        self.sock.settimeout(bounded(self.timeout + wait))
        try:
            self.sock.sendall(message if isinstance(message, bytes) else frame(message))
            body, fds = self._recv_frame(limit)
        except (OSError, ShmProtocolError) as err:
            said = self._said() if isinstance(err, OSError) else None
            self.close()
            if said is not None:  # the server timed the connection out and ran nothing
                if said.field == IDLE_ENDED:  # before this request's first byte
                    raise _idle_ended(said) from None
                raise said from None  # part of it came (--body-timeout): its answer, 408
            raise errors.ConnectionFailed(f"shared-memory socket: {err}", sent=True) from None
        fd = fds[0] if fds else -1
        for extra in fds[1:]:
            os.close(extra)
        try:
            reply = read_reply(body)
        except ShmProtocolError as err:
            if fd >= 0:
                os.close(fd)
            self.close()
            raise errors.ProtocolError(f"shared-memory socket: {err}") from None
        if not reply.get("ok"):
            if fd >= 0:
                os.close(fd)
            refused = _error(reply)
            if refused.status == TIMED_OUT:  # a time limit ended the connection: the next
                self.close()  # call connects anew
                if refused.field == IDLE_ENDED:  # before it read this call's request
                    raise _idle_ended(refused)
            raise refused
        return reply, fd

    def _said(self) -> errors.ServerError | None:
        """The time limit's error the server ended the connection with, if it lies unread (a
        call's request could not be sent, or not all of it: the server had closed the
        connection). Such an error (408) says the server ran nothing of the request."""
        try:
            data = self._now.recv(FIRST_READ)
            n = frame_length(data[: HEADER.size]) if len(data) >= HEADER.size else -1
            reply = read_reply(data[HEADER.size :]) if len(data) == HEADER.size + n else None
        except (OSError, ShmProtocolError):
            return None
        if reply is None or reply.get("ok") or reply.get("status") != TIMED_OUT:
            return None
        return _error(reply)

    def _recv_frame(self, limit: int) -> tuple[bytes, list[int]]:
        """One reply frame's body and the descriptors that came with it, read with as few
        system calls as it takes (a hot reply: one).

        When the last answer came within the poll window, the socket is polled that long
        before the read sleeps in the kernel (:class:`tdreplay.system.Poller`): a thread
        calling in a tight loop is not left idle to be woken for each answer."""
        began = time.perf_counter()
        got = None
        if self._poller.ready(self._waited):
            now = self._now
            got = self._poller.read(lambda: socket.recv_fds(now, FIRST_READ, 4))
        data, fds, _, _ = got if got is not None else socket.recv_fds(self.sock, FIRST_READ, 4)
        self._waited = time.perf_counter() - began
        if not data:
            raise ConnectionResetError("the server closed the connection")
        try:
            if len(data) < HEADER.size:
                data += self._recv_exactly(HEADER.size - len(data))
            n = frame_length(data[: HEADER.size], limit)
            body = data[HEADER.size :]
            if len(body) < n:
                body += self._recv_exactly(n - len(body))
            elif len(body) > n:  # the server answers one request with one frame
                raise ShmProtocolError("the server sent more than the reply")
        except BaseException:
            for fd in fds:
                os.close(fd)
            raise
        return body, list(fds)

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
            self.call(release_frame(number), wait=0)
            self._free.append(number)
        self._turn.pop(key, None)

    def _forget(self, number: int) -> None:
        """A slot the server no longer has as this side does: map it anew next time."""
        self._slots.pop(number, None)

    def _map(self, reply: dict[str, Any], fd: int, number: int) -> Mapped:
        if fd >= 0:
            try:
                nbytes = int(reply["nbytes"])
                layout = SlotLayout.from_json(reply["layout"], int(reply["rows"]), limit=nbytes)
            except (KeyError, TypeError, ValueError, ShmProtocolError) as err:
                os.close(fd)
                raise errors.ProtocolError(f"bad shared-memory slot: {err}") from None
            self._slots[number] = Mapped(fd, nbytes, layout)
        mapped = self._slots.get(number)
        if mapped is None:
            raise errors.ProtocolError(f"the server answered for slot {number}, never sent")
        return mapped

    # -- operations ---------------------------------------------------------
    def sample(self, table: str, batch_size: int, wait: float, alloc: Alloc | None) -> TensorDict:
        """A batch viewing this thread's next slot for ``(table, batch_size)`` (see the lease),
        or, with ``alloc``, a copy in the buffer it gives (the loader's own buffers)."""
        number = self._number(("sample", table, batch_size), self.lease_slots)
        message = sample_frame(table, slot=number, batch_size=batch_size, timeout=wait)
        reply, fd = self.call(message, wait=wait)
        mapped = self._map(reply, fd, number)
        if alloc is None:
            return mapped.batch_of(mapped.views.intact().columns)
        layout = mapped.layout
        buf = alloc(layout.nbytes)
        kept = getattr(alloc, "kept", None)  # a buffer that outlives the batch keeps its views
        into = kept(layout, buf, lambda: Views(layout, buf)) if kept else Views(layout, buf)
        into = into.intact()
        if layout.nbytes:  # the slot's views too: a leased batch of this slot may have moved
            into.flat.copy_(mapped.views.intact().flat)
        return mapped.batch_of(into.columns)

    def extend(
        self, table: str, data: Any, wait: float, request_id: str, *, strict: bool = False
    ) -> torch.Tensor | None:
        """Insert ``data``; ``None`` when it does not fit the table's slot layout exactly
        (the caller sends it over HTTP, whose answer names what is wrong), a request id no
        binary frame carries (HTTP's answer is the contract's), or a slot that big would
        exceed the connection's shared memory (HTTP carries it)."""
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
            if mapped.layout.rows < n or not fill(mapped, td, n):
                return None  # more rows than the table holds, or keys that do not fit: HTTP says
            try:
                message = extend_frame(
                    table, slot=number, rows=n, timeout=wait, request_id=request_id
                )
            except ValueError:  # an id no frame carries: HTTP, whose answer is the contract's
                return None
            try:  # the answer names each row's slot: past MAX_FRAME for 8 Mi rows
                reply, _ = self.call(message, wait=wait, limit=max(MAX_FRAME, extended_length(n)))
            except errors.InvalidRequest as err:
                if err.field != "slot" or attempt:
                    raise
                self._forget(number)  # the table was replaced since the slot was laid out
                continue
            return torch.frombuffer(bytearray(reply["index"]), dtype=torch.int64)
        return None

    def update_priority(self, table: str, payload: dict[str, Any]) -> int:
        reply, _ = self.call({"op": "update_priority", "table": table, **payload}, wait=0)
        return int(reply["updated"])

    def __del__(self) -> None:
        self.close()

    def close(self) -> None:
        self._slots.clear()
        self._numbers.clear()
        for name in ("sock", "_now"):  # socket() itself may have failed (no descriptors)
            sock = getattr(self, name, None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


def _idle_ended(said: errors.ServerError) -> errors.ConnectionFailed:
    """The server ended the connection as idle (``said``) before it read a call's request:
    a connection lost with the request unread, so a retry (or HTTP) may carry it."""
    return errors.ConnectionFailed(f"shared-memory socket: the server ended it: {said}", sent=False)


def _error(reply: dict[str, Any]) -> errors.ServerError:
    """The error of a failed ``reply``: its body's type, with the HTTP status the reply gives
    (where a limit answers with its own, as a time limit's 408), else the type's."""
    body = reply.get("error")
    body = body if isinstance(body, dict) else {"type": "InternalError", "detail": str(body)}
    status = reply.get("status")
    if type(status) is not int or not 400 <= status < 600:
        status = protocol.ERROR_STATUS.get(str(body.get("type")), 500)
    return errors.from_response(status, json.dumps(body).encode())
