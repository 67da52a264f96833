"""Storage backends: where a table's items live.

Every backend is allocated with ``TensorDict.from_schema(fields,
batch_size=[capacity], storage=...)``; this module adds what a replay table
needs on top and keeps each backend's I/O apart:

* :class:`TensorBackend` (``memory``, ``memmap``, ``shared``): one tensor per
  field; rows are gathered with ``torch.index_select`` into reused buffers
  (10x faster than advanced indexing) and written with slice copies or
  ``index_copy_``.
* :class:`H5Backend` (``h5``): h5py datasets under a ``PersistentTensorDict``;
  reads are sorted and de-duplicated as HDF5 requires, then reordered.
* :class:`RedisBackend` (``redis``): tensordict's ``TensorDictStore``; nested
  keys are stored flat (``next:reward``) because ``from_schema`` rejects
  tuple keys on this backend.

HDF5 and Redis cannot hold bfloat16, so those fields are stored as int16 with
the same bits and viewed back on read.

Where file backends live: in the table's own folder, ``<root>/tables/<table>/``,
which carries a marker file (``.tdreplay-table.json``) naming the table; a
folder without it is never used, written into or deleted (:class:`TableExists`).
A schema cannot name a path. A memmap or h5 table's *location* is
``<root>/tables/<table>/storage`` or ``.../storage.h5``. While a backend is open there, no allocation of
this process deletes or reuses it: a second table of the same name (a restore
beside the table it is to replace) goes to a fresh sibling,
``storage.<8 hex>`` or ``storage.<8 hex>.h5``. Data no open backend holds is
never read again (tables are only ever created empty or restored from a
checkpoint), so once a table is in place, :func:`sweep` deletes the dead
location and dead siblings of its name; nothing else is touched. A data root
belongs to one process: the tables of another process are not known here.
Redis needs none of this: every allocation gets keys of its own (a fresh
``TensorDictStore`` id under the prefix), on a connection the operator
configured by name (:mod:`tdreplay.storage.redis_conn`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from .diskspace import fsync_path, reserve
from .errors import (
    BackendError,
    InsufficientStorage,
    SchemaError,
    TableExists,
    TableLost,
    TDReplayError,
)
from .redis_conn import Connections, RedisConnection, resolve
from .spec import (
    H5Backend as H5Spec,
)
from .spec import (
    MemmapBackend,
    MemoryBackend,
    NestedKey,
    SharedBackend,
    TableSpec,
)
from .spec import (
    RedisBackend as RedisSpec,
)

Rows = slice | torch.Tensor
"""Rows to write: a ``slice`` for a contiguous run (the fast path) or an int64 index tensor."""

REDIS_SEP = ":"
T = TypeVar("T")
log = logging.getLogger("tdreplay.storage")

#: Batches this large or larger are carved out of one allocation (see :meth:`Backend.empty`).
ONE_BLOCK_BYTES = 128 * 1024
_ALIGN = 64


def _carrier(dtype: torch.dtype) -> torch.dtype:
    """The dtype a backend without bfloat16 stores a field as (same bits)."""
    return torch.int16 if dtype == torch.bfloat16 else dtype


class Backend:
    """Base class: a fixed-capacity row store for the fields of one table.

    Subclasses implement :meth:`write` and :meth:`gather`; both take rows along
    the first (capacity) dimension. Callers (the :class:`~tdreplay.storage.Table`)
    serialize writes against reads of the same rows.
    """

    kind: str = ""

    def __init__(self, spec: TableSpec, storage: TensorDictBase) -> None:
        self.spec = spec
        self.capacity = spec.capacity
        self.keys: list[NestedKey] = spec.keys()
        self.dtypes: dict[NestedKey, torch.dtype] = {
            k: d for k, (_, d) in spec.torch_schema().items()
        }
        self.shapes: dict[NestedKey, list[int]] = {
            k: s for k, (s, _) in spec.torch_schema().items()
        }
        #: the TensorDict that ``from_schema`` returned
        self.storage = storage
        self._row_nbytes = [math.prod(self.shapes[k]) * self.dtypes[k].itemsize for k in self.keys]

    # -- I/O ---------------------------------------------------------------
    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        raise NotImplementedError

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        """Copy rows ``index`` of every field into the tensors of ``out``."""
        raise NotImplementedError

    def read(self, index: torch.Tensor) -> dict[NestedKey, torch.Tensor]:
        """Rows ``index`` of every field, in fresh tensors."""
        out = self.empty(len(index))
        self.gather(index, out)
        return out

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        """Rows ``start:stop`` of every field."""
        return self.read(torch.arange(start, stop, dtype=torch.int64))

    def empty(self, n: int) -> dict[NestedKey, torch.Tensor]:
        """Fresh uninitialized tensors for ``n`` rows of every field.

        A batch of ``ONE_BLOCK_BYTES`` or more is one allocation carved into
        the fields (64-byte aligned views of it). glibc then hands the same
        block back call after call, where separate multi-megabyte buffers are
        often returned to the OS when freed and come back as fresh pages that
        fault in at first touch (seen: ~500 page faults and twice the time per
        atari batch of 256, at random from run to run).
        """
        sizes = [n * b for b in self._row_nbytes]
        if sum(sizes) < ONE_BLOCK_BYTES:
            return {k: torch.empty([n, *self.shapes[k]], dtype=self.dtypes[k]) for k in self.keys}
        spans = [-(-size // _ALIGN) * _ALIGN for size in sizes]
        block = torch.empty(sum(spans), dtype=torch.uint8)
        out = {}
        start = 0
        for k, size, span in zip(self.keys, sizes, spans, strict=True):
            out[k] = block[start : start + size].view(self.dtypes[k]).view(n, *self.shapes[k])
            start += span
        return out

    # -- lifecycle ---------------------------------------------------------
    def flush(self) -> None:
        """Make written rows durable where the backend has a notion of it."""

    def close(self) -> None:
        """Release handles; the data stays where it is (disk, Redis)."""

    def destroy(self) -> None:
        """Close and delete the data itself."""
        self.close()

    @property
    def location(self) -> str | None:
        """Where the data lives (a path or a Redis URL), for ``Table.info``."""
        return None


class TensorBackend(Backend):
    """``memory``, ``memmap`` and ``shared``: one CPU tensor per field."""

    def __init__(
        self, spec: TableSpec, storage: TensorDictBase, claim: Claim | None = None
    ) -> None:
        super().__init__(spec, storage)
        self.kind = spec.backend.kind
        self.claim = claim
        self.path = claim.path if claim is not None else None
        self._row_files: list[Path] | None = None
        self.tensors: dict[NestedKey, torch.Tensor] = {k: storage.get(k) for k in self.keys}
        # The hot paths use plain-Tensor views of the same memory: slicing a
        # MemoryMappedTensor goes through its Python __getitem__ (9 us against
        # 2 us per field for a slice copy).
        self._items = [(k, t.as_subclass(torch.Tensor)) for k, t in self.tensors.items()]

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        if isinstance(rows, slice):
            for key, t in self._items:
                t[rows].copy_(data[key])
        else:
            for key, t in self._items:
                t.index_copy_(0, rows, data[key])

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        for key, t in self._items:
            torch.index_select(t, 0, index, out=out[key])

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        return {k: t[start:stop].clone() for k, t in self._items}

    def view_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        """Rows ``start:stop`` without a copy (the caller must not hold them across writes)."""
        return {k: t[start:stop] for k, t in self.tensors.items()}

    def flush(self) -> None:
        """memmap: fsync the row files (their dirty pages go to disk); nothing for memory/shared."""
        if self.path is None:
            return
        if self._row_files is None:  # the same files for the backend's life: listed once
            self._row_files = sorted(self.path.rglob("*.memmap"))
        for file in self._row_files:
            fsync_path(file)

    def close(self) -> None:
        self.tensors.clear()
        self._items = []
        if self.claim is not None:
            self.claim.release()

    def destroy(self) -> None:
        self.tensors.clear()
        self._items = []
        if self.claim is not None:  # deleted before close() lets the location go
            with contextlib.suppress(OSError):
                _delete(self.claim.path)
        self.close()
        if self.claim is not None:
            _release_folder(self.claim.path.parent, self.spec.name)

    @property
    def location(self) -> str | None:
        return str(self.path) if self.path is not None else None


class H5Backend(Backend):
    """``h5``: one HDF5 file, a dataset per field."""

    kind = "h5"

    def __init__(self, spec: TableSpec, storage: TensorDictBase, claim: Claim) -> None:
        super().__init__(spec, storage)
        self.claim = claim
        self.path = claim.path
        self.file = storage.file  # type: ignore[attr-defined]
        self.datasets = {k: self.file["/".join(k)] for k in self.keys}

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        if isinstance(rows, slice):
            for key, ds in self.datasets.items():
                ds[rows] = _to_numpy(data[key])
            return
        order = torch.argsort(rows)
        srows = rows[order].numpy()
        for key, ds in self.datasets.items():
            ds[srows] = _to_numpy(data[key][order])

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        uniq, inverse = torch.unique(index, sorted=True, return_inverse=True)
        rows = uniq.numpy()
        for key, ds in self.datasets.items():
            got = torch.from_numpy(ds[rows])
            if self.dtypes[key] == torch.bfloat16:
                got = got.view(torch.bfloat16)
            torch.index_select(got, 0, inverse, out=out[key])

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        out = {}
        for key, ds in self.datasets.items():
            got = torch.from_numpy(ds[start:stop])
            out[key] = got.view(torch.bfloat16) if self.dtypes[key] == torch.bfloat16 else got
        return out

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already closed
            self.file.close()
        self.claim.release()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.file.close()
        self.path.unlink(missing_ok=True)  # before close() lets the location go
        self.close()
        _release_folder(self.path.parent, self.spec.name)

    @property
    def location(self) -> str | None:
        return str(self.path)


class RedisBackend(Backend):
    """``redis``: tensordict's ``TensorDictStore``, nested keys stored flat.

    **Identity.** At allocation a marker key, ``<prefix>:{<td_id>}:__tdreplay__``,
    is written with the table's name and a random epoch. A Redis that restarts
    without persistence, or is flushed, loses it with the rows; and there
    ``TensorDictStore`` would read missing keys as nothing and a write would
    recreate them zero-filled, so the table would serve zeros. The marker is
    checked before every write and, at most once a second (:data:`MARKER_INTERVAL`),
    before reads (and after any read that failed on the data); once it is
    missing the table's :attr:`state` is ``"lost"`` and every write and read
    raises :class:`TableLost`.

    **Hangs.** Every command has the connection's timeout, and a timed-out
    command is not retried: redis-py's default policy retries three times and
    each reconnect retries on its own (15 s for a 1 s timeout, measured), so a
    hung Redis fails a call in about the timeout, with :class:`BackendError`.
    A dropped connection is retried once (a restarted Redis).
    """

    kind = "redis"

    def __init__(self, spec: TableSpec, storage: TensorDictBase, conn: RedisConnection) -> None:
        super().__init__(spec, storage)
        self.conn = conn
        self.url = conn.describe()
        self.flat = {k: REDIS_SEP.join(k) for k in self.keys}
        self.client = _redis_client(conn)
        #: the marker key (see the class docstring) and what it holds
        self.marker_key: str = storage._redis_key(REDIS_MARKER)  # type: ignore[attr-defined]
        self._marker = b""
        self._lost = False
        self._checked = 0.0
        self._probing = threading.Lock()

    @classmethod
    def allocate(cls, spec: TableSpec, conn: RedisConnection, *, prefix: str) -> RedisBackend:
        """A fresh ``TensorDictStore`` for ``spec`` under ``prefix``, marked as this table's.

        Raises:
            BackendError: Redis failed or did not answer in time (nothing is left there).
        """
        from redis.asyncio.retry import Retry

        schema = spec.torch_schema()
        flat = {REDIS_SEP.join(k): (s, _carrier(d)) for k, (s, d) in schema.items()}
        td = TensorDict.from_schema(
            flat,
            batch_size=[spec.capacity],
            storage="redis",
            prefix=prefix,
            retry=Retry(*_retry_policy()),  # type: ignore[arg-type]
            **conn.kwargs(),
        )
        backend = cls(spec, td, conn)
        try:
            backend.mark()
        except BaseException:
            with contextlib.suppress(Exception):
                backend.destroy()
            raise
        return backend

    # -- identity ------------------------------------------------------------
    def mark(self) -> None:
        """Write the marker key: this table's name and a fresh epoch."""
        body = {"table": self.spec.name, "epoch": uuid.uuid4().hex, "created_at": time.time()}
        self._marker = json.dumps(body).encode()
        self._redis(
            "writing the table's marker", lambda: self.client.set(self.marker_key, self._marker)
        )
        self._checked = time.monotonic()

    @property
    def state(self) -> str:
        """``"ok"``, or ``"lost"`` once the marker was found missing (never back to ``"ok"``)."""
        return "lost" if self._lost else "ok"

    def check(self, *, force: bool = False) -> None:
        """Check the marker (unless checked less than :data:`MARKER_INTERVAL` ago and not ``force``).

        Raises:
            TableLost: the marker is missing or not this table's.
            BackendError: Redis failed or did not answer in time.
        """
        if self._lost:
            raise self._lost_error()
        if not force and time.monotonic() - self._checked < MARKER_INTERVAL:
            return
        got = self._redis("checking the table's marker", lambda: self.client.get(self.marker_key))
        if got != self._marker:
            self._lost = True
            log.error("%s", self._lost_error().message)
            raise self._lost_error()
        self._checked = time.monotonic()

    def probe(self) -> str:
        """:meth:`check` without raising, one probe at a time; returns :attr:`state`."""
        if not self._lost and self._probing.acquire(blocking=False):
            try:
                self.check()
            except TDReplayError:
                pass  # lost: in the state; unreachable: the next call says so
            finally:
                self._probing.release()
        return self.state

    def _lost_error(self) -> TableLost:
        return TableLost(
            f"table {self.spec.name!r}: its data in Redis {self.conn.name!r} ({self.url}) is gone: "
            f"the marker key {self.marker_key!r} written when the table was created is missing, "
            "so that Redis restarted without persistence, or was flushed, or evicted the keys. "
            "The table serves nothing rather than zeros: restore it from a checkpoint, or delete "
            "it and create it again (Redis persistence, appendonly yes, keeps tables across "
            "Redis restarts)",
            table=self.spec.name,
        )

    def _redis(self, doing: str, fn: Callable[[], T]) -> T:
        """``fn()``, Redis failures raised as :class:`BackendError` naming the connection."""
        import redis

        try:
            return fn()
        except redis.TimeoutError as err:
            raise BackendError(
                f"table {self.spec.name!r}: Redis {self.conn.name!r} ({self.url}) did not answer "
                f"within {self.conn.timeout:g}s (--redis-timeout) while {doing}; it is hung, "
                "overloaded or unreachable",
                table=self.spec.name,
            ) from err
        except redis.RedisError as err:
            raise BackendError(
                f"table {self.spec.name!r}: Redis {self.conn.name!r} ({self.url}) failed while "
                f"{doing}: {err}",
                table=self.spec.name,
            ) from err

    # -- I/O -----------------------------------------------------------------
    def _pack(self, data: Mapping[NestedKey, torch.Tensor], n: int) -> TensorDict:
        return TensorDict(
            {
                self.flat[k]: (v.view(torch.int16) if v.dtype == torch.bfloat16 else v).contiguous()
                for k, v in data.items()
            },
            batch_size=[n],
        )

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        self.check(force=True)  # a write into a Redis that lost the table recreates it zero-filled
        n = next(iter(data.values())).shape[0]
        packed = self._pack(data, n)

        def put() -> None:
            self.storage[rows] = packed

        try:
            self._redis("writing rows", put)
        except BackendError:
            raise
        except Exception as err:
            raise BackendError(
                f"redis write failed at {self.url}: {err}", table=self.spec.name
            ) from err

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        self.check()
        try:
            got = self._redis("reading rows", lambda: self.storage[index])
        except BackendError:
            raise
        except Exception as err:  # missing keys read as b"": a lost table, most likely
            self.check(force=True)
            raise BackendError(
                f"redis read failed at {self.url}: {err}", table=self.spec.name
            ) from err
        for key in self.keys:
            value = got.get(self.flat[key])
            if self.dtypes[key] == torch.bfloat16:
                value = value.view(torch.bfloat16)
            out[key].copy_(value)

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        return self.read(torch.arange(start, stop, dtype=torch.int64))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.storage.close()  # type: ignore[attr-defined]
        with contextlib.suppress(Exception):
            self.client.close()

    def destroy(self) -> None:
        try:
            td_id = self.storage._td_id  # type: ignore[attr-defined]
            namespace = self.storage._namespace  # type: ignore[attr-defined]
            keys = list(self.client.scan_iter(match=f"{namespace}:{{{td_id}}}:*", count=1000))
            if keys:
                self.client.delete(*keys)
        finally:
            self.close()

    @property
    def location(self) -> str | None:
        return self.url


