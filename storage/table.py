"""The replay table: a storage plus a sampler, a writer and a rate limiter.

    >>> import tempfile, torch
    >>> from tensordict import TensorDict
    >>> from tdreplay.storage import Table, TableSpec
    >>> spec = TableSpec.model_validate({"name": "demo", "capacity": 100, "fields": {
    ...     "obs": {"shape": [4], "dtype": "float32"}, "next.reward": {"shape": [1], "dtype": "float32"}}})
    >>> table = Table.create(spec, root=tempfile.mkdtemp())
    >>> td = TensorDict({"obs": torch.randn(10, 4), "next": {"reward": torch.ones(10, 1)}}, batch_size=[10])
    >>> table.extend(td).tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    >>> batch = table.sample(32)
    >>> batch["obs"].shape, batch["index"].shape, sorted(batch["sample_info"].keys())
    (torch.Size([32, 4]), torch.Size([32]), ['key', 'priority', 'times_sampled', 'weight'])

Sample info sits beside the fields of every sampled batch:

* ``batch["index"]`` (int64): the slot each row came from; pass it back to
  :meth:`Table.update_priority`.
* ``batch["sample_info", "priority"]`` (float32): the item's priority (1 for
  samplers without priorities).
* ``batch["sample_info", "weight"]`` (float32): the importance weight (1 unless
  prioritized).
* ``batch["sample_info", "times_sampled"]`` (int64): how often the item has now
  been returned, this sample included.
* ``batch["sample_info", "key"]`` (int64): the item's key, its insert number
  (unique for the table's life, checkpoint and restore included). Pass it to
  :meth:`Table.update_priority` with the index so that an update skips slots
  overwritten since the sample, as Reverb's item keys do.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase, is_tensorclass

from . import spec as S
from .backends import Backend, allocate, reopen, sweep
from .durable import STATE_DIR, DurableState
from .errors import InvalidRequest, RateLimitTimeout, TableClosed
from .rate_limiter import RateLimiter
from .redis_conn import RedisConnection, connections
from .rwlock import RWLock
from .samplers import Sampler, make_sampler
from .slots import Slots
from .spec import NestedKey, TableSpec, join_key, split_key
from .statefile import StateError
from .tensordicts import fill, key_tree, nest
from .validation import INFO_KEYS, RowChecker
from .writers import MaxValueWriter, Writer, make_writer


class Table:
    """A fixed-capacity replay table on a tensordict storage.

    Build one with :meth:`create` (new, empty storage) or :meth:`restore`
    (from a checkpoint). Every method is thread safe: many threads may extend
    and sample at once, and a sampled row is never a mix of two inserts.

    Args:
        spec: what the table is.
        backend: its allocated storage (see :func:`~tdreplay.storage.backends.allocate`).
        root: the data root the table lives under.
        seed: seed of the table's sampling generator (``None``: random).
    """

    def __init__(
        self,
        spec: TableSpec,
        backend: Backend,
        *,
        root: str | Path,
        seed: int | None = None,
        reopen: bool = False,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.capacity = spec.capacity
        self.root = Path(root)
        self.backend = backend
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)
        self.slots = Slots(spec.capacity)
        self.writer: Writer = make_writer(spec, self.slots)
        self.sampler: Sampler = make_sampler(spec, self.slots, self.writer, self.generator)
        self.rate_limiter = RateLimiter.from_spec(spec.rate_limiter)
        self.max_times_sampled = 1 if self.sampler.consumes else spec.max_times_sampled
        # Samplers that may draw an item twice in one batch need the batch capped
        # (queues and stacks never do; slices are drawn whole and are not capped).
        self._cap_times = bool(
            self.max_times_sampled and not self.sampler.consumes and not self.sampler.needs_episodes
        )
        self._schema = spec.torch_schema()
        self._keys = list(self._schema)
        self._item_nbytes = spec.item_nbytes
        self._check = RowChecker(spec.name, self._schema, spec.capacity)
        self._batch_tree = key_tree([*self._keys, *INFO_KEYS])
        self._cond = threading.Condition(threading.Lock())
        self._data_lock = RWLock()
        self._listeners: list[Callable[[], None]] = []
        #: called with the rows about to be overwritten, under the data write lock
        self._before_write: list[Callable[[slice | torch.Tensor], None]] = []
        self._episode_base = 0
        self._traj_key = self._end_key = None
        if isinstance(spec.sampler, S.SliceSampler):
            if spec.sampler.traj_key:
                self._traj_key = split_key(spec.sampler.traj_key)
            else:
                self._end_key = split_key(spec.sampler.end_key or "")
        self._value_key = (
            split_key(self.writer.key) if isinstance(self.writer, MaxValueWriter) else None
        )
        self.closed = False
        #: memmap tables keep their state in files beside the rows (see durable.py)
        self._durable: DurableState | None = None
        self._fsync = False
        if spec.backend.kind == "memmap" and backend.location is not None:
            folder = Path(backend.location) / STATE_DIR
            if reopen:
                self._durable = DurableState.open(folder, self)
            else:
                self._durable = DurableState.create(folder, self)
        # counters for info/metrics
        self.created_at = time.time()
        self.bytes_in = 0
        self.bytes_out = 0

    # ------------------------------------------------------------ construction
    @classmethod
    def create(
        cls,
        spec: TableSpec | str | Path,
        root: str | Path = "./tdreplay-data",
        *,
        seed: int | None = None,
        replace: bool = False,
        redis: Mapping[str, str | RedisConnection] | None = None,
    ) -> Table:
        """Allocate a new, empty table (``TensorDict.from_schema`` on the spec's backend).

        Args:
            spec: a :class:`TableSpec`, or the path of a schema file.
            root: the data root; file backends keep their data in the table's own
                folder, ``<root>/tables/<name>/`` (created with a marker file naming
                the table; never over the data of a table open in this process;
                see :func:`~tdreplay.storage.backends.allocate`).
            seed: seed of the sampling generator.
            replace: delete data an earlier table of this name left in its folder
                (without it, such data is an error: restore it or replace it).
            redis: Redis connections by name (``{"default": "redis://host:6379/0"}``);
                a redis table's spec names one (``backend.connection``).

        Raises:
            SchemaError: the schema file is invalid, or names a Redis connection
                not in ``redis``.
            TableExists: ``<root>/tables/<name>`` is not this table's folder, or
                holds an earlier table's data and ``replace`` is not set.
            BackendError: the storage could not be allocated.
        """
        if not isinstance(spec, TableSpec):
            spec = TableSpec.from_file(spec)
        backend = allocate(
            spec, root, exists="replace" if replace else "error", redis=connections(redis)
        )
        try:
            table = cls(spec, backend, root=root, seed=seed)
        except BaseException:
            backend.destroy()
            raise
        table._commit()
        return table

    @classmethod
    def open(
        cls,
        spec: TableSpec | str | Path,
        root: str | Path = "./tdreplay-data",
        *,
        seed: int | None = None,
        redis: Mapping[str, str | RedisConnection] | None = None,
        fsync: bool = False,
    ) -> Table:
        """Reopen the memmap table a process left in ``<root>/tables/<name>/``, or create it.

        A memmap table keeps its rows and its state in files (see
        :mod:`tdreplay.storage.durable`): after its process ended - a clean
        stop, ``kill -9`` - it comes back with every insert that returned.
        Other backends, and a memmap table with nothing on disk, are created
        new (an earlier table's leftovers there are an error, as for
        :meth:`create`).

        Args:
            spec: a :class:`TableSpec`, or the path of a schema file.
            root: the data root.
            seed: seed of the sampling generator.
            redis: Redis connections by name (see :meth:`create`).
            fsync: flush rows and state to disk before every extend and sample
                returns (survives a power loss, at the cost of a disk flush).

        Raises:
            TableExists: the data on disk was written under another schema.
            BackendError: the data on disk is damaged.

        Example:
            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> root = tempfile.mkdtemp()
            >>> spec = TableSpec.model_validate({"name": "t", "capacity": 8,
            ...     "fields": {"x": {"shape": [], "dtype": "int64"}}})
            >>> t = Table.open(spec, root)
            >>> _ = t.extend(TensorDict({"x": torch.arange(3)}, [3]))
            >>> t.close()   # or a crash: the rows are in the files already
            >>> Table.open(spec, root).size
            3
        """
        if not isinstance(spec, TableSpec):
            spec = TableSpec.from_file(spec)
        backend = reopen(spec, root)
        if backend is None:
            table = cls.create(spec, root, seed=seed, redis=redis)
        else:
            try:
                table = cls(spec, backend, root=root, seed=seed, reopen=True)
            except BaseException:
                backend.close()  # lets the location go; its data stays as it is
                raise
            table._commit()
            sweep(spec, root)
        table.fsync = fsync
        return table

    @property
    def fsync(self) -> bool:
        """Whether extends and samples flush rows and state to disk before returning (memmap)."""
        return self._fsync

    @fsync.setter
    def fsync(self, value: bool) -> None:
        self._fsync = bool(value)
        if self._durable is not None:
            self._durable.fsync = self._fsync

    def _commit(self) -> None:
        """Mark a memmap table's state complete: from now on it can be reopened."""
        if self._durable is not None:
            with self._cond:
                self._durable.save()
                self._durable.commit()

    def _persist(self) -> None:
        """Write the state record (memmap tables); the caller holds ``_cond``."""
        if self._durable is not None:
            self._durable.save()

    @classmethod
    def restore(
        cls,
        path: str | Path,
        root: str | Path | None = None,
        *,
        seed: int | None = None,
        redis: Mapping[str, str | RedisConnection] | None = None,
        expect: TableSpec | None = None,
    ) -> Table:
        """Rebuild a table from a checkpoint written by :meth:`checkpoint`.

        Nothing is deleted or overwritten until the new table is whole: when
        the table's location under ``root`` exists (e.g. the data of the table
        being served, which this one is to replace), the restored data goes to
        a fresh location beside it. A failed restore deletes only what it
        allocated; a successful one then deletes the table's dead data, which
        no open table holds (see :mod:`tdreplay.storage.backends`).

        Args:
            path: the checkpoint folder.
            root: data root of the restored table (default: the checkpoint's parent).
            seed: seed of the sampling generator.
            redis: Redis connections by name (for a checkpoint of a redis table).
            expect: the spec the caller read from the checkpoint and checked: the
                restore is refused (``InvalidCheckpoint``) unless it is still the one
                there (a checkpoint folder changed between check and use).

        Raises:
            CheckpointError: the folder holds no readable checkpoint, or the
                table's data would go inside it.
            SchemaError: the checkpoint's spec is invalid, or names a Redis
                connection not in ``redis``.
            BackendError: the storage could not be allocated.
        """
        from .checkpoint import restore

        return restore(cls, Path(path), root, seed=seed, redis=connections(redis), expect=expect)

    # ------------------------------------------------------------ waiting
    def _wait(self, ready: Callable[[], bool], timeout: float | None, what: str) -> None:
        """Wait on the table's condition (held) until ``ready()``; raise on timeout."""
        if self.closed:  # its storage handles are gone: fail instead of reading garbage
            raise TableClosed(f"table {self.name!r} is closed", table=self.name)
        if ready():
            return
        if what == "insert":
            self.rate_limiter.insert_waits += 1
        else:
            self.rate_limiter.sample_waits += 1
        if timeout is not None and timeout <= 0:
            ok = False
        else:
            ok = self._cond.wait_for(lambda: self.closed or ready(), timeout)
        if self.closed:
            raise TableClosed(
                f"table {self.name!r} was closed while a call waited", table=self.name
            )
        if not ok:
            rl = self.rate_limiter
            raise RateLimitTimeout(
                f"table {self.name!r}: {what} timed out after {timeout}s (size {self.slots.n_live}, "
                f"inserts {rl.inserts}, samples {rl.samples}, min_size_to_sample {rl.min_size_to_sample}, "
                f"samples_per_insert {rl.samples_per_insert})",
                table=self.name,
            )

    def _notify(self) -> None:
        self._cond.notify_all()
        for fn in self._listeners:
            fn()

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (under the table's lock; keep it short) whenever inserts or samples may proceed."""
        self._listeners.append(fn)

    # ------------------------------------------------------------ extend
    def can_insert(self, n: int = 1) -> bool:
        """Whether an insert of ``n`` items would proceed now, without waiting."""
        with self._cond:
            return self.rate_limiter.can_insert(n) and self.writer.can_claim(n)

    def extend(
        self, td: Any, *, timeout: float | None = None, priority: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Insert the rows of ``td`` (a TensorDict or tensorclass of batch ``[N]``).

        Waits while the rate limiter (or a full queue/stack) holds inserts back.

        Args:
            td: the items; exactly the schema's keys, shapes and dtypes.
            timeout: seconds to wait for the rate limiter; ``None`` waits as long as it takes.
            priority: initial priorities (prioritized sampler only; default: its initial priority).

        Returns:
            The slots written, int64 ``[K]`` in the order of ``td``'s rows. ``K == N``
            except with the max-value writer, which drops items below the table's minimum.

        Raises:
            SchemaError: a key is missing or extra, or a shape, dtype or the batch dims are wrong.
                Nothing is written and no counter moves.
            InvalidRequest: ``N`` is 0 or above capacity, or could never pass the rate limiter.
            RateLimitTimeout: the insert waited ``timeout`` seconds.
            TableClosed: the table is closed, or was closed while the insert waited.
            BackendError: the storage failed to write.
        """
        data, n = self._check.rows(td)
        if priority is not None:
            if self.sampler.kind != "prioritized":
                raise InvalidRequest(
                    f"table {self.name!r}: priorities given but the sampler is {self.sampler.kind!r}",
                    table=self.name,
                    field="priority",
                )
            priority = torch.as_tensor(priority, dtype=torch.float64).reshape(-1)
            if not torch.isfinite(priority).all() or (priority < 0).any():
                raise InvalidRequest(
                    f"table {self.name!r}: priorities must be finite and >= 0",
                    table=self.name,
                    field="priority",
                )
            if len(priority) != n:
                raise InvalidRequest(
                    f"table {self.name!r}: {len(priority)} priorities for {n} rows",
                    table=self.name,
                    field="priority",
                    expected=n,
                    got=len(priority),
                )
        values = data[self._value_key] if self._value_key else None
        if values is not None and bool(torch.isnan(values).any()):
            # a NaN would outrank every value and never leave the table
            key = join_key(self._value_key or ())
            raise InvalidRequest(
                f"table {self.name!r}: key {key!r} holds NaN; the max_value writer ranks items by it",
                table=self.name,
                field=key,
                expected="a number",
                got="nan",
            )
        episode = self._episodes(data, n) if self.sampler.needs_episodes else None
        with self._cond:
            if self.rate_limiter.insert_never_fits(n):
                raise InvalidRequest(
                    f"table {self.name!r}: an insert of {n} items can never pass the rate limiter "
                    f"(samples_per_insert {self.rate_limiter.samples_per_insert}, error_buffer "
                    f"{self.rate_limiter.error_buffer}); send smaller chunks",
                    table=self.name,
                    field="batch_size",
                )
            self._wait(
                lambda: self.rate_limiter.can_insert(n) and self.writer.can_claim(n),
                timeout,
                "insert",
            )
            claim = self.writer.claim(n, values)
            index = claim.index
            k = len(index)
            if k == 0:
                return index
            # A slice target (a contiguous run) makes the slot updates views, not gathers.
            target = claim.target
            evicted = index[self.slots.live[target]]
            if len(evicted):
                self._remove(evicted)
            self.slots.busy[target] = True
            seq = torch.arange(self.slots.next_seq, self.slots.next_seq + k, dtype=torch.int64)
            self.slots.next_seq += k
        if claim.rows is not None:
            data = {key: v.index_select(0, claim.rows) for key, v in data.items()}
            if episode is not None:
                episode = episode[claim.rows]
            if priority is not None:
                priority = priority[claim.rows]
        try:
            self._data_lock.acquire_write()
            try:
                for hook in self._before_write:  # e.g. a checkpoint saving the rows' old contents
                    hook(target)
                self.backend.write(target, data)
            finally:
                self._data_lock.release_write()
            if self._fsync:
                self.backend.flush()
        except BaseException:
            with self._cond:  # the slots stay empty; what they held was evicted above
                self.slots.busy[target] = False
                self._notify()
            raise
        with self._cond:
            s = self.slots
            s.busy[target] = False
            # An item's own state first, "live" last (see durable.py): a crash in
            # between leaves the slots empty, never live with a predecessor's state.
            s.seq[target] = seq
            s.times_sampled[target] = 0
            self.sampler.before_live(index, episode)
            s.live[target] = True
            s.n_live += k
            top = target.stop if isinstance(target, slice) else int(index.max()) + 1
            s.hi = max(s.hi, top)
            self.sampler.on_insert(index, episode)
            if priority is not None:
                self.sampler.update_priority(index, priority)
            self.rate_limiter.inserted(k)
            self.bytes_in += k * self._item_nbytes
            self._persist()
            self._notify()
        return index

    def _episodes(self, data: Mapping[NestedKey, torch.Tensor], n: int) -> torch.Tensor:
        """Episode id per item: the trajectory key as given, or counted from end flags."""
        if self._traj_key is not None:
            return data[self._traj_key].reshape(n).to(torch.int64)
        assert self._end_key is not None
        ends = data[self._end_key].reshape(n).to(torch.int64)
        with self._cond:
            base = self._episode_base
            self._episode_base += int(ends.sum())
        return base + torch.cumsum(ends, 0) - ends

    def _remove(self, index: torch.Tensor) -> None:
        """Mark live slots dead (lock held)."""
        self.slots.live[index] = False
        self.slots.n_live -= len(index)
        self.sampler.on_remove(index)

    # ------------------------------------------------------------ sample
    def can_sample(self, n: int = 1) -> bool:
        """Whether a sample of ``n`` items would proceed now, without waiting."""
        with self._cond:
            return self._sample_ready(n)

    def _sample_ready(self, n: int) -> bool:
        return (
            self.rate_limiter.can_sample(n, self.slots.n_live)
            and self.sampler.ready(n)
            and (not self._cap_times or self._samples_left(n))
        )

    def _samples_left(self, n: int) -> bool:
        """Whether the live items may be returned ``n`` more times under ``max_times_sampled``."""
        s = self.slots
        if s.n_live >= n:  # every live item has at least one sample left
            return True
        return int((self.max_times_sampled - s.times_sampled[s.live]).sum()) >= n

    def _cap_times_sampled(
        self, index: torch.Tensor, weight: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Redraw the draws that would return an item more than ``max_times_sampled`` times.

        Reverb samples a batch item by item and removes an item the moment it
        reaches ``max_times_sampled``; a batch drawn at once, with replacement,
        must not return it more often. Items that reach the limit are removed
        here so the redraws cannot pick them; :meth:`_samples_left` made sure
        enough samples remain. Lock held.
        """
        s, limit = self.slots, self.max_times_sampled
        while True:
            order = torch.argsort(index, stable=True)
            uniq, counts = torch.unique_consecutive(index[order], return_counts=True)
            starts = torch.cumsum(counts, 0) - counts
            rank = torch.empty_like(index)  # how many earlier draws picked the same item
            rank[order] = torch.arange(len(index)) - torch.repeat_interleave(starts, counts)
            over = (s.times_sampled[index] + rank >= limit).nonzero().squeeze(1)
            if len(over) == 0:
                return index, weight
            spent = uniq[(s.times_sampled[uniq] + counts >= limit) & s.live[uniq]]
            self._remove(spent)
            redrawn, redrawn_weight = self.sampler.sample(len(over))
            index = index.clone()
            index[over] = redrawn
            if weight is not None and redrawn_weight is not None:
                weight[over] = redrawn_weight

    def check_batch_size(self, batch_size: Any) -> int:
        """``batch_size`` as an int, if a sample of that many items is possible at all.

        Raises:
            InvalidRequest: not an integer in ``[1, capacity]``, or not a multiple
                of the slice sampler's ``slice_len``.
        """
        try:
            n = operator.index(batch_size)  # 2.5 or "8" is an error, not a silent 2 or 8
        except TypeError:
            n = -1
        if n < 1 or n > self.capacity:
            raise InvalidRequest(
                f"table {self.name!r}: batch_size must be an integer in [1, {self.capacity}], got {batch_size!r}",
                table=self.name,
                field="batch_size",
                expected=f"[1, {self.capacity}]",
                got=batch_size,
            )
        self.sampler.check_batch_size(n)
        return n

    def sample(
        self, batch_size: int, *, timeout: float | None = None, out: TensorDictBase | None = None
    ) -> TensorDictBase:
        """Draw ``batch_size`` items.

        Waits while the rate limiter holds samples back (too few items, or
        too few inserts for ``samples_per_insert``).

        Args:
            batch_size: number of items; for the slice sampler a multiple of ``slice_len``.
            timeout: seconds to wait for the rate limiter; ``None`` waits as long as it takes.
            out: a TensorDict of batch ``[batch_size]`` with the schema's keys (and
                optionally the sample-info keys) to gather into instead of
                allocating; e.g. a previous batch.

        Returns:
            A TensorDict of batch ``[batch_size]``: every field plus ``index`` and
            ``sample_info`` (see the module docstring).

        Raises:
            InvalidRequest: ``batch_size`` < 1, above capacity, not a multiple of
                ``slice_len``, or ``out`` does not fit.
            RateLimitTimeout: the sample waited ``timeout`` seconds.
            TableClosed: the table is closed, or was closed while the sample waited.
        """
        n = self.check_batch_size(batch_size)
        bufs, out_info = self._check.out_buffers(out, n) if out is not None else (None, {})
        with self._cond:
            if self.rate_limiter.sample_never_fits(n):
                raise InvalidRequest(
                    f"table {self.name!r}: a sample of {n} items can never pass the rate limiter "
                    f"(error_buffer {self.rate_limiter.error_buffer}); sample smaller batches",
                    table=self.name,
                    field="batch_size",
                )
            self._wait(lambda: self._sample_ready(n), timeout, "sample")
            index, weight = self.sampler.sample(n)
            if self._cap_times:
                index, weight = self._cap_times_sampled(index, weight)
            s = self.slots
            s.times_sampled.index_add_(0, index, torch.ones_like(index))
            times = s.times_sampled.index_select(0, index)
            keys = s.seq.index_select(0, index)
            priority = self.sampler.priority(index)
            if self.sampler.consumes:
                # queues and stacks return distinct live items, each now spent
                self._remove(index)
            elif self.max_times_sampled:
                done = torch.unique(index[times >= self.max_times_sampled])
                done = done[s.live[done]]
                if len(done):
                    self._remove(done)
            self.rate_limiter.sampled(n)
            self.bytes_out += n * self._item_nbytes
            self._persist()
            # Take the read lock before letting go of the table lock: slots just
            # evicted cannot be overwritten until the gather below is done.
            self._data_lock.acquire_read()
            self._notify()
        try:
            if bufs is None:
                bufs = self.backend.empty(n)
            self.backend.gather(index, bufs)
        finally:
            self._data_lock.release_read()
        info = {
            ("index",): index,
            ("sample_info", "priority"): priority
            if priority is not None
            else torch.ones(n, dtype=torch.float32),
            ("sample_info", "weight"): weight
            if weight is not None
            else torch.ones(n, dtype=torch.float32),
            ("sample_info", "times_sampled"): times,
            ("sample_info", "key"): keys,
        }
        if out is not None:
            target = out._tensordict if is_tensorclass(out) else out
            for key, value in info.items():
                if key in out_info:
                    out_info[key].copy_(value)
                else:
                    target.set(key, value)
            return out
        bufs.update(info)
        # nest() with the key tree worked out once, in __init__
        return TensorDict._new_unsafe(fill(self._batch_tree, bufs), batch_size=torch.Size([n]))

    # ------------------------------------------------------------ priorities
    def update_priority(self, index: Any, priority: Any, *, key: Any = None) -> int:
        """Set the priorities of slots ``index`` (from ``batch["index"]``).

        Slots removed since they were sampled are skipped. Without ``key`` a
        slot overwritten since then is not told apart: the update applies to
        the item now in it. With ``key`` (from ``batch["sample_info", "key"]``)
        only slots whose item still has that key are updated; the others, whose
        items were overwritten, are skipped.

        Args:
            index: the slots, int64 ``[N]``.
            priority: their new priorities, ``[N]`` (finite, >= 0).
            key: the sampled items' keys, int64 ``[N]``; ``None``: no check.

        Returns:
            How many priorities were applied (``N`` less the skipped slots).

        Raises:
            InvalidRequest: the sampler has no priorities, the lengths differ, an
                index is out of range, a key is not an integer, or a priority is
                negative or not finite. Nothing is updated.
        """
        index = torch.as_tensor(index).reshape(-1).to(torch.int64)
        priority = torch.as_tensor(priority).reshape(-1)
        if key is not None:
            key = torch.as_tensor(key).reshape(-1)
            if key.dtype.is_floating_point or key.dtype.is_complex or key.dtype == torch.bool:
                raise InvalidRequest(
                    f"table {self.name!r}: keys must be integers, got {str(key.dtype).removeprefix('torch.')}",
                    table=self.name,
                    field="key",
                    expected="int64",
                    got=str(key.dtype).removeprefix("torch."),
                )
            if len(key) != len(index):
                raise InvalidRequest(
                    f"table {self.name!r}: {len(index)} indices but {len(key)} keys",
                    table=self.name,
                    field="key",
                    expected=len(index),
                    got=len(key),
                )
            key = key.to(torch.int64)
        with self._cond:
            updated = self.sampler.update_priority(index, priority, key)
            self._persist()
            self._notify()
        return updated

    # ------------------------------------------------------------ state
    @property
    def size(self) -> int:
        """Items a sampler may return now."""
        return self.slots.n_live

    def __len__(self) -> int:
        return self.slots.n_live

    def info(self) -> dict[str, Any]:
        """A JSON-ready summary: size, capacity, backend, sampler, writer, counters, limiter."""
        with self._cond:
            return {
                "name": self.name,
                "size": self.slots.n_live,
                "capacity": self.capacity,
                "backend": self.spec.backend.kind,
                "location": self.backend.location,
                "item_nbytes": self.spec.item_nbytes,
                "fields": {k: f.model_dump() for k, f in self.spec.fields.items()},
                "sampler": {**self.spec.sampler.model_dump(), **self.sampler.info()},
                "writer": self.writer.info(),
                "max_times_sampled": self.max_times_sampled,
                "rate_limiter": self.rate_limiter.info(),
                "can_sample": self._sample_ready(1),
                "can_insert": self.rate_limiter.can_insert(1) and self.writer.can_claim(1),
                "inserts": self.rate_limiter.inserts,
                "samples": self.rate_limiter.samples,
                "bytes_in": self.bytes_in,
                "bytes_out": self.bytes_out,
            }

    def state_dict(self) -> dict[str, Any]:
        """Slot, sampler, writer and rate-limiter state (no data); lock held by the caller or not."""
        return {
            "slots": self.slots.state_dict(),
            "sampler": self.sampler.state_dict(),
            "writer": self.writer.state_dict(),
            "rate_limiter": self.rate_limiter.state_dict(),
            "episode_base": self._episode_base,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        base = state.get("episode_base", 0)
        if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base < 1 << 62:
            raise StateError(f"episode_base: expected an integer in [0, 2**62), got {base!r:.40}")
        with self._cond:
            self.slots.load_state_dict(state["slots"])
            self.writer.load_state_dict(state["writer"])
            self.sampler.load_state_dict(state["sampler"])
            self.rate_limiter.load_state_dict(state["rate_limiter"])
            self._episode_base = base
            if "generator" in state:
                self.generator.set_state(state["generator"])
            if self._durable is not None:  # a restore: the state is whole now
                self._durable.save()
                self._durable.commit()
            self._notify()

    # ------------------------------------------------------------ persistence
    def checkpoint(self, path: str | Path, *, ted2flat: bool | None = None) -> Path:
        """Write data and state to ``path`` atomically (aside, then renamed into place).

        Extends and samples wait while the checkpoint is written. An
        interrupted checkpoint leaves the previous one at ``path`` intact.

        Args:
            path: the checkpoint folder (replaced if it exists).
            ted2flat: store TED data flat with TorchRL's ``TED2Flat`` (default: the spec's setting).

        Returns:
            The checkpoint folder.

        Raises:
            CheckpointError: it could not be written (the previous one is kept).
        """
        from .checkpoint import checkpoint

        return checkpoint(self, Path(path), ted2flat=ted2flat)

    def export(
        self, path: str | Path, *, format: str | None = None, progress: bool | None = None
    ) -> Path:
        """Write the live items, oldest first, to a Parquet or CSV file (see :mod:`tdreplay.storage.export`)."""
        from .export import export

        return export(self, Path(path), format=format, progress=progress)

    def import_parquet(
        self, path: str | Path, *, chunk: int = 4096, progress: bool | None = None
    ) -> int:
        """Extend the table with the rows of a Parquet dataset (see :mod:`tdreplay.storage.export`)."""
        from .importer import import_parquet

        return import_parquet(self, Path(path), chunk=chunk, progress=progress)

    def live_index(self) -> torch.Tensor:
        """Slots of the live items, oldest first (insertion order)."""
        with self._cond:
            live = self.slots.live.nonzero().squeeze(1)
            return live[torch.argsort(self.slots.seq[live])]

    def read(self, index: torch.Tensor) -> TensorDictBase:
        """The items in slots ``index`` (no sample info, no counters moved).

        Raises:
            InvalidRequest: an index is outside ``[0, capacity)``.
            TableClosed: the table is closed.
        """
        index = torch.as_tensor(index, dtype=torch.int64).reshape(-1)
        if self.closed:
            raise TableClosed(f"table {self.name!r} is closed", table=self.name)
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= self.capacity):
            bad = index[(index < 0) | (index >= self.capacity)][0].item()
            raise InvalidRequest(
                f"table {self.name!r}: index {bad} outside [0, {self.capacity})",
                table=self.name,
                field="index",
                expected=f"[0, {self.capacity})",
                got=bad,
            )
        with self._data_lock.read():
            bufs = self.backend.read(index)
        return nest(bufs, len(index))

    def close(self) -> None:
        """Wake any waiting call (it raises) and release the storage handles."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        with self._data_lock.write():
            self.backend.flush()
            self.backend.close()

    def destroy(self) -> None:
        """Close the table and delete its data."""
        with self._cond:
            self.closed = True
            self._cond.notify_all()
        with self._data_lock.write():
            self.backend.destroy()

    def __repr__(self) -> str:
        return (
            f"Table(name={self.name!r}, size={self.slots.n_live}, capacity={self.capacity}, "
            f"backend={self.spec.backend.kind!r}, sampler={self.sampler.kind!r}, writer={self.writer.kind!r})"
        )
