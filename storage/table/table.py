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
* ``batch["sample_info", "max_weight"]`` (float64, prioritized tables only): the
  largest weight the table could give when the item was drawn, ``(N * P_min)^-beta``,
  which ``weight`` was divided by (a sharded client normalises over all servers with it).
* ``batch["sample_info", "times_sampled"]`` (int64): how often the item has now
  been returned, this sample included.
* ``batch["sample_info", "key"]`` (int64): the item's key, its ordinal (1 for
  the table's first item; unique for the table's life, checkpoint and restore included). Pass it to
  :meth:`Table.update_priority` with the index so that an update skips slots
  overwritten since the sample, as Reverb's item keys do.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from tdreplay.codec.protocol import IMPORT_CHUNK, MAX_BATCH_BYTES

from ..backends import allocate, reopen, sweep
from ..checkpoint import CheckpointPath, checkpoint, restore
from ..export import export
from ..importer import import_parquet
from ..redis_conn import RedisConnection, connections
from ..spec import TableSpec
from .draws import Draws
from .figures import Figures
from .inserts import Inserts
from .snapshot import Items, Snapshot


class Table(Inserts, Draws, Figures):
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
        preallocate: bool = False,
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
            preallocate: reserve a memmap or h5 table's whole capacity on disk now, a
                redis table's in Redis (as the spec's ``backend.preallocate`` does); by
                default disk and Redis memory are reserved as rows arrive and follow the data.

        Raises:
            SchemaError: the schema file is invalid, or names a Redis connection
                not in ``redis``.
            TableExists: ``<root>/tables/<name>`` is not this table's folder, or
                holds an earlier table's data and ``replace`` is not set.
            InsufficientStorage: the disk (a redis table: the Redis's memory) has no room
                for what must be reserved now.
            BackendError: the storage could not be allocated.
        """
        if not isinstance(spec, TableSpec):
            spec = TableSpec.from_file(spec)
        backend = allocate(
            spec,
            root,
            exists="replace" if replace else "error",
            redis=connections(redis),
            preallocate=preallocate,
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
        preallocate: bool = False,
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
            preallocate: see :meth:`create` (a reopened table gets its capacity
                reserved if the disk has room).

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
        backend = reopen(spec, root, preallocate=preallocate)
        if backend is None:
            table = cls.create(spec, root, seed=seed, redis=redis, preallocate=preallocate)
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
        return restore(cls, Path(path), root, seed=seed, redis=connections(redis), expect=expect)

    # ------------------------------------------------------------ reading it whole
    @contextlib.contextmanager
    def snapshot(self, *, hold: bool = False, live_only: bool = False) -> Iterator[Snapshot]:
        """The table at this instant, read while it keeps serving (see :mod:`.snapshot`):
        its state and ``hi`` now, and rows ``[0, hi)`` as they are now for
        :meth:`Snapshot.copy <.snapshot.Snapshot.copy>` to give, inside the block.

        Args:
            hold: keep the table's locks for the whole block: nothing changes meanwhile,
                and extends and samples wait (how checkpoints were made before snapshots,
                kept to compare against).
            live_only: give the rows of the slots live at this instant only (see
                :attr:`Snapshot.rows <.snapshot.Snapshot.rows>`).

        Raises:
            TableClosed: the table is closed.

            >>> import tempfile, torch
            >>> from tensordict import TensorDict
            >>> spec = TableSpec.model_validate({"name": "s", "capacity": 8,
            ...     "fields": {"x": {"shape": [], "dtype": "int64"}}})
            >>> table = Table.create(spec, root=tempfile.mkdtemp())
            >>> _ = table.extend(TensorDict({"x": torch.arange(3)}, [3]))
            >>> with table.snapshot() as snap:
            ...     _ = table.extend(TensorDict({"x": torch.arange(5)}, [5]))  # goes on meanwhile
            ...     snap.hi, snap.size, snap.state["slots"]["inserted"]
            (3, 3, 3)
        """
        self._cond.acquire()
        self._data_lock.acquire_read()
        try:
            self._check_open()
            s = self.slots
            snap = Snapshot(
                self,
                self.state_dict(),
                s.hi,
                s.n_live,
                held=hold,
                changes=self.changes,
                live_only=live_only,
            )
            if not hold and snap.hi:
                self._before_write.append(snap.before_write)
        except BaseException:
            self._data_lock.release_read()
            self._cond.release()
            raise
        if not hold:  # the state is taken: the table serves on while the block reads rows
            self._data_lock.release_read()
            self._cond.release()
        try:
            yield snap
        finally:
            if hold:
                self._data_lock.release_read()
                self._cond.release()
            elif snap.hi:
                with self._data_lock.read():  # no extend is calling the hooks
                    self._before_write.remove(snap.before_write)

    def items(self) -> Items:
        """The live items now, oldest first, to read a chunk at a time (each item whole, as
        it is now; one overwritten meanwhile is left out): what an export reads.

        Raises:
            TableClosed: the table is closed.
        """
        with self._cond:
            self._check_open()
            s = self.slots
            busy = s.busy.clone() if bool(s.busy.any()) else None
            items = Items(self, s.n_live, s.inserted, s.hi, self.writer.ring_start(), busy=busy)
        if items.ring is None:
            items.order = items.sorted()
        return items

    # ------------------------------------------------------------ persistence
    def checkpoint(
        self, path: str | Path, *, ted2flat: bool | None = None, own_only: bool = False
    ) -> CheckpointPath:
        """Write data and state to ``path`` atomically (aside, then renamed into place).

        The checkpoint is one :meth:`snapshot`: extends and samples go on while its rows
        are copied. An interrupted checkpoint leaves the previous one at ``path`` intact.
        A table unchanged since it wrote the checkpoint at ``path`` (rows and state: a
        sample changes the state), which is still there whole, is not written again: the
        path returned says ``skipped``.

        Args:
            path: the checkpoint folder (a checkpoint there is replaced; anything else but
                an empty folder is refused and kept).
            ted2flat: store TED data flat with TorchRL's ``TED2Flat`` (default: the spec's setting).
            own_only: replace only a checkpoint of this table (anything else: ``PathExists``).

        Returns:
            The checkpoint folder (``skipped``: nothing written, it was up to date).

        Raises:
            CheckpointError: it could not be written (the previous one is kept).
            PathExists: something not a checkpoint is at ``path``, or (``own_only``) a
                checkpoint of another table; it is kept.
        """
        began = time.monotonic()
        try:
            written = checkpoint(self, Path(path), ted2flat=ted2flat, own_only=own_only)
        except BaseException:
            self.checkpoints["failed"] += 1
            raise
        nbytes = sum(f.stat().st_size for f in written.rglob("*") if f.is_file())
        self.checkpoints.update(
            ok=self.checkpoints["ok"] + 1,
            skipped=self.checkpoints["skipped"] + written.skipped,
            last_ok_at=time.time(),
            seconds=time.monotonic() - began,
            bytes=nbytes,
        )
        return written

    def export(
        self,
        path: str | Path,
        *,
        format: str | None = None,
        progress: bool | None = None,
        replace: bool = True,
    ) -> Path:
        """Write the live items, oldest first, to a Parquet or CSV file (see
        :func:`tdreplay.storage.export.export`; ``replace=False`` never replaces a file)."""
        return export(self, Path(path), format=format, progress=progress, replace=replace)

    def import_parquet(
        self,
        path: str | Path,
        *,
        columns: Mapping[str, str] | None = None,
        ignore_extra: bool = False,
        chunk: int = IMPORT_CHUNK,
        progress: bool | None = None,
        max_batch_bytes: int = MAX_BATCH_BYTES,
    ) -> int:
        """Extend the table with the rows of a Parquet dataset (see
        :func:`tdreplay.storage.importer.import_parquet`; the policy of which columns and
        casts are accepted is :mod:`tdreplay.codec.parquet_import`)."""
        return import_parquet(
            self,
            Path(path),
            columns=columns,
            ignore_extra=ignore_extra,
            chunk=chunk,
            progress=progress,
            max_batch_bytes=max_batch_bytes,
        )