#: the suffix of a redis table's marker key (``<prefix>:{<td_id>}:__tdreplay__``)
REDIS_MARKER = "__tdreplay__"
#: seconds between two marker checks before reads (writes check every time)
MARKER_INTERVAL = 1.0


def _retry_policy() -> tuple[Any, int, tuple[type[Exception], ...]]:
    from redis.backoff import NoBackoff
    from redis.exceptions import ConnectionError as RedisConnectionError

    return (NoBackoff(), 1, (RedisConnectionError,))


def _redis_client(conn: RedisConnection) -> Any:
    """A sync client with ``conn``'s timeouts and the retry policy of :class:`RedisBackend`."""
    import redis
    from redis.retry import Retry

    return redis.Redis(**conn.kwargs(), retry=Retry(*_retry_policy()))


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy()


#: the server-owned area of the data root where tables keep their data (``<root>/tables/<name>/``)
TABLES_DIR = "tables"
#: the file that marks a folder as a table's own: only folders carrying it are ever deleted
MARKER = ".tdreplay-table.json"


def table_dir(spec: TableSpec | str, root: str | Path) -> Path:
    """The table's own folder, ``<root>/tables/<name>``."""
    name = spec if isinstance(spec, str) else spec.name
    return Path(root) / TABLES_DIR / name


