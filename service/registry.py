"""The tables a server holds, by name; every call is delegated to a :class:`Table`.

Like Reverb's server, the service is a map of tables: a :class:`TableHandle`
wraps one :class:`~tdreplay.storage.Table` with what serving it over HTTP
needs (change events for asynchronous rate-limiter waits, the request-id
memory, the pooled sample bodies), and the :class:`Registry` creates,
restores, checkpoints and deletes them. Blocking table calls run in the
threadpool; nothing here blocks the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import torch
from starlette.concurrency import run_in_threadpool
from tensordict import TensorDictBase

from tdreplay.codec import protocol
from tdreplay.storage import (
    BackendError,
    CheckpointError,
    InsufficientStorage,
    InvalidCheckpoint,
    InvalidRequest,
    RateLimitTimeout,
    SchemaError,
    Table,
    TableExists,
    TableNotFound,
    TableSpec,
    find_checkpoint,
    read_checkpoint_metadata,
    resolve_redis_connection,
    table_nbytes,
)

from .errors import Forbidden, PayloadTooLarge
from .idempotency import RecentRequests
from .settings import Settings
from .waiting import Changes, Op, rate_limited
from .wire import Lease, SampleBuffers, sample_nbytes

log = logging.getLogger("tdreplay.service")

WaitHook = Callable[[str, Op, float, bool], None]
#: calls of one redis table running in worker threads at most (see TableHandle.call)
REDIS_CALLS = 4
T = TypeVar("T")


class TableHandle:
    """A table as the server holds it.

    Args:
        table: the table.
        settings: the server's settings (idempotency memory, buffer pools).
        on_wait: called after every rate-limiter wait with the table, the
            operation, the seconds waited and whether it timed out.
    """

    def __init__(self, table: Table, settings: Settings, on_wait: WaitHook | None = None) -> None:
        self.table = table
        self.name = table.name
        self.changes = Changes(asyncio.get_running_loop())
        table.add_listener(self.changes.notify_threadsafe)
        self.recent = RecentRequests(
            settings.idempotency_size, settings.idempotency_ttl, settings.idempotency_bytes
        )
        self.samples = SampleBuffers(table.spec.torch_schema(), per_size=settings.pooled_buffers)
        self.max_body = settings.max_body_bytes
        kind = table.spec.backend.kind
        self._inline_sample = settings.inline_bytes if kind in ("memory", "shared", "memmap") else 0
        self._inline_extend = settings.inline_bytes if kind in ("memory", "shared") else 0
        self._threads = 0
        # A hung Redis holds each call for its timeout: a few at a time, so that one
        # table cannot take every worker thread from the others (see :meth:`call`).
        self._gate: asyncio.Semaphore | None = None
        self._gate_timeout = 0.0
        if kind == "redis":
            self._gate = asyncio.Semaphore(REDIS_CALLS)
            self._gate_timeout = table.backend.conn.timeout  # type: ignore[attr-defined]
        self.is_open = True
        self._on_wait = on_wait
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifetime -----------------------------------------------------------
    @contextlib.contextmanager
    def use(self) -> Iterator[Table]:
        """Hold the table for one call; a deleted table raises :class:`TableNotFound`."""
        if not self.is_open:
            raise _not_found(self.name)
        self._active += 1
        self._idle.clear()
        try:
            yield self.table
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def retire(self) -> None:
        """Stop serving: refuse new calls, end waits, and return once running calls are done."""
        self.is_open = False
        self.changes.fire()
        await self._idle.wait()

    # -- running table calls ------------------------------------------------
    async def call(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """Run a table call without blocking the event loop.

        In the threadpool, except when ``inline`` (a small, memory-speed call)
        and no worker thread is using the table: then nothing can hold the
        table's locks (every table call of the service goes through here), so
        the call cannot wait, and it runs on the loop, saving the thread hop
        that costs more than the call itself.
        """
        if inline and self._threads == 0:
            return fn()
        if self._gate is not None:
            return await self._gated(fn)
        self._threads += 1
        try:
            return await run_in_threadpool(fn)
        finally:
            self._threads -= 1

    async def _gated(self, fn: Callable[[], T]) -> T:
        """A redis table's call: at most :data:`REDIS_CALLS` in threads at once; a call
        that waits longer than the Redis timeout for its turn fails (the ones ahead are
        stuck on a Redis that does not answer)."""
        assert self._gate is not None
        try:
            await asyncio.wait_for(self._gate.acquire(), self._gate_timeout)
        except TimeoutError:
            conn = self.table.backend.conn  # type: ignore[attr-defined]
            raise BackendError(
                f"table {self.name!r}: {REDIS_CALLS} calls have been waiting on Redis "
                f"{conn.name!r} ({conn.describe()}) for over {self._gate_timeout:g}s "
                "(--redis-timeout); it is hung, overloaded or unreachable",
                table=self.name,
            ) from None
        self._threads += 1
        try:
            return await run_in_threadpool(fn)
        finally:
            self._threads -= 1
            self._gate.release()

    # -- data ---------------------------------------------------------------
    def _waited(self, op: Op) -> Callable[[float, bool], None]:
        def hook(seconds: float, timed_out: bool) -> None:
            if self._on_wait is not None:
                self._on_wait(self.name, op, seconds, timed_out)

        return hook

    def _held_back(self, op: Op, n: int, timeout: float) -> Callable[[], str]:
        def describe() -> str:
            rl = self.table.rate_limiter
            return (
                f"table {self.name!r}: {op} of {n} items held back by the rate limiter for "
                f"{timeout:g}s (size {self.table.size}, inserts {rl.inserts}, samples {rl.samples}, "
                f"min_size_to_sample {rl.min_size_to_sample}, samples_per_insert "
                f"{rl.samples_per_insert}, error_buffer {rl.error_buffer})"
            )

        return describe

    async def _limited(
        self, call: Callable[[], Any], op: Op, n: int, timeout: float, *, inline: bool = False
    ) -> Any:
        async def run(fn: Callable[[], Any]) -> Any:
            return await self.call(fn, inline=inline)

        return await rate_limited(
            call,
            run=run,
            changes=self.changes,
            name=self.name,
            op=op,
            timeout=timeout,
            describe=self._held_back(op, n, timeout),
            is_open=lambda: self.is_open,
            on_wait=self._waited(op),
        )

    async def extend(self, td: TensorDictBase, timeout: float) -> torch.Tensor:
        """``Table.extend``, waiting asynchronously up to ``timeout`` seconds for the rate limiter."""
        with self.use() as table:
            n = td.batch_size[0] if td.batch_dims else 0
            inline = n * table.spec.item_nbytes <= self._inline_extend
            return await self._limited(
                lambda: table.extend(td, timeout=0), "insert", n, timeout, inline=inline
            )

    def check_batch_size(self, n: int) -> None:
        """Refuse a sample size the table or the body limit cannot serve, before any buffer exists."""
        self.table.check_batch_size(n)
        if sample_nbytes(self.table.spec.item_nbytes, n) > self.max_body:
            raise PayloadTooLarge(
                f"table {self.name!r}: a sample of {n} items exceeds the server's body limit "
                f"of {self.max_body} bytes",
                table=self.name,
                field="batch_size",
                got=n,
            )

    async def sample(self, n: int, timeout: float) -> Lease:
        """``Table.sample`` gathered straight into a pooled Arrow IPC body."""
        with self.use() as table:
            self.check_batch_size(n)
            lease = await self.samples.lease(n)

            def draw() -> None:
                table.sample(n, timeout=0, out=lease.out)
                lease.finish()

            inline = sample_nbytes(table.spec.item_nbytes, n) <= self._inline_sample
            await self._limited(draw, "sample", n, timeout, inline=inline)
            return lease

    @property
    def runs_are_exact(self) -> bool:
        """Whether one draw of ``k * n`` items is the same as ``k`` draws of ``n`` (see :meth:`sample_run`).

        It is for every sampler (draws are independent, importance weights are
        normalized over the whole table, queues hand out distinct items) except
        where items are evicted after ``max_times_sampled`` draws: ``k``
        separate draws would see an item removed after the first.
        """
        return self.table.sampler.consumes or not self.table.max_times_sampled

    async def sample_run(self, n: int, k: int, timeout: float) -> memoryview:
        """Up to ``k`` samples of ``n`` items as consecutive Arrow record-batch messages.

        Draws ``k * n`` items in one ``Table.sample`` call and lays them out as
        ``k`` record batches: one thread hop and one table call for many small
        batches. Only for tables where :attr:`runs_are_exact`. When the rate
        limiter allows fewer items, fewer batches come back.
        """
        with self.use() as table:
            self.check_batch_size(n)
            layout = await run_in_threadpool(self.samples.layout, n)
            k = max(1, min(k, table.capacity // n))

            def draw() -> memoryview:
                m = k
                while True:
                    try:
                        batch = table.sample(m * n, timeout=0)
                        break
                    except (RateLimitTimeout, InvalidRequest):
                        if m == 1:
                            raise
                        m //= 2
                return layout.tile(batch, m)

            return await self._limited(draw, "sample", n, timeout)

    async def info(self) -> dict[str, Any]:
        with self.use() as table:
            info = await self.call(table.info)
        info["waiting"] = dict(self.changes.waiting)
        if getattr(self.table.backend, "state", None) == "lost":  # Table.info does not say yet
            info["state"] = "lost"
        else:
            info.setdefault("state", "ok")
        return info


def _not_found(name: str) -> TableNotFound:
    return TableNotFound(f"no table {name!r}", table=name, field="name", got=name)


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
            raise _not_found(name)
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
        try:
            yield
        finally:
            self._pending.pop(name, None)

    def _install(self, table: Table) -> TableHandle:
        handle = TableHandle(table, self.settings, self._on_wait)
        self._tables[table.name] = handle
        return handle

    async def create(self, spec: TableSpec, *, replace: bool = False) -> TableHandle:
        """Admit and allocate a new table (in the threadpool).

        Args:
            spec: the table.
            replace: delete data an earlier table of this name left in its own
                (marked) folder under ``<root>/tables/``; without it such data is
                a :class:`TableExists` error. A folder tdreplay did not create
                for this table is never touched either way.

        Raises:
            Forbidden, SchemaError: see :meth:`admit`.
            TableExists: a table of that name exists or is being created, or its
                folder is not its own or holds data (without ``replace``).
            InsufficientStorage: the tables together would exceed ``max_total_bytes``.
            BackendError: its storage could not be allocated.
        """
        nbytes = self.admit(spec)
        with self._reserve(spec.name, nbytes):
            table = await run_in_threadpool(
                lambda: Table.create(
                    spec, self.root, seed=self.settings.seed, replace=replace, redis=self.redis
                )
            )
            table.fsync = self.settings.fsync == "always"
            return self._install(table)

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
            return await handle.call(lambda: table.checkpoint(target))

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
            old = self._tables.get(name)
            handle = self._install(table)
            if old is not None:
                await old.retire()
                await run_in_threadpool(old.table.destroy)
            return handle

    async def close(self, *, checkpoint: bool = False) -> None:
        """Stop serving every table (checkpointing each first when asked) and close them."""
        for handle in list(self._tables.values()):
            if checkpoint:
                try:
                    await self.checkpoint(handle.name)
                except Exception:
                    log.exception("checkpoint of table %r on shutdown failed", handle.name)
            await handle.retire()
            await run_in_threadpool(handle.table.close)
        self._tables.clear()
