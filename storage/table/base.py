"""The table's state and the rules every operation shares: locks, waiting, bookkeeping.

:class:`TableBase` holds what a table is made of - its storage, slots,
sampler, writer, rate limiter, locks - and the parts every operation uses:
the rate-limiter wait (:meth:`TableBase._admit`), the change listeners, the
durable state record and ``state_dict``. Inserts (:mod:`.inserts`), draws
(:mod:`.draws`) and figures (:mod:`.figures`) build on it; :class:`~.table.Table`
puts them together.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tdreplay.codec.params import MAX_WAIT, seconds

from .. import spec as S
from ..backends import Backend
from ..durable import STATE_DIR, DurableState
from ..errors import InvalidRequest, RateLimitTimeout, TableClosed
from ..last_checkpoint import Written
from ..rate_limiter import Op, RateLimiter
from ..rwlock import RWLock
from ..samplers import Sampler, make_sampler
from ..scalars import Scalars
from ..slot_policy import MaxValuePolicy, SlotPolicy, make_slot_policy
from ..slots import Slots
from ..spec import TableSpec, split_key
from ..statefile import StateError
from ..tensordicts import key_tree
from ..validation import RowChecker, info_dtypes
from .stats import ScanCache


class _HeldBack(Exception):
    """An attempt (``Table.try_extend`` / ``try_sample``) the rate limiter holds back."""


class TableBase(Scalars):
    """What a table is made of, and the rules its operations share (see :class:`~.table.Table`)."""

    SCALARS = {"episode_base": int}  # the table's own scalar state, beside its parts'

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
        self.writer: SlotPolicy = make_slot_policy(spec, self.slots)
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
        #: the sample-info columns of its samples, by key (a weighted sampler's add
        #: ``max_weight``)
        self.info_dtypes = info_dtypes(self.sampler.weighted)
        self._check = RowChecker(
            spec.name, self._schema, spec.capacity, spec.categories(), self.info_dtypes
        )
        self._batch_tree = key_tree([*self._keys, *self.info_dtypes])
        self._cond = threading.Condition(threading.Lock())
        self._data_lock = RWLock()
        self._listeners: list[Callable[[], None]] = []
        #: called with the rows about to be overwritten, under the data write lock
        self._before_write: list[Callable[[slice | torch.Tensor], None]] = []
        #: episodes begun so far (the next episode's id); the durable record saves it
        self.episode_base = 0
        #: changes of its rows or state so far (under ``_cond``): a checkpoint that finds the
        #: count where the last one it wrote left it has nothing new to write
        self.changes = 0
        #: the checkpoint it last wrote (see :func:`~tdreplay.storage.checkpoint.write.up_to_date`)
        self.last_checkpoint: Written | None = None
        self._traj_key = self._end_key = None
        if isinstance(spec.sampler, S.SliceSamplerSpec):
            if spec.sampler.traj_key:
                self._traj_key = split_key(spec.sampler.traj_key)
            else:
                self._end_key = split_key(spec.sampler.end_key or "")
        self._value_key = (
            split_key(self.writer.key) if isinstance(self.writer, MaxValuePolicy) else None
        )
        #: the fields whose values an extend checks or reads before inserting them
        #: (categories, trajectory ids or end flags, the max-value writer's key): a door
        #: handing the table rows a client can still write copies these first
        self.read_keys = frozenset(
            k for k in (self._traj_key, self._end_key, self._value_key) if k is not None
        ) | frozenset(spec.categories())
        self.closed = False
        #: memmap tables keep their state in files beside the rows (see durable.py)
        self._durable: DurableState | None = None
        self._fsync = False
        if spec.backend.kind == "memmap" and backend.location is not None:
            folder = Path(backend.location) / STATE_DIR
            self._durable = (DurableState.open if reopen else DurableState.create)(folder, self)
        # counters for info/metrics
        self.created_at = time.time()
        self.bytes_in = 0
        self.bytes_out = 0
        #: checkpoints written (ok) and failed since the table was opened; the last good one
        self.checkpoints: dict[str, Any] = {
            "ok": 0,
            "failed": 0,
            "skipped": 0,
            "last_ok_at": None,
            "seconds": None,
            "bytes": None,
        }
        self._scans = ScanCache()

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

    # ------------------------------------------------------------ waiting
    def _check_open(self) -> None:
        """Raise :class:`TableClosed` if the table is closed (its storage handles are gone:
        a call fails instead of reading garbage)."""
        if self.closed:
            raise TableClosed(f"table {self.name!r} is closed", table=self.name)

    def _admit(
        self,
        op: Op,
        n: int,
        ready: Callable[[], bool],
        timeout: float | None,
        *,
        attempt: bool = False,
    ) -> None:
        """Return once ``ready()`` (the table's lock held), waiting up to ``timeout`` seconds.

        A call that cannot proceed is counted once as held back
        (``RateLimiter.begin_wait``). An ``attempt`` neither waits nor counts:
        it raises :class:`_HeldBack` at once (see :meth:`try_extend`).

        Raises:
            InvalidRequest: ``timeout`` breaks the contract's rule (negative, NaN: see
                :data:`~tdreplay.codec.params.Seconds`); ``inf``, or any wait a
                Condition cannot be armed for, waits as ``None`` does.
            RateLimitTimeout: still held back after ``timeout`` seconds; its subclass
                EmptyTableError when a sample's table holds no item then.
            TableClosed: the table is closed, or was closed while the call waited.
        """
        if timeout is not None:
            try:
                timeout = seconds(timeout)
            except InvalidRequest as err:
                raise InvalidRequest(
                    f"table {self.name!r}: {err} (None: no limit)",
                    table=self.name,
                    field="timeout",
                    expected=">= 0",
                    got=timeout,
                ) from None
            if timeout is not None and timeout >= MAX_WAIT:
                timeout = None  # as long as it takes (a Condition wait overflows on 1e12)
        self._check_open()
        if ready():
            return
        if attempt:
            raise _HeldBack
        began = self._begin_wait(op)
        ok = False
        try:
            if timeout is None or timeout > 0:
                ok = self._cond.wait_for(lambda: self.closed or ready(), timeout)
        finally:
            self.rate_limiter.end_wait(op, began, timed_out=not ok and not self.closed)
        if self.closed:
            raise TableClosed(
                f"table {self.name!r} was closed while a call waited", table=self.name
            )
        if not ok:
            raise self.held_back(op, n, timeout or 0.0)

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
        hi = s.hi  # past it nothing is live (nor read: see Slots.written)
        return int((self.max_times_sampled - s.times_sampled[:hi][s.live[:hi]]).sum()) >= n

    def held_back(self, op: Op, n: int, waited: float) -> RateLimitTimeout:
        """The error of a call the rate limiter held back for ``waited`` seconds
        (:class:`EmptyTableError` for a sample of an empty table: ``RateLimiter.held_back``)."""
        return self.rate_limiter.held_back(self.name, op, n, waited, self.slots.n_live)

    def begin_wait(self, op: Op) -> float:
        """Count a call held back that its caller waits for (see ``RateLimiter.begin_wait``)."""
        with self._cond:
            return self._begin_wait(op)

    def _begin_wait(self, op: Op) -> float:
        """Count a wait (lock held): the limiter's wait counters are state a checkpoint saves."""
        self.changes += 1
        return self.rate_limiter.begin_wait(op)

    def end_wait(self, op: Op, began: float, *, timed_out: bool) -> float:
        """The end of a wait begun with :meth:`begin_wait`; returns its seconds."""
        with self._cond:
            return self.rate_limiter.end_wait(op, began, timed_out=timed_out)

    def _notify(self) -> None:
        """The table changed (lock held): count it (:attr:`changes`), wake the waiting calls
        and tell the listeners. Every change of rows or state ends here (but a wait's count:
        :meth:`_begin_wait`)."""
        self.changes += 1
        self._cond.notify_all()
        for fn in self._listeners:
            fn()

    def add_listener(self, fn: Callable[[], None]) -> None:
        """Call ``fn()`` (under the table's lock; keep it short) whenever inserts or samples may proceed."""
        self._listeners.append(fn)

    def _remove(self, index: torch.Tensor) -> None:
        """Mark live slots dead (lock held)."""
        self.slots.live[index] = False
        self.slots.n_live -= len(index)
        self.sampler.on_remove(index)

    # ------------------------------------------------------------ state
    @property
    def size(self) -> int:
        """Items a sampler may return now."""
        return self.slots.n_live

    def __len__(self) -> int:
        return self.slots.n_live

    def state_dict(self) -> dict[str, Any]:
        """Slot, sampler, writer and rate-limiter state (no data); lock held by the caller or not."""
        return {
            "slots": self.slots.state_dict(),
            "sampler": self.sampler.state_dict(),
            "writer": self.writer.state_dict(),
            "rate_limiter": self.rate_limiter.state_dict(),
            **self.scalars(),
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
            self.episode_base = base
            if "generator" in state:
                self.generator.set_state(state["generator"])
            if self._durable is not None:  # a restore: the state is whole now
                self._durable.save()
                self._durable.commit()
            self._notify()

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
