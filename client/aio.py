"""``AsyncReplayClient``: the asyncio twin of :class:`~tdreplay.client.ReplayClient`.

    >>> async with AsyncReplayClient("http://replay:8000") as client:  # doctest: +SKIP
    ...     await client.extend("cartpole", rollout)
    ...     batch = await client.sample("cartpole", 256)

Same calls, same plans (:mod:`~tdreplay.client.core`), same errors; only the
I/O differs: :class:`~tdreplay.client.aio_transport.AsyncTransport`, HTTP/1.1
on an asyncio ``BufferedProtocol`` that receives bodies in place (chosen by
measurement over asyncio streams and ``httpx.AsyncClient``; see that module).
Connections belong to the event loop that opened them; a client used from a
new loop opens new ones. What the twins share (settings, pickling) is
:class:`~tdreplay.client.base.ClientBase`; this module imports
:class:`~tdreplay.client.ReplayClient` only for :meth:`AsyncReplayClient.loader`,
whose fetchers are the blocking loader's threads (the sync client never
imports this module).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import torch

from . import commands as C
from . import errors, shm
from .aio_transport import AsyncTransport
from .aio_writer import AsyncWriter
from .base import ClientBase
from .core import Call, ClientSettings, Gather, Pause, Plan
from .deprecation import warn_close_deprecated
from .loader import Loader, LoaderIterator
from .schema import load_spec
from .stats import flatten
from .sync import ReplayClient

T = TypeVar("T")


class AsyncReplayClient(ClientBase):
    """The asyncio twin of :class:`~tdreplay.client.ReplayClient`: the same calls, awaited.

    Args: as :class:`~tdreplay.client.ReplayClient`. Pickles as its settings.
    """

    def _setup(self, settings: ClientSettings) -> None:
        super()._setup(settings)
        self._transports = [
            AsyncTransport(
                u,
                token=settings.token,
                timeout=settings.timeout,
                connect_timeout=settings.connect_timeout,
                max_idle=settings.max_connections,
            )
            for u in settings.urls
        ]
        self._links: list[Any] = [shm.UNRESOLVED] * len(settings.urls)
        self._link_lock = asyncio.Lock()

    async def _run(self, plan: Plan[T]) -> T:
        result: Any = None
        exc: BaseException | None = None
        while True:
            try:
                step = plan.send(result) if exc is None else plan.throw(exc)
            except StopIteration as stop:
                return stop.value
            result, exc = None, None
            try:
                if isinstance(step, Call):
                    result = await self._call(step)
                elif isinstance(step, Pause):
                    await asyncio.sleep(step.seconds)
                else:
                    result = await self._gather(step)
            except errors.ReplayError as err:
                exc = err

    # ---------------------------------------------------------------- same host
    async def transport(self) -> str:
        """``"shm"`` or ``"http"``: how this client reaches its (first) server (see
        :attr:`ReplayClient.transport <tdreplay.client.ReplayClient.transport>`)."""
        return "shm" if await self._link(0) is not None else "http"

    async def _link(self, shard: int, once: bool = False) -> shm.ShmLink | None:
        link = self._links[shard]
        if link is shm.UNRESOLVED:
            async with self._link_lock:
                if self._links[shard] is shm.UNRESOLVED:
                    self._links[shard] = await self._resolve(shard, once)
                link = self._links[shard]
        return link

    async def _resolve(self, shard: int, once: bool = False) -> shm.ShmLink | None:
        if self.settings.transport == "http":
            return None
        info, why = None, None
        try:
            info = await self._call_http(Call(shard, C.ServerInfo(), once))
        except errors.ServerError as err:  # a server without /v1/info
            why = f"the server does not say where its socket is ({err.status})"
        return await asyncio.to_thread(shm.open_link, self.settings, shard, info, why)

    async def _call(self, call: Call) -> Any:
        """Over shared memory when the server is on this host (the blocking socket call runs in
        a worker thread; batches are copied out of the slot: they own their memory), else HTTP."""
        command = call.command
        in_doubt: errors.TransportError | None = None
        if isinstance(command, shm.COMMANDS) and self.settings.transport != "http":
            link = await self._link(call.shard, call.once)
            if link is not None:
                try:
                    result = await asyncio.to_thread(
                        shm.run, link, command, strict=self.settings.transport == "shm"
                    )
                except errors.TransportError as err:
                    # the next call asks the server anew where its socket is (it may have
                    # restarted: another process, another socket, another instance)
                    self._links[call.shard] = shm.UNRESOLVED
                    if self.settings.transport == "shm":
                        raise
                    in_doubt = err
                    result = shm.HTTP  # the socket failed: this call goes over HTTP
                if result is not shm.HTTP:
                    return result
        try:
            return await self._call_http(call)
        except errors.TransportError as err:
            raise shm.in_doubt(err, in_doubt) from None

    async def _call_http(self, call: Call) -> Any:
        policy, command = call.retry(self.settings.retry), call.command
        start, attempt = time.monotonic(), 0
        while True:
            attempt += 1
            req = command.request()
            try:
                response = await self._transports[call.shard].execute(req)
            except errors.TransportError as err:
                elapsed = time.monotonic() - start
                if not policy.should_retry(err, attempt, elapsed, idempotent=req.idempotent):
                    raise
                await asyncio.sleep(policy.delay(attempt))
                continue
            return command.parse(response)

    async def _gather(self, gather: Gather) -> list[Any]:
        call = self._call_partial if gather.partial else self._call
        return list(await asyncio.gather(*(call(c) for c in gather.calls)))

    async def _call_partial(self, call: Call) -> Any:
        try:
            return await self._call(call)
        except errors.TransportError as err:
            return err

    async def aclose(self) -> None:
        """Close idle connections; the client stays usable."""
        for t in self._transports:
            await t.aclose()
        for link in self._links:
            if isinstance(link, shm.ShmLink):
                link.close()

    async def close(self) -> None:
        """Deprecated alias of :meth:`aclose`, removed in the next release."""
        warn_close_deprecated(self)
        await self.aclose()

    async def __aenter__(self) -> AsyncReplayClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---------------------------------------------------------------- control
    async def health(self) -> dict[str, Any]:
        return await self._run(self._calls.health())

    async def tables(self) -> list[dict[str, Any]]:
        return await self._run(self._calls.tables())

    async def create_table(
        self, spec: dict[str, Any] | str | Path, *, if_absent: bool = False
    ) -> dict[str, Any]:
        return await self._run(self._calls.create_table(load_spec(spec), if_absent))

    async def delete_table(self, table: str) -> None:
        await self._run(self._calls.delete_table(table))

    async def info(self, table: str) -> dict[str, Any]:
        return await self._run(self._calls.info(table))

    async def stats(self, table: str, prefix: str = "buffer/") -> dict[str, float]:
        """See :meth:`ReplayClient.stats`."""
        return flatten(await self.info(table), prefix)

    # ---------------------------------------------------------------- data
    async def extend(self, table: str, data: Any, *, timeout: float | None = None) -> torch.Tensor:
        """See :meth:`ReplayClient.extend`. The rows are sent from their tensors' own
        memory: do not change them until this call has completed (a task running it
        too)."""
        return await self._run(self._calls.extend(table, data, timeout))

    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        as_cls: type | None = None,
    ) -> Any:
        """See :meth:`ReplayClient.sample`."""
        return await self._run(self._calls.sample(table, batch_size, timeout, as_cls))

    async def update_priority(self, table: str, index: Any, priority: Any, key: Any = None) -> int:
        """See :meth:`ReplayClient.update_priority`."""
        return await self._run(self._calls.update_priority(table, index, priority, key))

    async def checkpoint(self, table: str, path: str) -> str | list[str]:
        return await self._run(self._calls.checkpoint(table, path))

    async def restore(self, table: str, path: str) -> dict[str, Any]:
        return await self._run(self._calls.restore(table, path))

    async def export(
        self,
        table: str,
        format: str = "parquet",
        *,
        path: str | None = None,
        dest: str | Path | None = None,
    ) -> Any:
        """See :meth:`ReplayClient.export`."""
        result = await self._run(self._calls.export(table, format, path))
        if path is None and dest is not None:
            if not isinstance(result, bytes):
                raise ValueError("dest= takes one server's export; pass path= when sharded")
            Path(dest).write_bytes(result)
            return Path(dest)
        return result

    # ---------------------------------------------------------------- views and helpers
    async def tensorclass(self, table: str) -> type:
        """See :meth:`ReplayClient.tensorclass`."""
        if table not in self._classes:
            return self._tensorclass(table, await self.info(table))
        return self._classes[table]

    def loader(
        self,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 4,
        device: str | torch.device | None = None,
        as_cls: type | None = None,
        num_batches: int | None = None,
        timeout: float | None = None,
        keep: bool = False,
        stream: bool = False,
    ) -> AsyncLoader:
        """``async for batch in client.loader(...)``: the :class:`Loader`, awaited.

        The fetchers are the sync loader's threads (its buffer pool and CUDA
        staging too); the event loop only awaits the hand-over of each batch.
        """
        sync = ReplayClient._from_settings(self.settings)
        return AsyncLoader(
            Loader(
                sync,
                table,
                batch_size,
                prefetch=prefetch,
                device=device,
                as_cls=as_cls,
                num_batches=num_batches,
                timeout=timeout,
                keep=keep,
                stream=stream,
            )
        )

    def writer(
        self,
        table: str,
        chunk: int = 256,
        *,
        max_delay: float | None = 1.0,
        episode_key: str | None = None,
        end_key: str | None = None,
        timeout: float | None = None,
    ) -> AsyncWriter:
        """``async with client.writer(table) as w: await w.append(step)`` (see :class:`Writer`)."""
        return AsyncWriter(
            self,
            table,
            chunk,
            max_delay=max_delay,
            episode_key=episode_key,
            end_key=end_key,
            timeout=timeout,
        )


_DONE = object()


def _next(it: LoaderIterator) -> Any:
    try:
        return next(it)
    except StopIteration:
        return _DONE


class AsyncLoader:
    """An async iterator over a :class:`Loader`'s batches."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    async def __aiter__(self) -> AsyncIterator[Any]:
        it = iter(self.loader)
        try:
            while True:
                batch = await asyncio.to_thread(_next, it)
                if batch is _DONE:
                    return
                yield batch
        finally:
            it.close()


__all__ = ["AsyncLoader", "AsyncReplayClient", "AsyncTransport"]
