"""``ReplayClient``: the blocking client.

    >>> client = ReplayClient("http://replay:8000", token="secret")  # doctest: +SKIP
    >>> client.extend("cartpole", rollout)                            # doctest: +SKIP
    >>> batch = client.sample("cartpole", 256)                        # doctest: +SKIP

Every call is a plan from :mod:`~tdreplay.client.plans` (its wire steps from
:mod:`~tdreplay.client.route`) driven with blocking I/O by
:class:`~tdreplay.client.driving.BlockingDriver`, over :class:`~.transport.Transport`
(``http.client``, pooled keep-alive connections); settings and pickling come from
:class:`~tdreplay.client.base.ClientBase`. Thread safe. A client pickles as its URLs and
settings, so a copy in a DataLoader worker or a subprocess opens its own connections.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

import torch
from tensordict import TensorDict

from . import commands as C
from .base import ClientBase
from .base import _restore as _restore  # pickles of clients made before base.py name it here
from .driving import BlockingDriver
from .dumps import Persistence
from .loader import Loader
from .schema import SpecLike, load_spec
from .settings import ClientSettings
from .stats import flatten
from .steps import Plan
from .writer import Writer

T = TypeVar("T")


class ReplayClient(Persistence, ClientBase):
    """A blocking client of one tdreplay server, or of several (sharded).

    Args:
        url: the server's base URL, or a list of them to shard over; default
            ``TDREPLAY_URL`` (comma-separated), else ``http://127.0.0.1:8000``.
        token: bearer token, if the server needs one; default ``TDREPLAY_TOKEN`` or
            the file ``TDREPLAY_TOKEN_FILE`` names.
        timeout: seconds to wait for each read of an answer (beyond ``wait``).
        connect_timeout: seconds to wait for a connection.
        wait: default seconds ``extend``/``sample`` may wait on the rate limiter.
        retry: what to do when a connection fails (default :class:`RetryPolicy()`).
        max_connections: idle keep-alive connections kept per server.
        shard_refresh: seconds a sharded client trusts its view of the servers' sizes.
        transport: ``"auto"`` (shared memory with a server on this host, else HTTP),
            ``"shm"`` (shared memory or an error) or ``"http"``.
        lease_slots: shared-memory slots per table and batch size each thread cycles
            through: a sampled batch stays as it is for that many samples.
        shm_poll_us: microseconds a same-host call polls for its answer before it sleeps,
            when the last answer came that soon (0: never); see the README's "Same host".

    Every method raises the :mod:`~tdreplay.client.errors` tree:
    a :class:`~tdreplay.client.errors.ServerError` subclass named like the
    server's error, or a :class:`~tdreplay.client.errors.TransportError`.
    """

    def _setup(self, settings: ClientSettings) -> None:
        super()._setup(settings)
        self._driver = BlockingDriver(settings)

    def _run(self, plan: Plan[T] | Generator[Any, Any, T]) -> T:
        """Drive a plan (:mod:`.plans`, :mod:`.route`): each step performed, blocking."""
        return self._driver.run(plan)

    @property
    def transport(self) -> str:
        """``"shm"`` or ``"http"``: how this client reaches its (first) server.

        Raises:
            ShmUnavailable: ``transport="shm"`` and the server is not reachable so.
        """
        return "shm" if self._driver.link(0) is not None else "http"

    def close(self) -> None:
        """Close idle connections; the client stays usable (it reconnects on demand)."""
        self._driver.close()

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- control
    def health(self) -> dict[str, Any]:
        """``GET /healthz`` (every server's, when sharded)."""
        return self._run(self._plans.health())

    def tables(self) -> list[dict[str, Any]]:
        """The info of every table."""
        return self._run(self._plans.tables())

    def create_table(self, spec: SpecLike, *, if_absent: bool = False) -> dict[str, Any]:
        """Create a table from a spec (a mapping, a ``TableSpec``, or a YAML/JSON schema file); returns its info.

        With ``if_absent`` it is create-if-absent, one server operation: a table of that
        name with this spec (one being created by another caller meanwhile included) is
        answered with its info, so that any number of workers may call it at once.

        Raises:
            TableExists: a table of that name exists (with ``if_absent``: with another
                spec; the message names the first difference).
            SchemaError: the spec is invalid (the message names the field).
        """
        return self._run(self._plans.create_table(load_spec(spec), if_absent))

    def clear(self, table: str) -> dict[str, Any]:
        """Empty ``table`` on every server, atomically and durably; returns its info. Its schema
        stays; rows, priorities, counters and rate-limiter state start anew. Plans waiting
        on it end with ``TableClosed``."""
        return self._run(self._plans.clear(table))

    def delete_table(self, table: str) -> None:
        """Delete a table and its data. Raises TableNotFound; BackendError (503) when a redis
        table's Redis does not answer (the table is kept: delete it again later)."""
        self._run(self._plans.delete_table(table))

    def info(self, table: str) -> dict[str, Any]:
        """Size, capacity, fields, sampler, writer, rate limiter and counters of ``table``.
        Sharded: sizes and counters summed over the servers that answer (``info["down"]``
        names the others, with their errors), and ``info["shards"]`` lists each server's."""
        return self._run(self._plans.info(table))

    def stats(self, table: str, prefix: str = "buffer/") -> dict[str, float]:
        """``table``'s figures as ``{"buffer/size": ..., "buffer/samples_per_insert": ...}``
        for a logger; sharded: merged (see :mod:`tdreplay.client.stats`)."""
        return flatten(self.info(table), prefix)

    # ---------------------------------------------------------------- data
    def extend(
        self,
        table: str | Mapping[str, float | None],
        data: Any,
        *,
        timeout: float | None = None,
        request_id: str | None = None,
    ) -> Any:
        """Insert rows: a TensorDict of batch ``[N]`` (``[]`` and ``[B, T]`` are reshaped), or a tensorclass.

        ``table`` may name several tables, each with the new items' initial priority
        there (``{"replay": 1.0, "recent": None}``; ``None``: the sampler's default):
        one request puts the same rows into each (Reverb's insert with priorities),
        every table checked before any is written, each table's part atomic and
        idempotent; the answer is then the slots by table.

        Idempotent: the request carries an ``X-Request-Id``, so a retry after a
        lost answer does not insert the rows twice.

        The rows are sent from their tensors' own memory, not copied into a
        request body first: do not change them until the call returns.

        Args:
            table: the table.
            data: the rows; exactly the table's keys, shapes and dtypes.
            timeout: seconds the rate limiter may hold the insert (default: the client's ``wait``).
            request_id: the ``X-Request-Id`` (default: a new one); an earlier call's makes this its retry.
                At most 200 latin-1 characters, no control character, no space or tab at
                either end (what an HTTP header carries as it is; else ``InvalidRequest``).

        Returns:
            The slot of each row, int64 ``[N]`` (sharded: ``slot * n_servers + server``),
            ``-1`` for a row a ``max_value`` table dropped; for several tables,
            ``{table: slots}``.

        Raises:
            SchemaError: a key, shape or dtype does not match; nothing was written.
            RateLimitTimeout: the rate limiter held the insert past ``timeout``.
            TableNotFound, InvalidRequest, TransportError: as their names say.
        """
        if isinstance(table, Mapping):
            return self._run(self._plans.insert(dict(table), data, timeout, request_id))
        return self._run(self._plans.extend(table, data, timeout, request_id))

    def post_extend(
        self, table: str, data: Any, *, timeout: float | None = None, request_id: str | None = None
    ) -> Callable[[], torch.Tensor] | None:
        """Send an extend of ``data`` over HTTP and return before the server answers: the
        function returned reads the answer (the slots, as :meth:`extend` returns them) or
        raises its error. Meanwhile the caller works (a writer fills its next chunk) and
        ``data`` must stay unchanged: a connection lost before the answer raises
        ``ConnectionFailed(sent=True)``, and the caller sends ``data`` again with
        :meth:`extend` under the same ``request_id`` (its retries; stored once).

        Returns:
            ``None`` where this client cannot: several servers, or the same-host transport.
        """
        if len(self.urls) != 1 or self._driver.link(0) is not None:
            return None
        command = self._plans.extend_command(table, data, timeout, request_id)
        posted = self._driver.transports[0].post(command.request())
        return lambda: command.parse(posted.answer())

    def sample(
        self,
        table: str,
        batch_size: int,
        *,
        timeout: float | None = None,
        as_cls: type | None = None,
        owned: bool = False,
    ) -> Any:
        """Sample ``batch_size`` items as a TensorDict (or an ``as_cls`` tensorclass).

        The batch holds the table's fields, ``index`` (pass it to
        :meth:`update_priority`) and ``sample_info`` (``priority``, ``weight``,
        ``times_sampled``, ``key``: pass it to :meth:`update_priority` too; a prioritized
        table's ``max_weight``, what ``weight`` was divided by). Sharded, a prioritized
        table's weights are normalised over all servers (:mod:`~tdreplay.client.merging`).

        Over shared memory (:attr:`transport` ``"shm"``) the batch *views* a slot
        leased to this thread: it stays as it is for the next ``lease_slots - 1``
        samples of this table and size on this thread (default 1), then is
        overwritten; ``batch.clone()`` what must live longer, or ask for ``owned=True``:
        the slot is then copied once into the batch's own buffer (one copy of the
        whole batch, cheaper than a clone, which copies field by field). Over HTTP it
        owns its memory.

        Raises:
            RateLimitTimeout: the table could not be sampled within ``timeout``;
                EmptyTableError (a subclass) when it held no item then.
            InvalidRequest: a bad batch size (e.g. not a multiple of ``slice_len``).
            TableNotFound, TransportError: as their names say.
        """
        return self._run(self._plans.sample(table, batch_size, timeout, as_cls, lease=not owned))

    def remove(self, table: str, index: Any, key: Any = None) -> int:
        """Remove sampled items (``batch["index"]``; with ``key=batch["sample_info", "key"]``
        only those not overwritten since); returns how many went (Reverb's deletes)."""
        return self._run(self._plans.remove(table, index, key))

    def read(self, table: str, index: Any) -> TensorDict:
        """The items in slots ``index`` (a sample's ``index`` values), as stored (nothing is
        counted as sampled); InvalidRequest names a slot that holds no item."""
        return self._run(self._plans.read(table, index))

    def update_priority(self, table: str, index: Any, priority: Any, key: Any = None) -> int:
        """Set the priorities of the items ``index`` (from ``batch["index"]``).

        Pass ``key=batch["sample_info", "key"]`` too, and slots overwritten
        since the sample (by a fast collector) keep their new items' priorities;
        without it the update lands on whatever item each slot now holds.

            >>> client.update_priority(  # doctest: +SKIP
            ...     "atari", batch["index"], td_error, key=batch["sample_info", "key"])
            256

        Returns:
            How many priorities were applied: the items removed (or, with
            ``key``, overwritten) since the sample are skipped.

        Raises:
            ValueError: ``index``, ``priority`` (and ``key``) differ in length.
            InvalidRequest: the table has no priorities, or a bad index or priority.
            TableNotFound, TransportError: as their names say.
        """
        return self._run(self._plans.update_priority(table, index, priority, key))

    # ---------------------------------------------------------------- views and helpers
    def tensorclass(self, table: str) -> type:
        """A ``@tensorclass`` generated from ``table``'s schema (cached per client)."""
        if table not in self._classes:
            return self._tensorclass(table, self.info(table))
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
    ) -> Loader:
        """An iterator over sampled batches that keeps ``prefetch`` requests in flight.

        See :class:`~tdreplay.client.loader.Loader` (also a torch ``IterableDataset``).
        """
        return Loader(
            self,
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

    def writer(
        self,
        table: str,
        chunk: int = 256,
        *,
        max_delay: float | None = 1.0,
        episode_key: str | None = None,
        end_key: str | None = None,
        timeout: float | None = None,
        background: bool | None = None,
        max_pending: int = 8,
    ) -> Writer:
        """A buffer for collectors: append steps, chunks are sent when full, late, or closed
        (:class:`~tdreplay.client.writer.Writer`: the trajectory rule; ``background``, how a full
        chunk goes without waiting; ``max_pending``, what a failed send may leave)."""
        return Writer(
            self,
            table,
            chunk,
            max_delay=max_delay,
            episode_key=episode_key,
            end_key=end_key,
            timeout=timeout,
            background=background,
            max_pending=max_pending,
        )

    # used by the loader: sample into caller-provided buffers
    def _sample_into(
        self, table: str, batch_size: int, timeout: float | None, alloc: C.Alloc
    ) -> TensorDict:
        return self._run(self._plans.sample(table, batch_size, timeout, None, alloc))
