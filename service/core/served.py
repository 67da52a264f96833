"""The tables a server serves, by name, and the one gate they pass.

Like Reverb's server, the service is a map of tables: :class:`Served` is that
map, held by the core (which creates, reopens, restores, clears and deletes
tables: :mod:`.lifecycle`, :mod:`.persistence`). It admits every table through
one gate (:meth:`Served.admit`: backend, Redis connection, bytes), whatever its
source - a client's create, a schema file on start, the spec inside a
checkpoint - reserves its bytes while it is made (:meth:`Served.reserve`) and
holds each as a :class:`~.handle.TableHandle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from starlette.concurrency import run_in_threadpool

from tdreplay.codec import protocol
from tdreplay.storage import (
    SELF_DURABLE_BACKENDS,
    BackendError,
    InsufficientStorage,
    SchemaError,
    Table,
    TableExists,
    TableSpec,
    check_table_bytes,
    resolve_redis_connection,
    table_nbytes,
)

from ..errors import Forbidden
from ..settings import Settings
from ..wire import BufferBudget
from .handle import TableHandle

log = logging.getLogger("tdreplay.service")


class TableEvents(Protocol):
    """What is told of the served tables' events (the server's metrics)."""

    def waited(self, table: str, op: str, seconds: float, timed_out: bool) -> None:
        """A rate-limiter wait ended: its table, operation, seconds, and whether it timed out."""

    def forget(self, table: str) -> None:
        """``table`` is no longer served."""


class Served:
    """The served tables, by name.

    Args:
        settings: the server's settings (data root, seeds, pools).
        events: told of every table's rate-limiter waits and of each table no longer
            served (the metrics).
    """

    def __init__(self, settings: Settings, events: TableEvents | None = None) -> None:
        self.settings = settings
        self.root = Path(settings.root).absolute()
        self._events = events
        #: what the reused buffers of every table and door may hold (``--pooled-bytes``)
        self.buffers = BufferBudget(settings.pooled_bytes)
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
            raise protocol.not_found(name)
        return handle

    def find(self, name: str) -> TableHandle | None:
        """The handle served as ``name``, open or retiring; ``None`` if none."""
        return self._tables.get(name)

    def checkpoint_path(self, name: str) -> Path:
        """Where ``name`` is checkpointed by default: ``<root>/checkpoints/<name>``."""
        return self.root / protocol.CHECKPOINTS / name

    def admit(self, spec: TableSpec) -> int:
        """Check a spec against the server's policy, whatever its source; returns its bytes.

        The one gate every table passes: a client's create, a schema file on
        start, the spec inside a checkpoint being restored.

        Raises:
            Forbidden: the backend is not one this server offers.
            SchemaError: the table would exceed ``max_fields`` or ``max_table_bytes``, or names a
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
        if len(spec.fields) > s.max_fields:
            raise SchemaError(
                f"table {spec.name!r} declares {len(spec.fields)} fields, more than the "
                f"server's limit of {s.max_fields} (--max-fields)",
                table=spec.name,
                field="fields",
                expected=f"<= {s.max_fields} fields",
                got=len(spec.fields),
            )
        return check_table_bytes(spec, s.max_table_bytes)

    def total_bytes(self) -> int:
        """Bytes the served tables (and creates under way) allocate, all together."""
        held = sum(table_nbytes(h.table.spec) for h in self._tables.values())
        return held + sum(self._pending.values())

    @contextlib.contextmanager
    def reserve(self, name: str, nbytes: int = 0, *, replace: bool = False) -> Iterator[None]:
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

    def install(self, table: Table) -> TableHandle:
        """Serve ``table`` under its name (replacing the handle of that name, if any), with the
        server's ``--fsync`` whatever made it: a create, a reopen, a restore, a clear, a load."""
        table.fsync = self.settings.fsync == "always"
        on_wait = None if self._events is None else self._events.waited
        handle = TableHandle(table, self.settings, on_wait, self.buffers)
        self._tables[table.name] = handle
        return handle

    async def settled(self, name: str) -> None:
        """Once no create or replacement of table ``name`` is under way (a :meth:`reserve`
        of it held): a replacement that follows one (a clear, a restore, a load) waits for it."""
        while name in self._settled:
            await self._settled[name].wait()

    async def existing(self, spec: TableSpec) -> TableHandle | None:
        """The table of ``spec``'s name if there is one (after a create of it under way
        ended), ``None`` if there is none.

        Raises:
            TableExists: it has another spec.
        """
        await self.settled(spec.name)
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

    def drop(self, handle: TableHandle) -> None:
        """Stop serving ``handle`` (unless another table was served under its name since)."""
        if self._tables.get(handle.name) is handle:
            del self._tables[handle.name]
            if self._events is not None:
                self._events.forget(handle.name)

    def clear(self) -> None:
        """Serve nothing (the core closed every table)."""
        self._tables.clear()

    def needs_checkpoint(self, spec: TableSpec) -> bool:
        """Whether the periodic and shutdown checkpoints include a table of ``spec``: not one
        durable on its own files (memmap; a restart reopens it with every acknowledged row)
        unless ``--checkpoint-durable`` says so."""
        kind = spec.backend.kind
        return kind not in SELF_DURABLE_BACKENDS or self.settings.checkpoint_durable

    def checkpoints_itself(self, spec: TableSpec) -> bool:
        """Whether this server writes a table of ``spec`` to its default checkpoint
        (:meth:`checkpoint_path`) unasked: periodically or on shutdown, and it needs it."""
        s = self.settings
        return bool(s.checkpoint_every or s.checkpoint_on_shutdown) and self.needs_checkpoint(spec)


class CorePart:
    """What each part of the core (:mod:`.ops`, :mod:`.lifecycle`, :mod:`.persistence`)
    holds and shares: the settings, the served tables, the data root."""

    settings: Settings
    served: Served
    root: Path

    def table(self, name: str | TableHandle) -> TableHandle:
        """The served table ``name`` (a door that looked it up already passes its handle:
        a table is looked up once per request).

        Raises:
            TableNotFound: no such table.
        """
        return name if isinstance(name, TableHandle) else self.served.get(name)

    async def _swap(self, name: str, table: Table, by: str) -> TableHandle:
        """Serve ``table`` as ``name``; retire (``by``) and destroy the table it replaces.

        ``table`` is served once this is called: the old table's data that cannot be deleted
        (its Redis does not answer) is logged, naming what was left, not raised.
        """
        old = self.served.find(name)
        handle = self.served.install(table)
        if old is not None:
            await old.retire(by)
            try:
                await run_in_threadpool(old.table.destroy)
            except BackendError as err:
                log.warning("table %r: the data of the table it replaced was left: %s", name, err)
        return handle
