"""The drivers: what performs a plan's steps, written once for both twins but the waiting.

A plan (:mod:`.plans`, :mod:`.route`) yields steps (:mod:`.steps`); a driver performs
each and hands its result, or its error, back to the plan. What each step is, is said
once, in :meth:`Driver.perform`: a blocking function (a call over the same-host socket,
opening that socket's link, the plan's own :class:`~.steps.Work`), an HTTP exchange, a
sleep, the link to a server, a plan run to its end (a :class:`~.steps.Call`: its
:func:`~.route.transmit`), a plan started and not waited on (a :class:`~.steps.Probe`),
or plans run side by side (a :class:`~.steps.Gather`); which errors go back to the plan
is :func:`to_plan`'s rule. The two drivers differ only in how they wait (redis-py's
twins differ only in I/O):

- :class:`BlockingDriver` (:class:`~tdreplay.client.ReplayClient`'s) blocks: blocking
  work in place, ``time.sleep``, a thread per probe, a thread pool for a gather; its
  primitives return the results.
- :class:`AsyncDriver` (:class:`~tdreplay.client.AsyncReplayClient`'s) awaits: blocking
  work in a worker thread, ``asyncio.sleep``, a task per probe, ``asyncio.gather``; its
  primitives return awaitables, and its loop awaits each step's.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from . import errors, forking, route, shm
from .aio_transport import AsyncTransport
from .settings import ClientSettings
from .steps import Call, Gather, Pause, Probe, Work, probing
from .transport import Transport

T = TypeVar("T")
#: what a driver drives: a plan of :mod:`.plans` (:data:`~.steps.Plan`), or one of :mod:`.route`
Driven = Generator[Any, Any, T]


def to_plan(step: Any, err: Exception) -> bool:
    """Whether ``err``, raised performing ``step``, goes back to the plan (thrown in where
    it yielded ``step``): a :class:`~.errors.ReplayError` always, and any error of the
    plan's own :class:`~.steps.Work` (the plan sees it where it happened). Any other
    error is the driver's and ends the call."""
    return isinstance(err, errors.ReplayError) or isinstance(step, Work)


def _unreached_as_result(plan: Driven[Any]) -> Generator[Any, Any, Any]:
    """``plan``, a server that could not be reached (a
    :class:`~.errors.TransportError`) its result instead of its error (a partial
    :class:`~.steps.Gather`'s calls)."""
    try:
        return (yield from plan)
    except errors.TransportError as err:
        return err


