"""How one call reaches its server, written once for both twins (no I/O here).

:func:`transmit` is the plan of one :class:`~tdreplay.client.plans.Call` on the
wire: over the server's same-host socket when it is on this host and the
command goes that way (:data:`~tdreplay.client.shm.CARRIED`), else over HTTP
under the retry policy; when the socket fails (``transport="auto"``) the call
goes over HTTP, and the next call asks the server anew where its socket is.
:func:`resolve` is the plan that finds that socket. Both yield the steps below
and the drivers (:mod:`~tdreplay.client.driving`: the blocking twin's and the
asyncio twin's) only perform them: block or await, sleep or ``asyncio.sleep``. The retry loop, the fallback and what a
failed call may have done (:func:`~tdreplay.client.errors.in_doubt`) exist once.

    >>> from tdreplay.client.settings import ClientSettings
    >>> from tdreplay.client import commands as C
    >>> settings = ClientSettings(urls=("http://127.0.0.1:1",), transport="http")
    >>> plan = transmit(Call(0, C.Health()), settings, [None])
    >>> step = next(plan)
    >>> type(step).__name__, step.request.target
    ('OverHttp', '/healthz')
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from . import commands as C
from . import errors, shm
from .settings import ClientSettings
from .steps import Call, Pause


@dataclass(frozen=True)
class Link:
    """The driver's link to server ``shard``'s same-host socket (resolved once with
    :func:`resolve` and kept): a :class:`~tdreplay.client.shm.ShmLink`, or ``None``."""

    shard: int
    once: bool = False


@dataclass(frozen=True)
class OpenLink:
    """Connect the link the server's info allows (:func:`~tdreplay.client.shm.open_link`)."""

    shard: int
    info: dict[str, Any] | None
    why: str | None


@dataclass(frozen=True)
class OverShm:
    """Run ``command`` over ``link`` (:func:`~tdreplay.client.shm.run`)."""

    link: shm.ShmLink
    command: C.Command[Any]
    strict: bool


@dataclass(frozen=True)
class OverHttp:
    """Send ``request`` to server ``shard``; the answer is its :class:`~.commands.Response`."""

    shard: int
    request: C.Request


Wire = Link | OpenLink | OverShm | OverHttp | Pause


def transmit(call: Call, settings: ClientSettings, links: list[Any]) -> Generator[Wire, Any, Any]:
    """The plan of ``call`` on the wire; ``links`` is the driver's list of links by server
    (a failed socket's entry is set back to :data:`~tdreplay.client.shm.UNRESOLVED`)."""
    command = call.command
    failed: errors.TransportError | None = None
    if settings.transport != "http" and command.op in shm.CARRIED:
        link = yield Link(call.shard, call.once)
        if link is not None:
            try:
                result = yield OverShm(link, command, settings.transport == "shm")
            except errors.TransportError as err:
                # the next call asks the server anew where its socket is (it may have
                # restarted: another process, another socket, another instance)
                links[call.shard] = shm.UNRESOLVED
                if settings.transport == "shm":
                    raise
                failed, result = err, shm.HTTP  # the socket failed: this call goes over HTTP
            if result is not shm.HTTP:
                return result
    return (yield from over_http(call, settings, failed))


def over_http(
    call: Call, settings: ClientSettings, failed: errors.TransportError | None = None
) -> Generator[Wire, Any, Any]:
    """``call`` over HTTP, retried as its policy says (:meth:`Call.retry`).

    A try that may have reached the server (``failed``, the shared-memory socket's, or
    one of these) leaves the call in doubt: the error raised says it may have been sent
    (:func:`~tdreplay.client.errors.in_doubt`), though the last try was refused.
    """
    policy, command = call.retry(settings.retry), call.command
    start, attempt = time.monotonic(), 0
    while True:
        attempt += 1
        req = command.request()
        try:
            response = yield OverHttp(call.shard, req)
        except errors.TransportError as err:
            if not errors.may_have_arrived(failed):
                failed = err
            err = errors.in_doubt(err, failed)
            elapsed = time.monotonic() - start
            if not policy.should_retry(err, attempt, elapsed, idempotent=req.idempotent):
                raise err from None
            yield Pause(policy.delay(attempt))
            continue
        return command.parse(response)


def resolve(shard: int, once: bool, settings: ClientSettings) -> Generator[Wire, Any, Any]:
    """The link to server ``shard``'s same-host socket, if ``settings.transport`` allows and
    the server is on this host (its ``/v1/info`` says where the socket is); else ``None``.

    Raises:
        ShmUnavailable: ``transport="shm"`` and no link can be made.
    """
    if settings.transport == "http":
        return None
    info, why = None, None
    try:
        info = yield from over_http(Call(shard, C.ServerInfo(), once), settings)
    except errors.ServerError as err:  # a server without /v1/info
        why = f"the server does not say where its socket is ({err.status})"
    return (yield OpenLink(shard, info, why))
