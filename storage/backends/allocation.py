"""Allocating a table's storage: a fresh backend of the kind its spec names."""

from __future__ import annotations

import contextlib
import math
import mmap
import os
from pathlib import Path
from typing import Literal

import torch
from tensordict import TensorDict

from ..diskspace import on_full_disk
from ..errors import BackendError, InsufficientStorage, SchemaError, TableExists
from ..redis_conn import Connections, resolve
from ..spec import (
    H5BackendSpec,
    MemmapBackendSpec,
    MemoryBackendSpec,
    NestedKey,
    RedisBackendSpec,
    SharedBackendSpec,
    TableSpec,
)
from .base import Backend, preallocated
from .h5 import H5Backend
from .locations import (
    LocationClaim,
    claim_location,
    delete_location,
    own_table_dir,
    primary_location,
    release_table_dir,
    sweep,
    unheld_data,
)
from .redis import RedisBackend
from .redis_records import sweep_keys
from .shared import SHARED_MEMORY, shared_fields
from .tensor import TensorBackend

Exists = Literal["error", "replace", "beside"]


def lazy_zeros(shape: list[int], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor whose memory is committed as it is written, not at once.

    What ``TensorDict.from_schema`` gives a memory table, ``torch.zeros``, writes every
    byte of the capacity at create (the whole table in RAM before a row); a private
    anonymous mapping is the kernel's zero pages until a row lands there.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # kept alive by the tensor
    return torch.frombuffer(pages, dtype=torch.uint8).view(dtype).view(shape)


def lazy_fields(
    schema: dict[NestedKey, tuple[list[int], torch.dtype]], capacity: list[int]
) -> dict[NestedKey, torch.Tensor]:
    """:func:`lazy_zeros` for every field of ``schema``: ``from_schema(storage=None)``'s tensors."""
    return {k: lazy_zeros([*capacity, *shape], dtype) for k, (shape, dtype) in schema.items()}


def allocate(
    spec: TableSpec,
    root: str | Path,
    *,
    exists: Exists = "replace",
    redis: Connections | None = None,
    preallocate: bool = False,
) -> Backend:
    """Allocate the storage of ``spec`` with ``TensorDict.from_schema``.

    File backends (memmap, h5) keep their data in the table's own folder,
    ``<root>/tables/<name>/``, which carries a marker naming the table; a
    folder without it is never used, written into or deleted. A location an
    open backend of this process holds is never deleted or reused either: the
    data goes to a fresh sibling instead (see :mod:`~.locations`). A redis table
    records its keys there while they exist; keys recorded by a process that did not
    delete them (killed) are deleted first (see :mod:`~.redis_records`).

    Args:
        spec: the table (validated: it names no path, only a Redis connection name).
        root: the data root.
        exists: what to do with data of this table left in its folder by an
            earlier table of the same name: ``"error"`` refuses
            (:class:`TableExists`), ``"replace"`` deletes it, ``"beside"``
            leaves it and allocates a fresh sibling (a restore, which must
            leave everything as it was should it fail).
        redis: the operator's Redis connections, by name (redis backend only).
        preallocate: reserve a memmap, h5 or shared table's whole capacity on disk (in
            ``/dev/shm``) now (as does the spec's ``backend.preallocate``); else it is
            reserved in extents as rows arrive (:mod:`~tdreplay.storage.extents`). A redis
            table's strings are then sized to the capacity in Redis now; else they grow as
            rows are written.

    Raises:
        TableExists: the table's folder is not its own, or (``exists="error"``)
            holds data of an earlier table of that name.
        SchemaError: the spec names a Redis connection that is not configured.
        InsufficientStorage: the disk (a shared table: ``/dev/shm``) has no room for what
            must be reserved now (a redis table: the Redis is out of memory, or a field is
            longer than its longest string).
        BackendError: the backend could not be allocated (Redis down, ...); what it had
            written is deleted.
    """
    b = spec.backend
    schema = spec.torch_schema()
    cap = [spec.capacity]
    primary = primary_location(spec, root)
    claim: LocationClaim | None = None
    if primary is not None:
        own_table_dir(spec, root)
        if exists == "error":
            left = unheld_data(spec, root)
            if left:
                raise TableExists(
                    f"table {spec.name!r}: {left[0]} holds data of an earlier table of that name; "
                    "restore it, or create the table with replace to delete it",
                    table=spec.name,
                    field="name",
                    got=str(left[0]),
                )
        claim = claim_location(primary, replace=exists != "beside")
    whole = preallocated(spec, preallocate)

    def undo() -> None:  # what was claimed and written goes
        if claim is not None:
            with contextlib.suppress(OSError):
                delete_location(claim.path)
            claim.release()
            release_table_dir(spec, root)

    def shm_full(err: Exception) -> InsufficientStorage:  # /dev/shm's inodes, say
        return SHARED_MEMORY.full(spec.name, "its segments", str(err))

    try:
        with on_full_disk(
            f"table {spec.name!r}: allocating its storage",
            root,
            table=spec.name,
            error=shm_full if isinstance(b, SharedBackendSpec) else None,
            cleanup=undo,
        ):
            if isinstance(b, MemoryBackendSpec):
                return TensorBackend(spec, TensorDict(lazy_fields(schema, cap), batch_size=cap))
            if isinstance(b, SharedBackendSpec):  # shared already: locked as share_memory_() does
                td = TensorDict(shared_fields(schema, cap), batch_size=cap).lock_()
                return TensorBackend(spec, td, preallocate=whole)
            if isinstance(b, RedisBackendSpec):
                conn = resolve(spec.name, b.connection, redis or {})
                prefix = b.prefix or f"tdreplay:{spec.name}"
                sweep_keys(root, redis or {}, spec.name)  # what a killed process left of it
                folder = own_table_dir(spec, root)  # where its keys are recorded
                return RedisBackend.allocate(
                    spec, conn, prefix=prefix, folder=folder, preallocate=whole
                )
            assert claim is not None
            path = claim.path
            if os.path.lexists(path):  # dead data (``replace``): a held location is never claimed
                delete_location(path)
            if isinstance(b, MemmapBackendSpec):
                td = TensorDict.from_schema(
                    schema, batch_size=cap, storage="memmap", prefix=str(path)
                )
                backend: Backend = TensorBackend(spec, td, claim, preallocate=whole)
            elif isinstance(b, H5BackendSpec):
                backend = H5Backend.allocate(spec, claim, preallocate=whole)
            else:  # pragma: no cover
                raise BackendError(f"unknown backend {b.kind!r}", table=spec.name)
    except (BackendError, TableExists, SchemaError, InsufficientStorage):
        raise
    except Exception as err:
        raise BackendError(
            f"cannot allocate {b.kind} storage for table {spec.name!r}: {err}", table=spec.name
        ) from err
    if exists == "replace":
        sweep(spec, root)
    return backend