class Driver:
    """What both drivers share: the servers' transports and same-host links, and what
    each step is (:meth:`perform`). Subclasses say how to wait: the primitives below
    return a result (blocking) or an awaitable of it (asyncio).

    Args:
        settings: the client's.
        transport: its HTTP transport class (:class:`~.transport.Transport` or
            :class:`~.aio_transport.AsyncTransport`), one per server.
    """

    def __init__(self, settings: ClientSettings, transport: Callable[..., Any]) -> None:
        self.settings = settings
        self.transports = [transport(u, settings) for u in settings.urls]
        #: each server's same-host link: a ShmLink, None (over HTTP), or UNRESOLVED
        self.links: list[Any] = [shm.UNRESOLVED] * len(settings.urls)

    def perform(self, step: Any) -> Any:
        """Perform ``step``: its result (blocking), or an awaitable of it (asyncio).

        Raises:
            TypeError: ``step`` is none of :mod:`.steps`' nor :mod:`.route`'s.
        """
        if isinstance(step, route.OverShm):  # the hot path's steps first
            # strict positional: a keyword forwarded through **kwargs cost ~0.15 us a call here
            return self.blocking(shm.run, step.link, step.command, step.strict)
        if isinstance(step, route.Link):
            return self.link(step.shard, step.once)
        if isinstance(step, Call):
            return self.run(route.transmit(step, self.settings, self.links))
        if isinstance(step, route.OverHttp):
            return self.transports[step.shard].execute(step.request)
        if isinstance(step, Pause):
            return self.sleep(step.seconds)
        if isinstance(step, Probe):  # not waited on: a thread or a task of its own
            return self.start(probing(step))
        if isinstance(step, Work):
            return self.blocking(step.run)
        if isinstance(step, route.OpenLink):
            return self.blocking(shm.open_link, self.settings, step.shard, step.info, step.why)
        if isinstance(step, Gather):
            plans = [route.transmit(c, self.settings, self.links) for c in step.calls]
            return self.concurrently(
                [_unreached_as_result(p) for p in plans] if step.partial else plans
            )
        raise TypeError(f"a plan yielded {step!r}, which is not a step")

    def _close_links(self) -> None:
        for link in self.links:
            if isinstance(link, shm.ShmLink):
                link.close()

    # ------------------------------------------------------------ how each driver waits
    def run(self, plan: Driven[T]) -> Any:
        """Drive ``plan`` to its end: its result (or an awaitable of it)."""
        raise NotImplementedError

    def link(self, shard: int, once: bool = False) -> Any:
        """Server ``shard``'s link (:class:`~.route.Link`), resolved once (:func:`~.route.resolve`)."""
        raise NotImplementedError

    def blocking(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``, which blocks."""
        raise NotImplementedError

    def sleep(self, seconds: float) -> Any:
        raise NotImplementedError

    def start(self, plan: Driven[None]) -> Any:
        """Start ``plan`` and go on at once (a :class:`~.steps.Probe`)."""
        raise NotImplementedError

    def concurrently(self, plans: list[Driven[Any]]) -> Any:
        """The results of ``plans``, run side by side, in order."""
        raise NotImplementedError


class BlockingDriver(Driver):
    """The blocking twin's driver: each step performed in the calling thread. Thread safe."""

    def __init__(self, settings: ClientSettings) -> None:
        super().__init__(settings, Transport)
        self.transports: list[Transport]
        self._link_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None  # a gather's threads, made by the first
        forking.forget_in_child(self)

    def after_fork(self) -> None:
        """In a forked child: the parent's gather threads are not there (a pool of them
        would queue work for them forever), nor its lock holders."""
        self._link_lock = threading.Lock()
        self._pool = None

    def run(self, plan: Driven[T]) -> T:
        result: Any = None
        exc: BaseException | None = None
        while True:
            try:
                step = plan.send(result) if exc is None else plan.throw(exc)
            except StopIteration as stop:
                return stop.value
            result, exc = None, None
            try:
                result = self.perform(step)
            except Exception as err:
                if not to_plan(step, err):
                    raise
                exc = err

    def link(self, shard: int, once: bool = False) -> shm.ShmLink | None:
        link = self.links[shard]
        if link is shm.UNRESOLVED:
            with self._link_lock:
                if self.links[shard] is shm.UNRESOLVED:
                    self.links[shard] = self.run(route.resolve(shard, once, self.settings))
                link = self.links[shard]
        return link

    def blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def start(self, plan: Driven[None]) -> None:
        threading.Thread(target=self.run, args=(plan,), daemon=True).start()

    def concurrently(self, plans: list[Driven[Any]]) -> list[Any]:
        if len(plans) == 1:
            return [self.run(plans[0])]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                max_workers=max(2, len(self.transports)), thread_name_prefix="tdreplay-client"
            )
        futures = [self._pool.submit(self.run, p) for p in plans]
        return [f.result() for f in futures]

    def close(self) -> None:
        """Close idle connections and links, end the gather threads (remade on demand)."""
        for t in self.transports:
            t.close()
        self._close_links()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None


class AsyncDriver(Driver):
    """The asyncio twin's driver: each step awaited. Connections belong to the event loop
    that opened them (:class:`~.aio_transport.AsyncTransport`); so does the lock that
    resolves links, made anew for a new loop."""

    def __init__(self, settings: ClientSettings) -> None:
        super().__init__(settings, AsyncTransport)
        self.transports: list[AsyncTransport]
        self._link_lock: tuple[Any, asyncio.Lock] = (None, asyncio.Lock())  # (its loop, lock)
        self._probing: set[asyncio.Task[None]] = set()  # tries of servers that are down

    async def run(self, plan: Driven[T]) -> T:
        result: Any = None
        exc: BaseException | None = None
        while True:
            try:
                step = plan.send(result) if exc is None else plan.throw(exc)
            except StopIteration as stop:
                return stop.value
            result, exc = None, None
            try:
                result = await self.perform(step)
            except Exception as err:
                if not to_plan(step, err):
                    raise
                exc = err

    async def link(self, shard: int, once: bool = False) -> shm.ShmLink | None:
        link = self.links[shard]
        if link is shm.UNRESOLVED:
            loop = asyncio.get_running_loop()
            if self._link_lock[0] is not loop:  # an asyncio lock waits on one loop only
                self._link_lock = (loop, asyncio.Lock())
            async with self._link_lock[1]:
                if self.links[shard] is shm.UNRESOLVED:
                    plan = route.resolve(shard, once, self.settings)
                    self.links[shard] = await self.run(plan)
                link = self.links[shard]
        return link

    def blocking(self, fn: Callable[..., T], *args: Any) -> Awaitable[T]:
        # a worker thread: the shared-memory socket's calls block (their batches own their memory)
        return asyncio.to_thread(fn, *args)

    def sleep(self, seconds: float) -> Awaitable[None]:
        return asyncio.sleep(seconds)

    async def start(self, plan: Driven[None]) -> None:
        task = asyncio.get_running_loop().create_task(self.run(plan))
        self._probing.add(task)  # a task only the loop holds may be collected midway
        task.add_done_callback(self._probing.discard)

    async def concurrently(self, plans: list[Driven[Any]]) -> list[Any]:
        return list(await asyncio.gather(*(self.run(p) for p in plans)))

    async def aclose(self) -> None:
        """Close idle connections and links (the client stays usable)."""
        for t in self.transports:
            await t.aclose()
        self._close_links()
