"""The tables' lifecycle, part of the core: create, reopen, clear, delete, list, close.

Each operation admits a table through the one gate (:meth:`.served.Served.admit`),
reserves its bytes while it is made, and swaps it in or out of the served map;
blocking work runs in the threadpool.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool

from tdreplay.storage import Table, TableClosed, TableNotFound, TableSpec

from ..errors import hide_root
from .handle import TableHandle
from .served import CorePart

log = logging.getLogger("tdreplay.service")


class TableOps(CorePart):
    """Create, reopen, clear, delete, list and close the tables of :class:`~.ops.Core`."""

    if TYPE_CHECKING:  # the core's persistence part's

        async def checkpoint_to(self, name: str, path: Path | None = None) -> Path: ...

    async def create(
        self, spec: TableSpec, *, replace: bool = False, if_absent: bool = False
    ) -> dict[str, Any]:
        """Admit and allocate a new table (in the threadpool); returns its info.

        Args:
            spec: the table.
            replace: delete data an earlier table of this name left in its own
                (marked) folder under ``<root>/tables/``; without it such data is
                a :class:`TableExists` error. A folder tdreplay did not create
                for this table is never touched either way.
            if_absent: create-if-absent, one operation: a table of that name and
                this spec (being created meanwhile included: this call waits for
                it) is answered as if created; only another spec is an error.
                Many creators racing with one spec all succeed, none sees the
                table missing.

        Raises:
            Forbidden, SchemaError: see :meth:`Served.admit`.
            TableExists: a table of that name exists or is being created, or its
                folder is not its own or holds data (without ``replace``); with
                ``if_absent``: the one there has another spec (the message names
                the first difference).
            InsufficientStorage: the tables together would exceed ``max_total_bytes``.
            BackendError: its storage could not be allocated.
        """
        found = await self.served.existing(spec) if if_absent else None
        if found is None:
            nbytes = self.served.admit(spec)
            with self.served.reserve(spec.name, nbytes):
                found = self.served.install(await self._allocate(spec, replace=replace))
        return await found.info()

    async def _allocate(self, spec: TableSpec, *, replace: bool = False) -> Table:
        """A new, empty table of ``spec`` (admitted and reserved by the caller)."""
        s = self.settings
        return await run_in_threadpool(
            lambda: Table.create(
                spec,
                self.root,
                seed=s.seed,
                replace=replace,
                redis=self.served.redis,
                preallocate=s.preallocate,
            )
        )

    async def open(self, spec: TableSpec) -> TableHandle:
        """Admit ``spec`` and reopen its memmap table from disk (or create it; see ``Table.open``).

        Raises:
            TableExists: its data on disk was written under another schema.
            See :meth:`create` for the rest.
        """
        nbytes = self.served.admit(spec)
        with self.served.reserve(spec.name, nbytes):
            table = await run_in_threadpool(
                lambda: Table.open(
                    spec,
                    self.root,
                    seed=self.settings.seed,
                    redis=self.served.redis,
                    preallocate=self.settings.preallocate,
                )
            )
            return self.served.install(table)

    async def delete(self, name: str) -> None:
        """Stop serving ``name``, wait for its running calls, and destroy its data.

        Raises:
            TableNotFound: no such table.
            BackendError: the server its rows live in (a Redis) does not answer: the table
                is served on, unchanged (dropped, its keys would stay there for good).
        """
        handle = self.table(name)
        await run_in_threadpool(handle.table.backend.ping)
        await handle.retire()
        self.served.drop(handle)
        await run_in_threadpool(handle.table.destroy)

    async def clear(self, name: str) -> dict[str, Any]:
        """Empty table ``name``: a fresh table of its spec replaces it, as a restore would;
        returns its info.

        Atomic for every caller: a call runs on the old table or the new one, and a call
        waiting on the old one's rate limiter ends with :class:`TableClosed`. Durable: a
        memmap table's new, empty state is complete on disk before the old rows are
        deleted, and a restart reopens the newest complete state, so a crash leaves the
        table empty or whole, never half.

        Raises:
            TableNotFound: no such table.
            InsufficientStorage, BackendError: the new table could not be allocated (the
                old one is served on, unchanged).
        """
        await self.served.settled(name)  # a clear or restore under way: this one follows it
        spec = self.table(name).table.spec
        nbytes = self.served.admit(spec)
        with self.served.reserve(name, nbytes, replace=True):
            handle = await self._swap(name, await self._allocate(spec), "cleared")
        return await handle.info()

    async def tables(self) -> dict[str, Any]:
        """Every table's info, and ``unavailable``: tables found on start but not served, and why.

        The infos are taken side by side: each Redis table's state is probed (see
        :meth:`TableHandle.state`); a hung Redis holds them :data:`~.handle.PROBE_WAIT` seconds.
        """

        async def info(handle: TableHandle) -> dict[str, Any] | None:
            try:
                return await handle.info()
            except TableNotFound:  # deleted meanwhile
                return None
            except TableClosed:  # replaced meanwhile (a restore, load or clear): the new one
                replaced = self.served.find(handle.name)
                return None if replaced is None else await info(replaced)

        infos = await asyncio.gather(*(info(h) for h in self.served.handles()))
        listed = [i for i in infos if i is not None]
        why = {name: hide_root(text, self.root) for name, text in self.served.failed.items()}
        return {"tables": listed, "unavailable": why}

    async def info(self, name: str) -> dict[str, Any]:
        """Size, capacity, backend, sampler, writer, counters, rate-limiter state, waiting calls."""
        return await self.table(name).info()

    async def unready_tables(self) -> dict[str, list[str]]:
        """The tables that cannot serve, by their :meth:`TableHandle.state`: ``"lost"`` (a
        Redis that restarted empty) and ``"unreachable"`` (a Redis down, hung or refusing).
        The states are probed side by side: a hung Redis holds the answer for
        :data:`~.handle.PROBE_WAIT` seconds at most."""
        handles = self.served.handles()
        states = await asyncio.gather(*(h.state() for h in handles))
        unready: dict[str, list[str]] = {"lost": [], "unreachable": []}
        for h, state in zip(handles, states, strict=True):
            if state in unready:
                unready[state].append(h.name)
        return unready

    async def close(self, *, checkpoint: bool = False) -> None:
        """Stop serving every table (checkpointing first, when asked, each that needs it; see
        :meth:`Served.needs_checkpoint`) and close them."""
        for handle in self.served.handles():
            if checkpoint and self.served.needs_checkpoint(handle.table.spec):
                try:
                    await self.checkpoint_to(handle.name)
                except Exception:
                    log.exception("checkpoint of table %r on shutdown failed", handle.name)
            await handle.retire()
            await run_in_threadpool(handle.table.close)
        self.served.clear()