def primary_location(spec: TableSpec, root: str | Path) -> Path | None:
    """Where a file backend's data goes unless that place is taken (``None``: not a file backend)."""
    b = spec.backend
    if isinstance(b, MemmapBackend):
        return table_dir(spec, root) / "storage"
    if isinstance(b, H5Spec):
        return table_dir(spec, root) / "storage.h5"
    return None


def marker_of(folder: Path) -> str | None:
    """The table name a folder's marker names (``None``: no readable marker; not ours)."""
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    name = data.get("table") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def own_table_dir(spec: TableSpec, root: str | Path) -> Path:
    """Make sure ``<root>/tables/<name>`` is this table's own folder, creating it (with its marker) if absent.

    Raises:
        TableExists: something that is not this table's marked folder is there
            (a file, a link, a folder tdreplay did not create for this table):
            it is never used, deleted or written into.
    """
    folder = table_dir(spec, root)
    area = folder.parent
    if area.is_symlink() or (area.exists() and not area.is_dir()):
        raise TableExists(
            f"{area} is not a folder this server created; tables cannot be stored there",
            table=spec.name,
            field="name",
            got=str(area),
        )
    area.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir()
    except FileExistsError:
        if folder.is_symlink() or not folder.is_dir() or marker_of(folder) != spec.name:
            raise TableExists(
                f"table {spec.name!r}: {folder} exists and was not created by tdreplay for this "
                "table; it is left as it is (move it away, or use another table name)",
                table=spec.name,
                field="name",
                got=str(folder),
            ) from None
        return folder
    body = json.dumps({"table": spec.name, "created_at": time.time(), "pid": os.getpid()})
    tmp = folder / f"{MARKER}.tmp"
    tmp.write_text(body)
    os.replace(tmp, folder / MARKER)
    return folder


