"""The server's table operations, transport-neutral: every door calls these.

:class:`Core` is what the HTTP routes, the same-host socket and an
in-process caller hold: the one service object. It holds the served tables
(:class:`~.served.Served`) and every operation on them - extend, sample,
update priorities, remove, read here; create, clear, delete, info
(:mod:`.lifecycle`); checkpoint, restore, export, dump, load (:mod:`.persistence`;
a load in parts: :mod:`.uploads`) - each looking its table up once, with its
validation, limits and rate-limiter wait done once. A door parses its request into the
models of the contract (:mod:`tdreplay.codec.params`), calls one method,
and encodes the answer.

    >>> import asyncio, tempfile, torch
    >>> from tdreplay.service import Settings
    >>> from tdreplay.storage import TableSpec
    >>> async def main():
    ...     core = Core(Settings(root=tempfile.mkdtemp()))
    ...     spec = TableSpec.model_validate({"name": "t", "capacity": 8,
    ...         "fields": {"x": {"shape": [], "dtype": "int64"}}})
    ...     await core.create(spec)
    ...     index, _ = await core.extend("t", {("x",): torch.arange(3)}, ExtendParams())
    ...     lease = await core.sample("t", SampleParams(batch_size=2))
    ...     await core.close()
    ...     return index.tolist(), lease.out["x"].shape
    >>> asyncio.run(main())
    ([0, 1, 2], torch.Size([2]))
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import torch
from starlette.concurrency import run_in_threadpool

from tdreplay.codec import encode
from tdreplay.codec.params import (
    BufferParams,
    ExtendParams,
    InsertParams,
    PriorityUpdate,
    ReadParams,
    RemoveParams,
    SampleParams,
    StreamParams,
)
from tdreplay.storage import InvalidRequest, NestedKey

from ..limits import Exports, Hold, Receiving
from ..settings import Settings
from ..wire import Lease
from .handle import TableHandle
from .lifecycle import TableOps
from .paths import TRANSFER_SCRATCH
from .persistence import PersistenceOps
from .served import Served, TableEvents
from .shape import Place, Shape
from .uploads import Uploads

log = logging.getLogger("tdreplay.service")

#: rows as flat columns, ``{nested key: tensor [N, *shape]}``
Columns = Mapping[NestedKey, torch.Tensor]


class Core(TableOps, PersistenceOps):
    """The tables of one server and every operation on them.

    Args:
        settings: the server's settings (data root, limits, timeouts, pools).
        events: told of every table's rate-limiter waits and of each table no longer
            served (the metrics).
    """

    def __init__(
        self,
        settings: Settings,
        events: TableEvents | None = None,
    ) -> None:
        self.settings = settings
        #: request bodies held, received or waiting (``--max-receiving-bytes``): the HTTP
        #: server counts those it receives, the rate-limited calls those they keep
        self.receiving = Receiving(settings.max_receiving_bytes)
        #: exports under way (``--max-exports``): each writes a table-size file
        self.exports = Exports(settings.max_exports)
        self.served = Served(settings, events)
        self.root = self.served.root
        self.uploads = Uploads(self.root / TRANSFER_SCRATCH, settings)

    async def close(self, *, checkpoint: bool = False) -> None:
        """Drop the loads under way (:mod:`.uploads`), then stop serving every table
        (:meth:`TableOps.close <.lifecycle.TableOps.close>`)."""
        await self.uploads.close()
        await super().close(checkpoint=checkpoint)

    # -- rules shared by the operations ----------------------------------------
    def _hold(self, columns: Columns) -> Hold:
        """The count of the rows one call keeps while it waits for a rate limiter."""
        return self.receiving.hold(sum(c.nbytes for c in columns.values()))

    def timeout(self, given: float | None) -> float:
        """The caller's timeout, or the server's default, capped by the server's maximum."""
        s = self.settings
        return min(s.default_timeout if given is None else given, s.max_timeout)

    # -- data ----------------------------------------------------------------------
    async def extend(
        self,
        name: str | TableHandle,
        columns: Mapping[NestedKey, torch.Tensor],
        params: ExtendParams,
        *,
        holds: bool = True,
    ) -> tuple[torch.Tensor, bool]:
        """Insert rows given as flat columns ``{nested key: tensor [N, *shape]}``.

        ``holds``: the call keeps its rows in the server's memory (a request body, not a
        same-host slot, which its connection keeps anyway); while the rate limiter holds
        it back, their bytes count with the bodies being received (``--max-receiving-bytes``).

        Returns:
            The slot of each row (-1: dropped by a max-value writer), and whether the call repeated a recent
            ``request_id`` (then nothing was inserted; the first call's slots).

        Raises:
            SchemaError: a column is missing, extra, or of the wrong shape or dtype.
            InvalidRequest: no rows, more than the capacity, or never insertable.
            RateLimitTimeout: held back longer than the timeout.
            BackendError: held back, and its rows would pass ``--max-receiving-bytes`` (503).
            TableNotFound: no such table, or it was deleted while the call waited.
        """
        handle = self.table(name)
        n = _rows(columns)
        hold = self._hold(columns) if holds else None
        wait = self.timeout(params.timeout)
        return await handle.extend(columns, n, wait, params.request_id, hold=hold)

    async def insert(
        self, params: InsertParams, rows: Columns | Callable[[], Awaitable[Columns]]
    ) -> tuple[dict[str, torch.Tensor], bool]:
        """Insert the same rows into every table of ``params.into``, each with its own
        initial priority (Reverb's insert into several tables).

        Every table is looked up (here, once), then the rows are taken - ``rows`` may be
        a coroutine function reading them, which a door passes so that a missing table
        is answered before its body is read - and checked against each table (keys,
        shapes, dtypes, priority): a missing table, or one that refuses the rows, stops
        the call before anything is written. Then each table's insert runs, atomic as an
        extend is, their rate-limiter waits side by side. With a request id each table
        keeps its own part's answer: a retry after a lost answer inserts where the first
        call did not get to, and nowhere twice.

        Returns:
            The slot of each row, by table (-1 for a row a table's max-value writer
            dropped); and whether the call was a repeat everywhere.

        Raises:
            TableNotFound, SchemaError, InvalidRequest: nothing was written.
            RateLimitTimeout: a table held its insert back past the timeout (the others'
                went in; a retry with the same request id completes the call).
            BackendError: a table held it back, and its rows would pass
                ``--max-receiving-bytes`` (503; the rows count once however many tables wait).
        """
        handles = {name: self.table(name) for name in params.into}
        columns = await rows() if callable(rows) else rows
        n = _rows(columns)
        for name, handle in handles.items():
            with handle.use() as table:
                check = functools.partial(table.check_insert, priority=params.into[name])
                await run_in_threadpool(check, columns)
        wait, rid, hold = self.timeout(params.timeout), params.request_id, self._hold(columns)
        done = await asyncio.gather(
            *(
                handle.extend(
                    columns,
                    n,
                    wait,
                    None if rid is None else f"{rid}/{name}",
                    params.into[name],
                    hold=hold,
                )
                for name, handle in handles.items()
            )
        )
        index = {name: slots for name, (slots, _) in zip(handles, done, strict=True)}
        return index, all(replayed for _, replayed in done)

    async def sample(
        self, name: str, params: SampleParams, left: Callable[[], Awaitable[object]] | None = None
    ) -> Lease:
        """Sample ``batch_size`` items into a pooled Arrow IPC body (``lease.body``); a wait
        for the rate limiter ends once ``left()`` returns (the caller is gone).

        Raises:
            InvalidRequest: the batch size does not fit the table.
            PayloadTooLarge: the sample would exceed the body limit.
            RateLimitTimeout: held back longer than the timeout (EmptyTableError, a
                subclass: and the table held no item then).
            TableNotFound: no such table, or it was deleted while the call waited.
        """
        handle = self.table(name)
        return await handle.sample(params.batch_size, self.timeout(params.timeout), left)

    def sample_to(self, name: str, params: SampleParams, place: Place) -> Shape | Awaitable[Shape]:
        """Sample ``batch_size`` items into the buffers ``place`` lays out for the sample's
        :class:`~.handle.Shape` (a shared-memory slot, made once and reused).

        Returns:
            The shape, when the sample was drawn at once (small, and the rate limiter let
            it through); else an awaitable of it (see :meth:`TableHandle.sample_to`).

        Raises:
            InvalidRequest: the batch size does not fit the table, or the buffers do not fit.
            RateLimitTimeout, TableNotFound: as :meth:`sample`.
        """
        handle = self.table(name)
        return handle.sample_to(params.batch_size, self.timeout(params.timeout), place)

    def extend_shape(self, name: str, params: BufferParams) -> Shape:
        """The :class:`~.handle.Shape` of buffers for extends of up to ``rows`` rows of a
        table (at most its capacity): a door lays them out, then extends from them.

        Raises:
            TableNotFound: no such table.
        """
        return self.table(name).extend_shape(params.rows)

    async def stream(
        self, name: str, params: StreamParams, left: Callable[[], Awaitable[object]] | None = None
    ) -> tuple[bytes, AsyncIterator[memoryview]]:
        """Samples one after the other: the Arrow stream's header, and its record batches.

        The first sample is drawn before this returns, so a table that cannot
        be sampled fails here as :meth:`sample` does. A wait for the rate limiter,
        the first's or a later one's, ends once ``left()`` returns (the caller is
        gone: the iterator ends). Batches are drawn
        several at a time where the sampler allows (``TableHandle.sample_run``).
        A later sample that times out, or the table's deletion, ends the
        iterator early: the caller sees fewer than ``count`` batches.
        """
        handle = self.table(name)
        n, count, wait = params.batch_size, params.count, self.timeout(params.timeout)
        handle.check_batch_size(n)
        layout = await handle.samples.layout(n)
        per_run = max(1, self.settings.stream_chunk_bytes // layout.batch_len)
        if not handle.runs_are_exact:
            per_run = 1

        async def draw(
            remaining: int | None, left: Callable[[], Awaitable[object]] | None = None
        ) -> tuple[memoryview, int]:
            k = per_run if remaining is None else min(per_run, remaining)
            if k == 1:
                return (await handle.sample(n, wait, left)).batch, 1
            run = await handle.sample_run(n, k, wait, left)
            return run, len(run) // layout.batch_len

        first, sent = await draw(count, left)

        async def batches() -> AsyncIterator[memoryview]:
            nonlocal sent
            yield first
            while count is None or sent < count:
                chunk, k = await draw(None if count is None else count - sent, left)
                sent += k
                yield chunk

        return layout.header, batches()

    async def update_priority(self, name: str, update: PriorityUpdate) -> int:
        """Set the priorities of sampled slots; returns how many were applied.

        Raises:
            InvalidRequest: the sampler has no priorities, an index is out of range or a
                priority negative or not finite (the lengths were checked by the
                update's model). Nothing is updated.
        """
        handle = self.table(name)
        return await handle.update_priority(update.index, update.priority, update.key)

    async def remove(self, name: str, params: RemoveParams) -> int:
        """Remove the items in sampled slots (``Table.remove``); returns how many went.

        Raises:
            InvalidRequest: an index out of range, or keys not one per slot. Nothing is removed.
        """
        handle = self.table(name)
        with handle.use() as table:
            return await handle.call(lambda: table.remove(params.index, key=params.key))

    # -- tables ------------------------------------------------------------------
    async def read(self, name: str, params: ReadParams) -> bytes:
        """The items in slots ``params.index`` as an Arrow IPC body (their fields and ``index``).

        Raises:
            InvalidRequest: a slot outside the table or holding no item.
            PayloadTooLarge: the answer would exceed the body limit.
            TableNotFound: no such table.
        """
        handle = self.table(name)
        handle.check_answer(len(params.index), "index")
        index = torch.tensor(params.index, dtype=torch.int64)
        with handle.use() as table:
            rows = await handle.call(lambda: table.read_items(index))
        rows.set("index", index)
        return (await run_in_threadpool(encode, rows)).to_pybytes()


def _rows(columns: Mapping[NestedKey, torch.Tensor]) -> int:
    first = next(iter(columns.values()), None)
    if not isinstance(first, torch.Tensor) or first.ndim == 0:
        raise InvalidRequest("extend needs at least one column of shape [N, ...]", field="body")
    return int(first.shape[0])
