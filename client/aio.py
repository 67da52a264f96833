"""``AsyncReplayClient``: the asyncio twin of :class:`~tdreplay.client.ReplayClient`.

    >>> async with AsyncReplayClient("http://replay:8000") as client:  # doctest: +SKIP
    ...     await client.extend("cartpole", rollout)
    ...     batch = await client.sample("cartpole", 256)

Same calls, same plans (:mod:`~tdreplay.client.plans`), same errors; only the I/O
differs: plans are driven by :class:`~tdreplay.client.driving.AsyncDriver` (awaited)
over :class:`~tdreplay.client.aio_transport.AsyncTransport`, HTTP/1.1 on an asyncio
``BufferedProtocol`` that receives bodies in place (chosen by measurement over asyncio
streams and ``httpx.AsyncClient``; see that module). Connections belong to the event loop
that opened them; a client used from a new loop opens new ones. What the twins share
(settings, pickling) is :class:`~tdreplay.client.base.ClientBase`; this module imports
:class:`~tdreplay.client.ReplayClient` only for :meth:`AsyncReplayClient.loader`, whose
fetchers are the blocking loader's threads (the sync client never imports this module).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch

from ..codec.archive import Packed
from ..codec.protocol import IMPORT_CHUNK, MAX_BATCH_BYTES
from . import datasets, dumps
from .aio_loader import AsyncLoader
from .aio_transport import AsyncTransport
from .aio_writer import AsyncWriter
from .base import ClientBase
from .deprecation import warn_close_deprecated
from .driving import AsyncDriver
from .loader import Loader
from .schema import SpecLike, load_spec
from .settings import ClientSettings
from .stats import flatten
from .steps import Plan
from .sync import ReplayClient

T = TypeVar("T")


class AsyncReplayClient(ClientBase):
    """The asyncio twin of :class:`~tdreplay.client.ReplayClient`: the same calls, awaited.

    Args: as :class:`~tdreplay.client.ReplayClient`. Pickles as its settings.
    """

    def _setup(self, settings: ClientSettings) -> None:
        super()._setup(settings)
        self._driver = AsyncDriver(settings)
        # what every loader's fetcher threads call, made by the first loader (the
        # client's own calls never use it); closed with this client
        self._blocking: ReplayClient | None = None

    def _run(self, plan: Plan[T] | Generator[Any, Any, T]) -> Coroutine[Any, Any, T]:
        """Drive a plan (:mod:`.plans`, :mod:`.route`): each step performed, awaited."""
        return self._driver.run(plan)

    async def transport(self) -> str:
        """``"shm"`` or ``"http"``: how this client reaches its (first) server (see
        :attr:`ReplayClient.transport <tdreplay.client.ReplayClient.transport>`)."""
        return "shm" if await self._driver.link(0) is not None else "http"

    async def aclose(self) -> None:
        """Close idle connections (its loaders' too); the client stays usable."""
        if self._blocking is not None:
            self._blocking.close()
        await self._driver.aclose()

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
        return await self._run(self._plans.health())

    async def tables(self) -> list[dict[str, Any]]:
        return await self._run(self._plans.tables())

    async def create_table(self, spec: SpecLike, *, if_absent: bool = False) -> dict[str, Any]:
        return await self._run(self._plans.create_table(load_spec(spec), if_absent))

    async def clear(self, table: str) -> dict[str, Any]:
        """See :meth:`ReplayClient.clear`."""
        return await self._run(self._plans.clear(table))

    async def delete_table(self, table: str) -> None:
        await self._run(self._plans.delete_table(table))

    async def info(self, table: str) -> dict[str, Any]:
        return await self._run(self._plans.info(table))

    async def stats(self, table: str, prefix: str = "buffer/") -> dict[str, float]:
        """See :meth:`ReplayClient.stats`."""
        return flatten(await self.info(table), prefix)

    # ---------------------------------------------------------------- data
    async def extend(
        self,
        table: str | Mapping[str, float | None],
        data: Any,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> Any:
        """See :meth:`ReplayClient.extend` (several tables, ``request_id`` too). The rows are
        sent from their tensors' memory: keep them as they are until this call completes."""
        if isinstance(table, Mapping):
            return await self._run(self._plans.insert(dict(table), data, timeout, request_id))
        return await self._run(self._plans.extend(table, data, timeout, request_id))

    async def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        as_cls: type | None = None,
    ) -> Any:
        """See :meth:`ReplayClient.sample`; the batch always owns its memory here (the
        shared-memory slot is copied into it once)."""
        return await self._run(self._plans.sample(table, batch_size, timeout, as_cls))

    async def remove(self, table: str, index: Any, key: Any = None) -> int:
        """See :meth:`ReplayClient.remove`."""
        return await self._run(self._plans.remove(table, index, key))

    async def read(self, table: str, index: Any) -> Any:
        """See :meth:`ReplayClient.read`."""
        return await self._run(self._plans.read(table, index))

    async def update_priority(self, table: str, index: Any, priority: Any, key: Any = None) -> int:
        """See :meth:`ReplayClient.update_priority`."""
        return await self._run(self._plans.update_priority(table, index, priority, key))

    async def checkpoint(self, table: str, path: str) -> str | list[str]:
        return await self._run(self._plans.checkpoint(table, path))

    async def restore(self, table: str, path: str) -> dict[str, Any]:
        return await self._run(self._plans.restore(table, path))

    async def dump(self, table: str, path: str | Path, *, progress: bool | None = None) -> Path:
        """See :meth:`ReplayClient.dump`."""
        return await self._run(dumps.dump_into(self._plans, table, path, progress))

    async def load(
        self, table: str, path: str | Path, *, progress: bool | None = None
    ) -> dict[str, Any]:
        """See :meth:`ReplayClient.load`."""
        archives = await asyncio.to_thread(dumps.read, path, len(self.urls))
        return await self._run(self._plans.load(table, archives, progress))

    async def dump_archives(self, table: str) -> list[bytes]:
        """See :meth:`ReplayClient.dump_archives`."""
        return await self._run(self._plans.dump(table))

    async def load_archives(self, table: str, archives: Sequence[bytes | Packed]) -> dict[str, Any]:
        """See :meth:`ReplayClient.load_archives`."""
        return await self._run(self._plans.load(table, archives))

    async def export(
        self,
        table: str,
        format: str | None = None,
        *,
        path: str | None = None,
        dest: str | Path | None = None,
        dataset_id: str | None = None,
        env_spec: Any = None,
        progress: bool | None = None,
        replace: bool = True,
    ) -> Any:
        """See :meth:`ReplayClient.export`: over this client's own transport (a file
        streamed into place as the body arrives; a Minari dataset converted in a
        worker thread)."""
        return await self._run(
            datasets.export(
                self._plans, table, format, path, dest, dataset_id, env_spec, progress, replace
            )
        )

    async def import_parquet(
        self,
        table: str,
        source: str | Path,
        *,
        columns: dict[str, str] | None = None,
        ignore_extra: bool = False,
        chunk: int = IMPORT_CHUNK,
        progress: bool | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> int:
        """See :meth:`ReplayClient.import_parquet`: files read in a worker thread, rows
        sent over this client's own transport."""
        plan = datasets.import_parquet(
            self._plans,
            table,
            source,
            columns=columns,
            ignore_extra=ignore_extra,
            chunk=chunk,
            progress=progress,
            max_batch_bytes=max_batch_bytes,
        )
        return await self._run(plan)

    async def import_dataset(
        self,
        table: str,
        dataset_id: str,
        *,
        format: str = "minari",
        root: str | Path | None = None,
        chunk: int = IMPORT_CHUNK,
        trajectory_key: str | None = None,
        progress: bool | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> int:
        """See :meth:`ReplayClient.import_dataset` (read as :meth:`import_parquet` is)."""
        plan = datasets.import_dataset(
            self._plans,
            table,
            dataset_id,
            format=format,
            root=root,
            chunk=chunk,
            trajectory_key=trajectory_key,
            progress=progress,
            max_batch_bytes=max_batch_bytes,
        )
        return await self._run(plan)

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
        prefetch: int | None = None,
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
        All of this client's loaders share one blocking client, whose connections
        :meth:`aclose` closes.
        """
        if self._blocking is None:
            self._blocking = ReplayClient._from_settings(self.settings)
        return AsyncLoader(
            Loader(
                self._blocking,
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
        max_pending: int = 8,
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
            max_pending=max_pending,
        )


__all__ = ["AsyncLoader", "AsyncReplayClient", "AsyncTransport"]