def has_data(spec: TableSpec, root: str | Path) -> list[Path]:
    """Data of table ``spec.name`` left in its folder (its location and fresh siblings)."""
    primary = primary_location(spec, root)
    if primary is None or not primary.parent.is_dir():
        return []
    siblings = _sibling_names(primary)
    return [
        p
        for p in sorted(primary.parent.iterdir())
        if p.name == primary.name or siblings.fullmatch(p.name)
    ]


def _release_table_dir(spec: TableSpec, root: str | Path) -> None:
    _release_folder(table_dir(spec, root), spec.name)


def _release_folder(folder: Path, name: str) -> None:
    """Remove a table's folder once it holds nothing but its marker (it is recreated on demand)."""
    with contextlib.suppress(OSError):
        if marker_of(folder) == name and {p.name for p in folder.iterdir()} == {MARKER}:
            (folder / MARKER).unlink()
            folder.rmdir()


_HELD: dict[Path, Claim] = {}
_HELD_GUARD = threading.Lock()


def _key(path: Path) -> Path:
    return Path(os.path.abspath(path))


class Claim:
    """A file location held by one open backend (see the module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def release(self) -> None:
        """Let the location go (idempotent; a later claim of the same path is not touched)."""
        with _HELD_GUARD:
            if _HELD.get(_key(self.path)) is self:
                del _HELD[_key(self.path)]


def _sibling(primary: Path, tag: str) -> str:
    """``storage`` -> ``storage.<tag>``, ``storage.h5`` -> ``storage.<tag>.h5``."""
    return f"{primary.stem}.{tag}{primary.suffix}"


def _sibling_names(primary: Path) -> re.Pattern[str]:
    """The names :func:`_claim` gives ``primary``'s fresh siblings."""
    return re.compile(rf"{re.escape(primary.stem)}\.[0-9a-f]{{8}}{re.escape(primary.suffix)}")


