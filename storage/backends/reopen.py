"""What a process left under a data root: the tables it can reopen, and their rows.

A memmap table's rows and state survive its process (see
:mod:`tdreplay.storage.durable`); :func:`stored_specs` finds such tables and
:func:`reopen` maps their rows again. Nothing here is unpickled.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tensordict import TensorDict

from ..columnfiles import map_file
from ..durable import DurableState, spec_matches
from ..errors import BackendError, InsufficientStorage, TableExists, TDReplayError
from ..spec import MemmapBackendSpec, TableSpec
from .base import preallocated
from .locations import (
    TABLES_DIR,
    claim_location,
    marker_of,
    own_table_dir,
    table_dir,
    unheld_data,
)
from .tensor import TensorBackend

log = logging.getLogger("tdreplay.storage")


def stored_specs(root: str | Path, failed: dict[str, str] | None = None) -> list[TableSpec]:
    """The specs of the tables a process left reopenable under ``<root>/tables/`` (memmap).

    Only folders carrying their own marker are looked at; a stored spec goes
    through the same validation as any other (:meth:`TableSpec.parse`). A
    table whose stored spec is unreadable or invalid is left out, and why is
    put in ``failed`` (its data is kept as it is).
    """
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


def reopen(spec: TableSpec, root: str | Path, *, preallocate: bool = False) -> TensorBackend | None:
    """Map the rows a memmap table of ``spec`` left in its folder, to reopen it (``None``: nothing to reopen).

    Of the table's locations holding a complete state (see
    :mod:`tdreplay.storage.durable`), the newest is taken: an older one is dead
    data of a restore that was under way (:func:`~.locations.sweep` deletes it
    once the table is open). Row files are mapped with the dtype and shape the
    spec gives, their size checked; nothing is unpickled. The rows written are on disk
    already; more are reserved as they come (:mod:`~tdreplay.storage.extents`), or, with ``preallocate``
    (or the spec's), the whole capacity now if the disk has room (else a warning: a table
    that holds acknowledged rows is served whatever the disk has left).

    Raises:
        TableExists: the folder is not the table's own, or its data was written
            under another schema (it is left as it is).
        BackendError: a row file is missing or has the wrong size.
    """
    if not isinstance(spec.backend, MemmapBackendSpec):
        return None
    folder = table_dir(spec, root)
    if not folder.exists():
        return None
    own_table_dir(spec, root)
    newest = DurableState.newest(unheld_data(spec, root))
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
    claim = claim_location(location, replace=True)
    if claim.path != location:  # taken meanwhile by a table of this process
        claim.release()
        return None
    try:
        td = TensorDict(batch_size=[spec.capacity])
        for key, (shape, dtype) in spec.torch_schema().items():
            file = location.joinpath(*key[:-1], f"{key[-1]}.memmap")  # from_schema's layout
            td.set(key, map_file(file, dtype, (spec.capacity, *shape)))
        backend = TensorBackend(spec, td, claim)
    except BackendError as err:
        claim.release()
        raise BackendError(f"table {spec.name!r}: {err}", table=spec.name) from None
    except BaseException:
        claim.release()
        raise
    if preallocated(spec, preallocate) and backend.extents is not None:
        try:
            backend.extents.reserve(spec.capacity, exact=True)
        except InsufficientStorage as err:
            log.warning("table %r reopened without its whole capacity reserved: %s", spec.name, err)
    return backend
