"""One served table: its calls run off the event loop, its rate-limited calls wait on the loop.

A :class:`TableHandle` wraps one :class:`~tdreplay.storage.Table` with what serving it
needs, whatever the door a call came through: change events for asynchronous rate-limiter
waits (:mod:`.waiting`), the request-id memory (idempotent extends), the pooled sample
bodies, a gate that keeps a hung Redis from taking every worker thread, and a count of
running calls so a deleted table is destroyed only once they are done.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, TypeVar

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool
from tensordict import TensorDictBase

from tdreplay.codec.ipc import Schema
from tdreplay.storage import (
    InvalidRequest,
    NestedKey,
    SampleTarget,
    Table,
    TableClosed,
    TableNotFound,
    TDReplayError,
)

from ..errors import PayloadTooLarge
from ..idempotency import RecentRequests, RowsFingerprint, request_tag
from ..limits import Hold
from ..settings import Settings
from ..wire import BufferBudget, Lease, SampleBuffers
from .calls import Calls
from .paths import shown_location
from .shape import Place, Shape
from .waiting import Changes, WaitHook, admitted

#: sample shapes a handle keeps, by batch size (a client cycling through more starts anew)
SHAPES = 64
#: seconds :meth:`TableHandle.state` waits for a Redis table's marker probe
PROBE_WAIT = 0.5
T = TypeVar("T")


class TableHandle:
    """A table as the server holds it.

    Args:
        table: the table.
        settings: the server's settings (idempotency memory, buffer pools, limits).
        on_wait: told of every rate-limiter wait (table, operation, seconds, timed out).
        budget: the bytes the server's reused buffers may hold (``--pooled-bytes``).
    """

    def __init__(
        self,
        table: Table,
        settings: Settings,
        on_wait: WaitHook | None = None,
        budget: BufferBudget | None = None,
    ) -> None:
        self.table = table
        self.name = table.name
        #: bytes of one row of the table's fields
        self.item_nbytes = table.spec.item_nbytes
        #: the fields an extend reads values of (a door copies them out of shared buffers)
        self.read_keys = table.read_keys
        self.changes = Changes(asyncio.get_running_loop())
        table.add_listener(self.changes.notify_threadsafe)
        self.recent = RecentRequests(
            settings.idempotency_size, settings.idempotency_ttl, settings.idempotency_bytes
        )
        # a table reopened after a crash: the requests its items came from are answered again
        tagged = table.tagged(settings.idempotency_size) if settings.idempotency_size else {}
        if tagged:
            self.recent.seed({t: slots.numpy().tobytes() for t, slots in tagged.items()})
        self.schema: Schema = dict(table.spec.torch_schema())
        #: what tells a retry from other rows sent under its request id
        self.fingerprint = RowsFingerprint(self.schema)
        #: pooled sample bodies (``.schema``: the fields, the sample info; prioritized: ``max_weight``)
        pooled = settings.pooled_buffers
        self.samples = SampleBuffers(self.schema, table.info_dtypes, pooled, budget=budget)
        #: the shapes of samples into a door's buffers, by batch size (checked once each)
        self._shapes: dict[int, Shape] = {}
        self.max_body = settings.max_body_bytes
        kind = table.spec.backend.kind
        self._inline_sample = settings.inline_bytes if kind in ("memory", "shared", "memmap") else 0
        self._inline_extend = settings.inline_bytes if kind in ("memory", "shared") else 0
        self.calls = Calls(table)
        self.is_open = True
        #: why the table stopped being served (see :meth:`retire`)
        self.retired_by = ""
        self._on_wait = on_wait
        self._active = 0
        self._idle = asyncio.Event()
        self._idle.set()

    # -- lifetime -----------------------------------------------------------
    @contextlib.contextmanager
    def use(self) -> Iterator[Table]:
        """Hold the table for one call; one no longer served raises :meth:`gone`'s error (a
        door's task may run after a restore retired the table it looked up: not a 404)."""
        if (gone := self.gone()) is not None:
            raise gone
        self._active += 1
        self._idle.clear()
        try:
            yield self.table
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def retire(self, by: str = "deleted") -> None:
        """Stop serving: refuse new calls, end waits (with :meth:`gone`'s error), and return
        once running calls are done. ``by``: ``"deleted"``, ``"cleared"`` or ``"restored"``
        (replaced by a restore or a load)."""
        self.is_open = False
        self.retired_by = by
        self.changes.fire()
        await self._idle.wait()
        self._shapes.clear()  # each names this handle: a cycle that kept the table's storage

    def gone(self) -> TDReplayError | None:
        """The error a call waiting on this table ends with, ``None`` while it is served."""
        if self.is_open:
            return None
        if self.retired_by == "deleted":
            return TableNotFound(
                f"table {self.name!r} was deleted while a call waited", table=self.name
            )
        return TableClosed(
            f"table {self.name!r} was {self.retired_by} while a call waited: what it waited "
            "for is gone with the old rows; call again",
            table=self.name,
        )

    # -- running table calls ------------------------------------------------
    async def call(self, fn: Callable[[], T], *, inline: bool = False) -> T:
        """Run a table call without blocking the event loop (see :class:`.calls.Calls`)."""
        return await self.calls.run(fn, inline=inline)

    async def _admitted(
        self,
        attempt: Callable[[], T | None],
        op: str,
        n: int,
        timeout: float,
        *,
        inline: bool,
        left: Callable[[], Awaitable[object]] | None = None,
        hold: Hold | None = None,
    ) -> T:
        async def run() -> T | None:
            return await self.call(attempt, inline=inline)

        return await admitted(
            run,
            table=self.table,
            op=op,
            n=n,
            timeout=timeout,
            changes=self.changes,
            gone=self.gone,
            on_wait=self._on_wait,
            left=left,
            hold=hold,
        )

    # -- data ---------------------------------------------------------------
    async def extend(
        self,
        columns: Mapping[NestedKey, torch.Tensor],
        n: int,
        timeout: float,
        request_id: str | None = None,
        priority: float | None = None,
        hold: Hold | None = None,
    ) -> tuple[torch.Tensor, bool]:
        """``Table.extend`` of flat columns (``n`` rows), waiting asynchronously up to
        ``timeout`` seconds for the rate limiter (counted in ``hold`` while it waits).

        With ``request_id``, a repeat of a recent id inserts nothing and gets the
        first call's slots back (a retry after a lost answer). ``priority``: the new
        items' initial priority (prioritized tables; ``None``: the sampler's).

        Returns:
            The slot of each row (-1: dropped by a max-value writer), and whether this was
            such a repeat.

        Raises:
            InvalidRequest: ``request_id`` is a recent id sent with other rows (another
                count, or other bytes: see :mod:`..idempotency`) or another priority (no
                retry: nothing is inserted).
        """
        with self.use() as table:
            inline = n * table.spec.item_nbytes <= self._inline_extend
            # a repeat with other rows is no retry (refused): the rows and the priority tell
            what = f"{n} rows" + ("" if priority is None else f" at priority {priority:g}")
            if request_id:
                what += f" (CRC-32 {self.fingerprint(columns):08x})"
            tag = request_tag(request_id, what) if request_id else 0
            initial = None if priority is None else torch.tensor([priority], dtype=torch.float64)

            async def insert() -> bytes:
                index = await self._admitted(
                    lambda: table.try_extend(columns, tag=tag, priority=initial),
                    "insert", n, timeout, inline=inline, hold=hold,
                )  # fmt: skip
                return index.numpy().tobytes()  # what the request-id memory keeps: 8 bytes a row

            answer, replayed = await self.recent.run(request_id, insert, what)
            return torch.from_numpy(np.frombuffer(answer, dtype=np.int64).copy()), replayed

    def check_batch_size(self, n: int) -> None:
        """Refuse a sample size the table or the body limit cannot serve, before any buffer exists.

        Raises:
            InvalidRequest: not in ``[1, capacity]`` or not a multiple of the slice length.
            PayloadTooLarge: the sample would exceed the server's body limit.
        """
        self.table.check_batch_size(n)
        self.check_answer(n, "batch_size")

    def check_answer(self, n: int, field: str) -> None:
        """Refuse an answer of ``n`` items (a sample's, a read's) that would exceed the
        server's body limit (``--max-body-bytes``): the one check of every operation that
        answers with items, before anything is read.

        Raises:
            PayloadTooLarge: it would; ``field`` names the parameter that asked for them.
        """
        if self.samples.nbytes(self.item_nbytes, n) > self.max_body:
            raise PayloadTooLarge(
                f"table {self.name!r}: {n} items exceed the server's body limit of "
                f"{self.max_body} bytes (--max-body-bytes); ask for fewer at a time",
                table=self.name,
                field=field,
                expected=f"<= {self.max_body} bytes",
                got=n,
            )

    async def sample(
        self, n: int, timeout: float, left: Callable[[], Awaitable[object]] | None = None
    ) -> Lease:
        """``Table.sample`` gathered straight into a pooled Arrow IPC body; a wait for the
        rate limiter ends once ``left()`` returns (the caller is gone, see ``admitted``)."""
        with self.use() as table:
            self.check_batch_size(n)
            lease = await self.samples.lease(n)
            buffer = lease.buffer
            if buffer.target is None:  # checked once per pooled body
                buffer.target = table.target(lease.out, n)
            await self._draw(table, n, timeout, buffer.target, left)
            lease.finish()
            return lease

    def sample_to(self, n: int, timeout: float, place: Place) -> Shape | Awaitable[Shape]:
        """Sample ``n`` items into the buffers ``place`` gives for the sample's :class:`Shape`
        (e.g. a shared-memory slot, laid out once and reused): the batch size is checked
        here, once per size, and the door never touches the table.

        A small sample the rate limiter lets through is drawn at once, on the event loop:
        the :class:`Shape` comes back, with no task, thread or wait. Otherwise an awaitable
        of it comes back, which waits for the rate limiter (and gathers in a thread when
        the sample is big).

        Raises:
            InvalidRequest: ``n`` does not fit the table, or what ``place`` gives does not fit.
            TableNotFound, TableClosed: the table is no longer served (see :meth:`gone`).
        """
        if (gone := self.gone()) is not None:  # the draw's task holds it later: checked again
            raise gone
        shape = self._shapes.get(n)
        if shape is None:
            shape = self._sample_shape(n)
        out = place(shape)
        if shape.inline and self.calls.idle and self.table.try_sample(n, out=out) is not None:
            return shape
        return self._sample_later(shape, timeout, out)

    def _sample_shape(self, n: int) -> Shape:
        n = self.table.check_batch_size(n)
        inline = self.samples.nbytes(self.item_nbytes, n) <= self._inline_sample
        target = functools.partial(self.table.target, batch_size=n)
        shape = Shape(self, n, self.samples.schema, self.item_nbytes, target, inline)
        if len(self._shapes) >= SHAPES:
            self._shapes.clear()
        self._shapes[n] = shape
        return shape

    async def _sample_later(
        self, shape: Shape, timeout: float, out: TensorDictBase | SampleTarget
    ) -> Shape:
        with self.use() as table:
            await self._draw(table, shape.rows, timeout, out)
            return shape

    def extend_shape(self, rows: int) -> Shape:
        """The :class:`Shape` of buffers for extends of up to ``rows`` rows (at most the capacity)."""
        with self.use() as table:
            return Shape(self, min(rows, table.capacity), self.schema, self.item_nbytes)

    async def _draw(
        self,
        table: Table,
        n: int,
        timeout: float,
        out: TensorDictBase | SampleTarget,
        left: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        def draw() -> TensorDictBase | None:
            return table.try_sample(n, out=out)

        inline = self.samples.nbytes(self.item_nbytes, n) <= self._inline_sample
        await self._admitted(draw, "sample", n, timeout, inline=inline, left=left)

    @property
    def runs_are_exact(self) -> bool:
        """Whether one draw of ``k * n`` items is the same as ``k`` draws of ``n`` (see :meth:`sample_run`).

        It is for every sampler (draws are independent, importance weights are
        normalized over the whole table, queues hand out distinct items) except
        where items are evicted after ``max_times_sampled`` draws: ``k``
        separate draws would see an item removed after the first.
        """
        return self.table.sampler.consumes or not self.table.max_times_sampled

    async def sample_run(
        self, n: int, k: int, timeout: float, left: Callable[[], Awaitable[object]] | None = None
    ) -> memoryview:
        """Up to ``k`` samples of ``n`` items as consecutive Arrow record-batch messages.

        Draws ``k * n`` items in one ``Table.sample`` call and lays them out as
        ``k`` record batches: one thread hop and one table call for many small
        batches. Only for tables where :attr:`runs_are_exact`. When the rate
        limiter allows fewer items, fewer batches come back.
        """
        with self.use() as table:
            self.check_batch_size(n)
            layout = await self.samples.layout(n)
            k = max(1, min(k, table.capacity // n))

            def draw() -> memoryview | None:
                m = k
                while True:
                    try:
                        batch = table.try_sample(m * n)
                    except InvalidRequest:  # m * n items can never pass the rate limiter
                        if m == 1:
                            raise
                        batch = None
                    if batch is not None:
                        return layout.tile(batch, m)
                    if m == 1:
                        return None
                    m //= 2

            return await self._admitted(draw, "sample", n, timeout, inline=False, left=left)

    async def update_priority(self, index: Any, priority: Any, key: Any | None = None) -> int:
        """``Table.update_priority``; returns how many priorities were applied."""
        with self.use() as table:
            return await self.call(lambda: table.update_priority(index, priority, key=key))

    async def info(self) -> dict[str, Any]:
        """``Table.info`` (``location`` relative to the data root), waiting calls, :meth:`state`."""
        with self.use() as table:
            info = await self.call(table.info)
        info["location"] = shown_location(table.root, info["location"])
        info["waiting"] = dict(table.rate_limiter.waiting)
        info["state"] = await self.state()
        return info

    @property
    def last_state(self) -> str:
        """The table's state as last found (see :meth:`state`), without asking its Redis."""
        return self.table.backend.state

    async def state(self) -> str:
        """Whether the table can serve: ``"ok"``; ``"lost"`` (its Redis restarted empty, or
        from a snapshot older than the writes acknowledged: never ``"ok"`` again) or ``"unreachable"`` (its Redis down, hung or refusing: ``"ok"``
        again once it answers). What ``info`` and ``/readyz`` say.

        A Redis table's marker is probed first, in a worker thread (at most once a second,
        one probe at a time), waited for up to :data:`PROBE_WAIT` seconds: a hung Redis does
        not hold the answer (its table is unreachable once its probe has timed out).
        """
        backend = self.table.backend
        if backend.connection is not None:  # rows in a server: it is asked
            await asyncio.wait(
                [asyncio.ensure_future(run_in_threadpool(backend.probe))], timeout=PROBE_WAIT
            )
        return self.last_state
