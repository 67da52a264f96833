"""Where file backends (memmap, h5) keep their data, and who holds it.

A table's data lives in its own folder, ``<root>/tables/<table>/``, which
carries a marker file (:data:`MARKER`, ``.tdreplay-table.json``) naming the
table; a folder without it is never used, written into or deleted
(:class:`~tdreplay.storage.TableExists`). A schema cannot name a path. A
memmap or h5 table's *location* is ``<root>/tables/<table>/storage`` or
``.../storage.h5``.

While a backend is open at a location, it holds a :class:`LocationClaim` on
it, and no allocation of this process deletes or reuses it: a second table of
the same name (a restore beside the table it is to replace) goes to a fresh
sibling, ``storage.<8 hex>`` or ``storage.<8 hex>.h5``. Data no open backend
holds is never read again (tables are only ever created empty or restored
from a checkpoint), so once a table is in place, :func:`sweep` deletes the
dead location and dead siblings of its name; nothing else is touched. A data
root belongs to one process: the tables of another process are not known here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
import uuid
from pathlib import Path

from ..errors import TableExists
from ..spec import H5BackendSpec, MemmapBackendSpec, TableSpec

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
    if isinstance(b, MemmapBackendSpec):
        return table_dir(spec, root) / "storage"
    if isinstance(b, H5BackendSpec):
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


def release_table_dir(spec: TableSpec, root: str | Path) -> None:
    """:func:`release_folder` of the table's own folder."""
    release_folder(table_dir(spec, root), spec.name)


def release_folder(folder: Path, name: str) -> None:
    """Remove a table's folder once it holds nothing but its marker (it is recreated on demand)."""
    with contextlib.suppress(OSError):
        if marker_of(folder) == name and {p.name for p in folder.iterdir()} == {MARKER}:
            (folder / MARKER).unlink()
            folder.rmdir()


# ---------------------------------------------------------------- claims
_HELD: dict[Path, LocationClaim] = {}
_HELD_GUARD = threading.Lock()


def _key(path: Path) -> Path:
    return Path(os.path.abspath(path))


class LocationClaim:
    """A file location (a memmap folder, an h5 file) held by one open backend.

    Made by :func:`claim_location`; while it is held, no allocation of this
    process deletes or reuses the location (see the module docstring).
    """

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


def _locations(primary: Path) -> list[Path]:
    """``primary`` and the fresh siblings :func:`claim_location` made of it, as they are on disk."""
    if not primary.parent.is_dir():
        return []
    siblings = re.compile(rf"{re.escape(primary.stem)}\.[0-9a-f]{{8}}{re.escape(primary.suffix)}")
    return [
        p
        for p in sorted(primary.parent.iterdir())
        if p.name == primary.name or siblings.fullmatch(p.name)
    ]


def claim_location(primary: Path, *, replace: bool) -> LocationClaim:
    """Hold ``primary``, or a fresh sibling when it is held (or, unless ``replace``, exists)."""
    with _HELD_GUARD:
        path = primary
        taken = _key(primary) in _HELD or (not replace and os.path.lexists(primary))
        while taken:
            path = primary.with_name(_sibling(primary, uuid.uuid4().hex[:8]))
            taken = os.path.lexists(path)
        claim = LocationClaim(path)
        _HELD[_key(path)] = claim
        return claim


def unheld_data(spec: TableSpec, root: str | Path) -> list[Path]:
    """Data of table ``spec.name`` in its folder (location, fresh siblings) no open backend holds."""
    primary = primary_location(spec, root)
    if primary is None:
        return []
    with _HELD_GUARD:
        return [p for p in _locations(primary) if _key(p) not in _HELD]


def delete_location(path: Path) -> None:
    """Delete a file or folder tree; raises ``OSError`` when it cannot."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def sweep(spec: TableSpec, root: str | Path) -> list[Path]:
    """Delete the dead data of table ``spec.name``: its location and fresh siblings no open backend holds.

    Called once a table is in place (by :func:`~tdreplay.storage.backends.allocate`,
    and by a restore once it succeeded). Only names of the form the allocator
    makes are touched (see the module docstring). Returns what was deleted.
    """
    primary = primary_location(spec, root)
    if primary is None:
        return []
    deleted = []
    with _HELD_GUARD:  # held while deleting: nothing can claim a path half deleted
        for path in _locations(primary):
            if _key(path) not in _HELD:
                with contextlib.suppress(OSError):
                    delete_location(path)
                    deleted.append(path)
    return deleted
