"""``TDReplayBuffer``: TorchRL's ``TensorDictReplayBuffer``, its table held by a tdreplay server.

A script switches from TorchRL's in-process buffer to the service by changing
one constructor line::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=256)
    rb = TDReplayBuffer("http://replay:8000", "cartpole", batch_size=256)

Everything else stays: collectors take it as ``replay_buffer=``, losses read
``priority_weight`` from its samples and write ``td_error`` that
``update_tensordict_priority`` sends back. Like TorchRL's ``RayReplayBuffer``
it *is* a ``ReplayBuffer`` to TorchRL (``isinstance`` holds) whose work
happens elsewhere: the storage, sampler and writer are the table's, in the
server (``_storage`` / ``_sampler`` / ``_writer`` are the markers of
:mod:`.remote`); ``share()`` has nothing to share; the buffer pickles as its
connection settings, so every collector worker opens its own connection.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn.utils import _set_dispatch_td_nn_modules
from tensordict.utils import NestedKey
from torchrl.data import TensorDictReplayBuffer

from tdreplay.client import ReplayClient, TableNotFound
from tdreplay.codec.params import sample_params
from tdreplay.codec.priorities import priorities

from . import rows as R
from .options import refuse_torchrl_options
from .priorities import PrioritiesMixin
from .remote import ServiceSampler, ServiceStorage, ServiceWriter
from .sampling import SamplingMixin
from .state import ServiceStateMixin
from .transforms import TransformsMixin, as_compose


class TDReplayBuffer(
    SamplingMixin, TransformsMixin, PrioritiesMixin, ServiceStateMixin, TensorDictReplayBuffer
):
    """A TorchRL ``TensorDictReplayBuffer`` whose storage and sampler are a tdreplay table.

    The table (its capacity, fields, sampler, writer, rate limiter) is
    declared on the server, by a schema or by ``create=`` here; this object
    holds only a client. Its methods follow TorchRL's:
    :meth:`extend` / :meth:`add` insert rows, :meth:`sample` returns a
    TensorDict with ``index`` and, from a prioritized table,
    ``priority_weight`` (the importance weight TorchRL's losses read), and
    :meth:`update_tensordict_priority` sends back the loss's ``td_error``.

    Args:
        url: the server's URL, a list of URLs (a sharded table), or a
            :class:`~tdreplay.client.ReplayClient` to use; default: ``TDREPLAY_URL``
            (and the token from ``TDREPLAY_TOKEN`` / ``TDREPLAY_TOKEN_FILE``), as every
            client reads them.
        table: the table's name (required).

    Keyword Args:
        batch_size: the default size of :meth:`sample` and of iteration.
        prefetch: keep this many samples of ``batch_size`` in flight (background threads).
        priority_key: where losses write priorities (TorchRL's default ``"td_error"``).
        transform: a callable (e.g. a TorchRL ``Transform``) applied to every sampled batch.
        strict: send every key of extended data: the server refuses keys the
            table does not declare. By default they are left out, with a warning
            naming them once (collectors add keys such as ``action_value``).
        create: table options (``capacity`` required, ``sampler``, ``backend``...)
            to create the table from the first extended batch's layout when it
            does not exist — TorchRL's lazy storages' behaviour.
        existing: with ``create=``, what the first extend does when the table
            exists already and holds rows (left by an earlier run, or written by
            another process of this one): ``"reuse"`` them, with a warning that
            says how many (the default: collector workers share a table one of
            them created), or ``"refuse"`` (:class:`~tdreplay.client.TableExists`;
            for a run that must start empty).
        timeout: seconds ``extend`` / ``sample`` may wait on the table's rate
            limiter (default: the client's ``wait``).
        also: more tables every ``extend`` writes the same rows into, in the same request,
            each with the new items' initial priority there (``{"recent": None}``;
            ``None``: its sampler's default): Reverb's insert into several tables.
        **client_options: passed to :class:`~tdreplay.client.ReplayClient`
            (``token``, ``transport``, ``retry``...).

    Raises:
        TypeError: ``url`` is a client and ``client_options`` were given too; one of
            TorchRL's constructor arguments the table decides (``sampler``, ``alpha``...;
            the error says what to use, see :mod:`.options`).
        InvalidRequest: ``batch_size`` is not an integer in ``[1, 2**31]`` (the contract's
            rule of every sample's size).

    Example:
        >>> from tdreplay.torchrl import TDReplayBuffer
        >>> rb = TDReplayBuffer("http://127.0.0.1:8000", "cartpole", batch_size=256)  # doctest: +SKIP
        >>> collector = Collector(env, policy, frames_per_batch=200, total_frames=-1,
        ...                       replay_buffer=rb)                                  # doctest: +SKIP
        >>> batch = rb.sample()                     # doctest: +SKIP
        >>> loss = loss_module(batch)               # writes batch["td_error"]  # doctest: +SKIP
        >>> rb.update_tensordict_priority(batch)    # doctest: +SKIP
    """

    # TorchRL's ReplayBuffer metaclass: already the service backend; `transport=` is not TorchRL's
    _service_backend_resolved = True
    _accepts_transport_backend = False

    def __init__(
        self,
        url: str | Sequence[str] | ReplayClient | None = None,
        table: str | None = None,
        *,
        batch_size: int | None = None,
        prefetch: int | None = None,
        priority_key: NestedKey = "td_error",
        transform: Callable[[TensorDictBase], TensorDictBase] | None = None,
        strict: bool = False,
        create: Mapping[str, Any] | None = None,
        existing: str = "reuse",
        timeout: float | None = None,
        also: Mapping[str, float | None] | None = None,
        **client_options: Any,
    ) -> None:
        if table is None:
            raise TypeError("TDReplayBuffer needs the table's name: TDReplayBuffer(url, table)")
        refuse_torchrl_options(client_options)
        if isinstance(url, ReplayClient):
            if client_options:
                raise TypeError(
                    f"TDReplayBuffer got a client and client options {sorted(client_options)}: "
                    "set them on the client"
                )
            client = url
        else:
            client = ReplayClient(url, **client_options)
        if batch_size is not None:  # the contract's rule, as every sample's: refused here
            batch_size = sample_params(batch_size, None).batch_size
        if prefetch and batch_size is None:
            raise ValueError("prefetch needs a batch_size: the samples in flight have that size")
        if create is not None and "capacity" not in create:
            raise ValueError("create= needs the table's capacity: create={'capacity': N, ...}")
        if existing not in ("reuse", "refuse"):
            raise ValueError(f"existing must be 'reuse' or 'refuse', got {existing!r}")
        self._client = client
        self._table = table
        self._batch_size = batch_size
        self._prefetch_cap = int(prefetch or 0)
        self.priority_key = priority_key
        self._transform = as_compose(transform)
        self._strict = strict
        self._create = dict(create) if create is not None else None
        self._existing = existing
        self._timeout = timeout
        self._also = dict(also or {})
        self._setup_local()

    def _setup_local(self) -> None:
        """Per-process state (made again when unpickled): no connection is opened here."""
        self._meta: dict[str, Any] | None = None
        self._keys: frozenset[tuple[str, ...]] | None = None
        self._warned: set[frozenset[tuple[str, ...]]] = set()
        self._warned_uniform = False
        self._prefetcher: Iterator[Any] | None = None
        self._lock = threading.Lock()
        # what TorchRL's own code reads on any ReplayBuffer
        self.shared = True
        self._delayed_init = False
        self._initialized = True
        self._service_shutdown = False
        self._replay_lock = threading.RLock()
        self._futures_lock = threading.RLock()
        self._write_lock = contextlib.nullcontext()
        self._dim_extend = 0
        self._iterator: Iterator[TensorDictBase] | None = None

    # ---------------------------------------------------------------- pickling
    def __reduce__(self) -> tuple[Any, ...]:
        """Pickles as the client's settings and the options: each process connects on its own."""
        options = {
            "batch_size": self._batch_size,
            "prefetch": self._prefetch_cap or None,
            "priority_key": self.priority_key,
            "transform": self._transform,
            "strict": self._strict,
            "create": self._create,
            "existing": self._existing,
            "timeout": self._timeout,
            "also": self._also,
        }
        return (_rebuild, (type(self), self._client, self._table, options))

    # ---------------------------------------------------------------- the table
    @property
    def replay_client(self) -> ReplayClient:
        """The :class:`~tdreplay.client.ReplayClient` this buffer talks through."""
        return self._client

    @property
    def table(self) -> str:
        """The table's name."""
        return self._table

    def info(self) -> dict[str, Any]:
        """The table's info from the server (size, counters, fields, sampler...)."""
        info = self._client.info(self._table)
        if self._meta is None:
            keep = ("fields", "sampler", "writer", "capacity")
            self._meta = {k: info[k] for k in keep if k in info}
            self._keys = R.table_keys(info["fields"])
        return info

    def _meta_info(self) -> dict[str, Any]:
        if self._meta is None:
            self.info()
        assert self._meta is not None
        return self._meta

    @property
    def _storage(self) -> ServiceStorage:  # type: ignore[override]
        return ServiceStorage(self._table)

    @property
    def _sampler(self) -> ServiceSampler:  # type: ignore[override]
        sampler = self._part("sampler")
        return ServiceSampler(self._table, str(sampler.pop("kind")), sampler)

    @property
    def _writer(self) -> ServiceWriter:  # type: ignore[override]
        return ServiceWriter(self._table, str(self._part("writer")["kind"]))

    def _part(self, part: str) -> dict[str, Any]:
        """The table's ``sampler`` or ``writer`` block (before ``create=`` made it: its options')."""
        try:
            return {"kind": R.DEFAULT_KINDS[part], **(self._meta_info().get(part) or {})}
        except TableNotFound:
            if self._create is None:
                raise
            return R.spec_part(self._create, part)

    @property
    def batch_size(self) -> int | None:
        """The default size of :meth:`sample` and of iteration."""
        return self._batch_size

    def _counts(self) -> dict[str, Any]:
        """The table's info; before ``create=`` made the table, an empty table's counters
        (TorchRL's lazy storages hold 0 items before their first write)."""
        try:
            return self.info()
        except TableNotFound:
            if self._create is None:
                raise
            return {"size": 0, "inserts": 0, "samples": 0, "can_sample": False, **self._create}

    def __len__(self) -> int:
        """How many items the table holds now."""
        return int(self._counts()["size"])

    @property
    def write_count(self) -> int:  # type: ignore[override]
        """How many items were ever written to the table (by every writer, checkpoints kept)."""
        return int(self._counts()["inserts"])

    def stats(self) -> dict[str, int | float | bool]:
        """A snapshot of the table's counters, named as TorchRL's ``stats()`` names them."""
        info = self._counts()
        return {
            "size": int(info["size"]),
            "capacity": int(info["capacity"]),
            "write_count": int(info["inserts"]),
            "sample_count": int(info["samples"]),
            "can_sample": bool(info.get("can_sample", True)),
        }

    def can_sample(self, batch_size: int | None = None) -> bool:
        """Whether a sample of ``batch_size`` would proceed now (rate limiter and size)."""
        info = self._counts()
        n = batch_size or self._batch_size or 1
        return bool(info.get("can_sample", True)) and int(info["size"]) >= n

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(url={self._client!r}, table={self._table!r}, "
            f"batch_size={self._batch_size})"
        )

    # ---------------------------------------------------------------- writing
    def _table_keys(self, data: TensorDictBase) -> frozenset[tuple[str, ...]]:
        if self._keys is None:
            try:
                info = self.info()
            except TableNotFound:
                if self._create is None:
                    raise
                self._create_from(data)
                self.info()
            else:
                if self._create is not None and int(info["size"]):
                    R.found_rows(self._table, int(info["size"]), self._existing)
        assert self._keys is not None
        return self._keys

    def _create_from(self, data: TensorDictBase) -> None:
        assert self._create is not None
        spec = R.spec_from_tensordict(
            data, self._table, exclude=(*R.SAMPLE_KEYS, self.priority_key), **self._create
        )
        # create-if-absent on the server: workers racing to create it all succeed
        self._client.create_table(spec, if_absent=True)

    def extend(  # type: ignore[override]
        self, tensordicts: Any, *, update_priority: bool | None = None
    ) -> torch.Tensor:
        """Insert a batch (``[N]``, ``[B, T]`` or ``[]``); returns the slots written, shaped like it
        (-1 for the rows a ``max_value`` table dropped, as TorchRL's ``TensorDictMaxValueWriter``).

        As TorchRL's: ``tensordicts`` is left as it is (TorchRL sets ``index`` on
        what its transforms' inverse made of it, a copy, even with no transform)
        and, for a prioritized table, a ``priority_key`` entry sets the new
        items' priorities.

        Raises:
            TypeError: not a TensorDict or tensorclass.
            SchemaError: a key the table declares is missing, or a shape or dtype differs;
                with ``strict``, non-tensor data (nothing was written).
            InvalidRequest: a ``priority_key`` entry is negative or not finite (nothing
                was written).
            RateLimitTimeout: the table's rate limiter held the insert past ``timeout``.
        """
        given = R.as_tensordict(tensordicts, who="TDReplayBuffer.extend")
        data = given
        if len(self._transform):  # as TorchRL: the inverse transforms, on the way in
            with _set_dispatch_td_nn_modules(True):
                data = self._transform.inv(given)
        keys = self._table_keys(data)
        extra: set[tuple[str, ...]] = set()
        if self._strict:
            R.refuse_non_tensor(data, self._table)
            rows = data.unsqueeze(0) if data.batch_dims == 0 else data.reshape(-1)
        else:
            rows, extra = R.rows_for(data, keys, (*R.SAMPLE_KEYS, self.priority_key))
        if extra:
            R.warn_extra(self._table, extra, self._warned)
        priority = None
        has_priority = data.get(self.priority_key, None) is not None
        if has_priority and update_priority is not False and self._sampler.prioritized:
            # checked before any row goes: a bad priority writes nothing
            where = f"table {self._table!r}"
            priority = priorities(R.priority_vector(data, self.priority_key), where)
        index = self._insert(rows)
        shaped = index.reshape(data.batch_size) if data.batch_dims else index.reshape(())
        if priority is not None:
            # its own update_priority: one place skips the rows a max_value table dropped
            self.update_priority(index, priority)
        return shaped

    def _insert(self, rows: TensorDictBase) -> torch.Tensor:
        """Insert ``rows`` (``[N]``); more than the capacity go as TorchRL's writers take them:
        a ring in pieces (the newest stay, each row gets the slot it went to); a ``max_value``
        table keeps the batch's largest, the others dropped (-1) before any is written."""
        capacity = int(self._meta_info().get("capacity") or len(rows))
        if len(rows) <= capacity:
            return self._write(rows)
        writer = self._part("writer")
        if writer["kind"] == "max_value":
            kept = R.largest(rows, writer["key"], capacity, self._table)
            return torch.full((len(rows),), -1, dtype=torch.int64).index_put_(
                (kept,), self._write(rows[kept])
            )
        return torch.cat(
            [self._write(rows[k : k + capacity]) for k in range(0, len(rows), capacity)]
        )

    def _write(self, rows: TensorDictBase) -> torch.Tensor:
        """One extend of the table (and of the ``also`` tables, in the same request): the
        slot of each row, -1 for a row a ``max_value`` table dropped (as TorchRL answers)."""
        if not self._also:
            return self._client.extend(self._table, rows, timeout=self._timeout)
        into = {self._table: None, **self._also}
        return self._client.extend(into, rows, timeout=self._timeout)[self._table]

    def add(self, data: Any) -> int:
        """Insert one step (a TensorDict with an empty batch); returns its slot."""
        index = self.extend(data)
        return int(index.reshape(-1)[0])


def _rebuild(
    cls: type[TDReplayBuffer], client: ReplayClient, table: str, options: dict[str, Any]
) -> TDReplayBuffer:
    """Unpickle a :class:`TDReplayBuffer` (the function ``__reduce__`` names)."""
    return cls(client, table, **options)