def _claim(primary: Path, *, replace: bool) -> Claim:
    """Hold ``primary``, or a fresh sibling when it is held (or, unless ``replace``, exists)."""
    with _HELD_GUARD:
        path = primary
        taken = _key(primary) in _HELD or (not replace and os.path.lexists(primary))
        while taken:
            path = primary.with_name(_sibling(primary, uuid.uuid4().hex[:8]))
            taken = os.path.lexists(path)
        claim = Claim(path)
        _HELD[_key(path)] = claim
        return claim


def _delete(path: Path) -> None:
    """Delete a file or folder tree; raises ``OSError`` when it cannot."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def sweep(spec: TableSpec, root: str | Path) -> list[Path]:
    """Delete the dead data of table ``spec.name``: its location and fresh siblings no open backend holds.

    Called once a table is in place (by :func:`allocate`, and by a restore
    once it succeeded). Only names of the form the allocator makes are
    touched (see the module docstring). Returns what was deleted.
    """
    primary = primary_location(spec, root)
    if primary is None or not primary.parent.is_dir():
        return []
    siblings = _sibling_names(primary)
    deleted = []
    with _HELD_GUARD:  # held while deleting: nothing can claim a path half deleted
        for path in list(primary.parent.iterdir()):
            ours = path.name == primary.name or siblings.fullmatch(path.name)
            if ours and _key(path) not in _HELD:
                with contextlib.suppress(OSError):
                    _delete(path)
                    deleted.append(path)
    return deleted


def stored_specs(root: str | Path, failed: dict[str, str] | None = None) -> list[TableSpec]:
    """The specs of the tables a process left reopenable under ``<root>/tables/`` (memmap).

    Only folders carrying their own marker are looked at; a stored spec goes
    through the same validation as any other (:meth:`TableSpec.parse`). A
    table whose stored spec is unreadable or invalid is left out, and why is
    put in ``failed`` (its data is kept as it is).
    """
    from .durable import DurableState

    area = Path(root) / TABLES_DIR
    if not area.is_dir() or area.is_symlink():
        return []
    out = []
    for folder in sorted(area.iterdir()):
        name = marker_of(folder)
        if name != folder.name or folder.is_symlink():
            continue
        try:
            newest = DurableState.newest(sorted(folder.iterdir()))
            if newest is None:
                continue
            spec = TableSpec.parse(newest[1], source=f"{folder} (stored spec)")
        except (TDReplayError, OSError, ValueError) as err:
            if failed is not None:
                failed[name] = f"its stored state is unreadable: {err}"
            continue
        if spec.name == name:
            out.append(spec)
    return out


def reopen(spec: TableSpec, root: str | Path) -> TensorBackend | None:
    """Map the rows a memmap table of ``spec`` left in its folder, to reopen it (``None``: nothing to reopen).

    Of the table's locations holding a complete state (see
    :mod:`tdreplay.storage.durable`), the newest is taken: an older one is dead
    data of a restore that was under way (:func:`sweep` deletes it once the
    table is open). Row files are mapped with the dtype and shape the spec
    gives, their size checked; nothing is unpickled.

    Raises:
        TableExists: the folder is not the table's own, or its data was written
            under another schema (it is left as it is).
        BackendError: a row file is missing or has the wrong size.
    """
    from .durable import DurableState, map_file, spec_matches

    if not isinstance(spec.backend, MemmapBackend):
        return None
    folder = table_dir(spec, root)
    if not folder.exists():
        return None
    own_table_dir(spec, root)
    with _HELD_GUARD:
        free = [p for p in has_data(spec, root) if _key(p) not in _HELD]
    newest = DurableState.newest(free)
    if newest is None:
        return None
    location, stored = newest
    if not spec_matches(stored, spec):
        raise TableExists(
            f"table {spec.name!r}: {location} holds its data under another schema "
            f"(capacity {stored.get('capacity')}, fields {sorted(stored.get('fields', {}))}); "
            "it is left as it is: serve the old schema, or create the table with replace "
            "to delete that data",
            table=spec.name,
            field="name",
            got=str(location),
        )
    claim = _claim(location, replace=True)
    if claim.path != location:  # taken meanwhile by a table of this process
        claim.release()
        return None
    try:
        td = TensorDict(batch_size=[spec.capacity])
        for key, (shape, dtype) in spec.torch_schema().items():
            file = location.joinpath(*key[:-1], f"{key[-1]}.memmap")  # from_schema's layout
            td.set(key, map_file(file, dtype, (spec.capacity, *shape)))
        return TensorBackend(spec, td, claim)
    except BackendError as err:
        claim.release()
        raise BackendError(f"table {spec.name!r}: {err}", table=spec.name) from None
    except BaseException:
        claim.release()
        raise


Exists = Literal["error", "replace", "beside"]


def allocate(
    spec: TableSpec,
    root: str | Path,
    *,
    exists: Exists = "replace",
    redis: Connections | None = None,
) -> Backend:
    """Allocate the storage of ``spec`` with ``TensorDict.from_schema``.

    File backends (memmap, h5) keep their data in the table's own folder,
    ``<root>/tables/<name>/``, which carries a marker naming the table; a
    folder without it is never used, written into or deleted. A location an
    open backend of this process holds is never deleted or reused either: the
    data goes to a fresh sibling instead (see the module docstring).

    Args:
        spec: the table (validated: it names no path, only a Redis connection name).
        root: the data root.
        exists: what to do with data of this table left in its folder by an
            earlier table of the same name: ``"error"`` refuses
            (:class:`TableExists`), ``"replace"`` deletes it, ``"beside"``
            leaves it and allocates a fresh sibling (a restore, which must
            leave everything as it was should it fail).
        redis: the operator's Redis connections, by name (redis backend only).

    Raises:
        TableExists: the table's folder is not its own, or (``exists="error"``)
            holds data of an earlier table of that name.
        SchemaError: the spec names a Redis connection that is not configured.
        BackendError: the backend could not be allocated (disk full, Redis down, ...);
            what it had written is deleted.
    """
    b = spec.backend
    schema = spec.torch_schema()
    cap = [spec.capacity]
    primary = primary_location(spec, root)
    claim = None
    if primary is not None:
        own_table_dir(spec, root)
        if exists == "error":
            with _HELD_GUARD:
                left = [p for p in has_data(spec, root) if _key(p) not in _HELD]
            if left:
                raise TableExists(
                    f"table {spec.name!r}: {left[0]} holds data of an earlier table of that name; "
                    "restore it, or create the table with replace to delete it",
                    table=spec.name,
                    field="name",
                    got=str(left[0]),
                )
        claim = _claim(primary, replace=exists != "beside")
    try:
        if isinstance(b, MemoryBackend):
            return TensorBackend(spec, TensorDict.from_schema(schema, batch_size=cap))
        if isinstance(b, SharedBackend):
            return TensorBackend(
                spec, TensorDict.from_schema(schema, batch_size=cap, storage="shared")
            )
        if isinstance(b, RedisSpec):
            conn = resolve(spec.name, b.connection, redis or {})
            return RedisBackend.allocate(spec, conn, prefix=b.prefix or f"tdreplay:{spec.name}")
        assert claim is not None
        path = claim.path
        if os.path.lexists(path):  # dead data (``replace``): a held location is never claimed
            _delete(path)
        if isinstance(b, MemmapBackend):
            td = TensorDict.from_schema(schema, batch_size=cap, storage="memmap", prefix=str(path))
            backend: Backend = TensorBackend(spec, td, claim)
        elif isinstance(b, H5Spec):
            h5_schema = {k: (s, _carrier(d)) for k, (s, d) in schema.items()}
            td = TensorDict.from_schema(h5_schema, batch_size=cap, storage="h5", filename=str(path))
            backend = H5Backend(spec, td, claim)
        else:  # pragma: no cover
            raise BackendError(f"unknown backend {b.kind!r}", table=spec.name)
        reserve(backend, table=spec.name)  # a full disk fails here (507), not with SIGBUS later
    except Exception as err:
        if claim is not None:
            with contextlib.suppress(OSError):
                _delete(claim.path)
            claim.release()
            _release_table_dir(spec, root)
        if isinstance(err, BackendError | TableExists | SchemaError | InsufficientStorage):
            raise
        raise BackendError(
            f"cannot allocate {b.kind} storage for table {spec.name!r}: {err}", table=spec.name
        ) from err
    if exists == "replace":
        sweep(spec, root)
    return backend
