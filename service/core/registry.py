"""The tables a server holds, by name: create, reopen, restore, checkpoint, delete.

Like Reverb's server, the service is a map of tables. The :class:`Registry`
admits every table through one gate (:meth:`Registry.admit`: backend,
Redis connection, bytes), whatever its source - a client's create, a schema
file on start, the spec inside a checkpoint - and holds each as a
:class:`~.handle.TableHandle`. Blocking work runs in the threadpool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path

from starlette.concurrency import run_in_threadpool

from tdreplay.codec import protocol
from tdreplay.storage import (
    SELF_DURABLE_BACKENDS,
    CheckpointError,
    InsufficientStorage,
    InvalidCheckpoint,
    InvalidRequest,
    SchemaError,
    Table,
    TableExists,
    TableSpec,
    find_checkpoint,
    read_checkpoint_metadata,
    resolve_redis_connection,
    table_nbytes,
)

from ..errors import Forbidden
from ..settings import Settings
from .handle import TableHandle, not_found
from .waiting import WaitHook

log = logging.getLogger("tdreplay.service")


class Registry:
    """The served tables, by name.

    Args:
        settings: the server's settings (data root, seeds, pools).
        on_wait: rate-limiter wait hook passed to every handle (metrics).
    """

    def __init__(self, settings: Settings, on_wait: WaitHook | None = None) -> None:
        self.settings = settings
        self.root = Path(settings.root).absolute()
        self._on_wait = on_wait
        self._tables: dict[str, TableHandle] = {}
        self._pending: dict[str, int] = {}  # name -> bytes reserved by a create/restore under way
        #: name -> set when the create/restore of that name under way ended (either way)
        self._settled: dict[str, asyncio.Event] = {}
        self.redis = settings.redis_connections
        #: tables found on start that could not be served (name -> why); their data is kept
        self.failed: dict[str, str] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._tables

    def __len__(self) -> int:
        return len(self._tables)

    def names(self) -> list[str]:
        return sorted(self._tables)

    def handles(self) -> list[TableHandle]:
        return [self._tables[n] for n in self.names()]

    def get(self, name: str) -> TableHandle:
        """The handle of table ``name``.

        Raises:
            TableNotFound: no such table.
        """
        handle = self._tables.get(name)
        if handle is None or not handle.is_open:
            raise not_found(name)
        return handle

    def checkpoint_path(self, name: str) -> Path:
        """Where ``name`` is checkpointed by default: ``<root>/checkpoints/<name>``."""
        return self.root / protocol.CHECKPOINTS / name

    def admit(self, spec: TableSpec) -> int:
        """Check a spec against the server's policy, whatever its source; returns its bytes.

        The one gate every table passes: a client's create, a schema file on
        start, the spec inside a checkpoint being restored.

        Raises:
            Forbidden: the backend is not one this server offers.
            SchemaError: the table would exceed ``max_table_bytes``, or names a
                Redis connection the operator did not configure.
        """
        s = self.settings
        kind = spec.backend.kind
        if kind not in s.allowed_backends:
            raise Forbidden(
                f"this server does not create {kind!r} tables "
                f"(allowed: {', '.join(s.allowed_backends)}; --allowed-backends)",
                table=spec.name,
                field="backend.kind",
                expected=s.allowed_backends,
                got=kind,
            )
        if kind == "redis":
            resolve_redis_connection(spec.name, spec.backend.connection, self.redis)  # type: ignore[union-attr]
        nbytes = table_nbytes(spec)
        if nbytes > s.max_table_bytes:
            raise SchemaError(
                f"table {spec.name!r}: capacity {spec.capacity} x ({spec.item_nbytes} bytes per "
                f"item + bookkeeping) = {nbytes} bytes exceeds the server's limit of "
                f"{s.max_table_bytes} bytes (--max-table-bytes)",
                table=spec.name,
                field="capacity",
                expected=f"<= {s.max_table_bytes} bytes",
                got=nbytes,
            )
        return nbytes

    def total_bytes(self) -> int:
        """Bytes the served tables (and creates under way) allocate, all together."""
        held = sum(table_nbytes(h.table.spec) for h in self._tables.values())
        return held + sum(self._pending.values())

    @contextlib.contextmanager
    def _reserve(self, name: str, nbytes: int = 0, *, replace: bool = False) -> Iterator[None]:
        if name in self._pending or (not replace and name in self._tables):
            raise TableExists(f"table {name!r} already exists", table=name, field="name", got=name)
        if name not in self._tables and len(self._tables) + len(self._pending) >= (
            self.settings.max_tables
        ):
            raise InsufficientStorage(
                f"table {name!r}: the server serves {len(self._tables)} tables, its limit "
                f"(--max-tables {self.settings.max_tables}); delete one first",
                table=name,
                field="name",
                expected=f"<= {self.settings.max_tables} tables",
            )
        # A replacement holds both tables while it runs: the old one counts too.
        total = self.total_bytes() + nbytes
        limit = self.settings.max_total_bytes
        if total > limit:
            raise InsufficientStorage(
                f"table {name!r} needs {nbytes} bytes; with the other tables that is {total} "
                f"bytes, over the server's limit of {limit} bytes (--max-total-bytes)",
                table=name,
                field="capacity",
                expected=f"<= {limit - (total - nbytes)} bytes",
                got=nbytes,
            )
        self._pending[name] = nbytes
        settled = self._settled[name] = asyncio.Event()
        try:
            yield
        finally:
            self._pending.pop(name, None)
            self._settled.pop(name, None)
            settled.set()

    def _install(self, table: Table) -> TableHandle:
        handle = TableHandle(table, self.settings, self._on_wait)
        self._tables[table.name] = handle
        return handle

    async def create(
        self, spec: TableSpec, *, replace: bool = False, if_absent: bool = False
    ) -> TableHandle:
        """Admit and allocate a new table (in the threadpool).

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
            Forbidden, SchemaError: see :meth:`admit`.
            TableExists: a table of that name exists or is being created, or its
                folder is not its own or holds data (without ``replace``); with
                ``if_absent``: the one there has another spec (the message names
                the first difference).
            InsufficientStorage: the tables together would exceed ``max_total_bytes``.
            BackendError: its storage could not be allocated.
        """
        if if_absent:
            found = await self._existing(spec)
            if found is not None:
                return found
        nbytes = self.admit(spec)
        with self._reserve(spec.name, nbytes):
            table = await run_in_threadpool(
                lambda: Table.create(
                    spec,
                    self.root,
                    seed=self.settings.seed,
                    replace=replace,
                    redis=self.redis,
                    preallocate=self.settings.preallocate,
                )
            )
            table.fsync = self.settings.fsync == "always"
            return self._install(table)

    async def _existing(self, spec: TableSpec) -> TableHandle | None:
        """The table of ``spec``'s name if there is one (after a create of it under way
        ended), ``None`` if there is none.

        Raises:
            TableExists: it has another spec.
        """
        while spec.name in self._settled:
            await self._settled[spec.name].wait()
        handle = self._tables.get(spec.name)
        if handle is None:
            return None
        different = handle.table.spec.difference(spec)
        if different is not None:
            where, served, asked = different
            raise TableExists(
                f"table {spec.name!r} exists with another spec ({where}: {served!r} on the "
                f"server, {asked!r} asked)",
                table=spec.name,
                field=where,
            )
        return handle

    async def open(self, spec: TableSpec) -> TableHandle:
        """Admit ``spec`` and reopen its memmap table from disk (or create it; see ``Table.open``).

        Raises:
            TableExists: its data on disk was written under another schema.
            See :meth:`create` for the rest.
        """
        nbytes = self.admit(spec)
        with self._reserve(spec.name, nbytes):
            table = await run_in_threadpool(
                lambda: Table.open(
                    spec,
                    self.root,
                    seed=self.settings.seed,
                    redis=self.redis,
                    fsync=self.settings.fsync == "always",
                    preallocate=self.settings.preallocate,
                )
            )
            return self._install(table)

    async def delete(self, name: str) -> None:
        """Stop serving ``name``, wait for its running calls, and destroy its data."""
        handle = self.get(name)
        await handle.retire()
        if self._tables.get(name) is handle:
            del self._tables[name]
        await run_in_threadpool(handle.table.destroy)

    async def checkpoint(self, name: str, path: Path | None = None) -> Path:
        """Checkpoint ``name`` to ``path`` (default :meth:`checkpoint_path`)."""
        handle = self.get(name)
        with handle.use() as table:
            target = path or self.checkpoint_path(name)
            began = time.monotonic()
            written, rows, nbytes = await handle.call(lambda: _checkpoint(table, target))
        log.info(
            "table %r checkpointed to %s: %d rows, %d bytes in %.2f s",
            name,
            written,
            rows,
            nbytes,
            time.monotonic() - began,
        )
        return written

    async def restore(self, name: str, path: Path | None = None) -> TableHandle:
        """Replace (or create) table ``name`` from the checkpoint at ``path``.

        The checkpoint is restored beside the table being served, which keeps
        serving meanwhile; only once the restore succeeded is the new table
        swapped in and the old one retired (its running calls finish) and
        destroyed. A failed restore changes nothing. Both tables' data is held
        while the restore runs.

        Raises:
            InvalidRequest: no checkpoint there, or it holds another table.
            CheckpointError: the checkpoint could not be read.
            BackendError: the restored table's storage could not be allocated.
        """
        path = path or self.checkpoint_path(name)
        try:
            await run_in_threadpool(find_checkpoint, path)
        except CheckpointError:
            raise InvalidRequest(
                f"no checkpoint of table {name!r} there", table=name, field="path"
            ) from None
        meta = await run_in_threadpool(read_checkpoint_metadata, path)
        raw = meta.get("spec")
        if not isinstance(raw, dict):
            raise InvalidCheckpoint(
                f"the checkpoint at {path.name!r} holds no table spec", table=name
            )
        spec = TableSpec.parse(raw, source=f"checkpoint {path.name!r}")
        held = spec.name
        if held != name:
            raise InvalidRequest(
                f"the checkpoint at {path.name!r} holds table {held!r}, not {name!r}",
                table=name,
                field="path",
                expected=name,
                got=held,
            )
        nbytes = self.admit(spec)
        with self._reserve(name, nbytes, replace=True):
            table = await run_in_threadpool(
                lambda: Table.restore(
                    path, self.root, seed=self.settings.seed, redis=self.redis, expect=spec
                )
            )
            return await self._swap(name, table, "restored")

    async def clear(self, name: str) -> TableHandle:
        """Empty table ``name``: a fresh table of its spec replaces it, as a restore would.

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
        spec = self.get(name).table.spec
        nbytes = self.admit(spec)
        with self._reserve(name, nbytes, replace=True):
            table = await run_in_threadpool(
                lambda: Table.create(
                    spec,
                    self.root,
                    seed=self.settings.seed,
                    redis=self.redis,
                    preallocate=self.settings.preallocate,
                )
            )
            table.fsync = self.settings.fsync == "always"
            return await self._swap(name, table, "cleared")

    async def _swap(self, name: str, table: Table, by: str) -> TableHandle:
        """Serve ``table`` as ``name``; retire (``by``) and destroy the table it replaces."""
        old = self._tables.get(name)
        handle = self._install(table)
        if old is not None:
            await old.retire(by)
            await run_in_threadpool(old.table.destroy)
        return handle

    def needs_checkpoint(self, handle: TableHandle) -> bool:
        """Whether the periodic and shutdown checkpoints include ``handle``'s table: not one
        durable on its own files (memmap; a restart reopens it with every acknowledged row)
        unless ``--checkpoint-durable`` says so."""
        kind = handle.table.spec.backend.kind
        return kind not in SELF_DURABLE_BACKENDS or self.settings.checkpoint_durable

    async def close(self, *, checkpoint: bool = False) -> None:
        """Stop serving every table (checkpointing first, when asked, each that needs it; see
        :meth:`needs_checkpoint`) and close them."""
        for handle in list(self._tables.values()):
            if checkpoint and self.needs_checkpoint(handle):
                try:
                    await self.checkpoint(handle.name)
                except Exception:
                    log.exception("checkpoint of table %r on shutdown failed", handle.name)
            await handle.retire()
            await run_in_threadpool(handle.table.close)
        self._tables.clear()


def _checkpoint(table: Table, target: Path) -> tuple[Path, int, int]:
    """Checkpoint ``table``; the folder written, its rows and its bytes (for the log)."""
    written = table.checkpoint(target)
    nbytes = sum(f.stat().st_size for f in written.rglob("*") if f.is_file())
    return written, table.size, nbytes
