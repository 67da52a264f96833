"""Where a client's paths may lead: the data root's areas, and what may be replaced there.

A path a client names (checkpoint, restore, export) is relative to the data
root and stays in its server-owned areas: a checkpoint or restore path inside
``checkpoints/``, an export path inside ``exports/``; the tables' own data
(``tables/``) is out of reach. ``../`` escapes, absolute paths and symlinks
out of the root are refused (400). Nothing that exists is overwritten unless
it is ours: a checkpoint replaces only a checkpoint of the same table, an
export never replaces a file (409).
"""

from __future__ import annotations

import os
from pathlib import Path

from tdreplay.codec import protocol
from tdreplay.codec.params import MAX_PATH
from tdreplay.codec.text import is_hidden
from tdreplay.storage import (
    InvalidRequest,
    PathExists,
    checkpoint_holds_other,
    is_checkpoint,
    is_reserved_checkpoint_name,
)

#: the data root's area for exports written on the server (``exports/<file>``)
EXPORTS = "exports"
#: folder under the data root for exports streamed back (deleted once sent)
EXPORT_SCRATCH = ".exports"
#: folder under the data root for tables' checkpoints on their way out or in (``dump`` /
#: ``load``: deleted once sent or restored)
TRANSFER_SCRATCH = ".transfers"
#: the scratch folders: the server's own, emptied at start (what a crash left)
SCRATCH = (EXPORT_SCRATCH, TRANSFER_SCRATCH)


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


#: bytes of one name in a client's path at most (a file system's limit)
MAX_NAME = 255


def confine_area(root: Path, area: str, given: str, *, field: str = "path") -> Path:
    """The absolute path of ``given`` (relative to ``root``), refused unless strictly inside ``root/area``.

    The data root has server-owned areas: ``tables/`` (table data, never
    reachable by a client path), ``checkpoints/`` and ``exports/``. A
    checkpoint or restore path must lie in ``checkpoints/``, an export path in
    ``exports/`` (``"checkpoints/step-1000"``, ``"exports/run.parquet"``).

    Raises:
        InvalidRequest: see :func:`confine`; or the path is not inside ``area``.
    """
    target = confine(root, given, field=field)
    base = root.resolve() / area
    if base.is_symlink() or not _inside(target, Path(os.path.realpath(base))) or target == base:
        raise InvalidRequest(
            f"{field} {given!r} is not inside the data root's {area}/ folder; give a path "
            f"like '{area}/<name>'",
            field=field,
            expected=f"{area}/<name>",
            got=given,
        )
    return target


def confine(root: Path, given: str, *, field: str = "path") -> Path:
    """The absolute path of ``given`` (relative to ``root``), refused unless strictly inside ``root``.

    Symlinks are resolved before the check, so a link pointing out of the root
    does not get through. Every existing folder on the way must be a folder, and
    none may be a checkpoint (a path inside a checkpoint would corrupt it).

    Raises:
        InvalidRequest: ``given`` is empty, too long, holds a NUL byte or another control
            or format character (a newline or an escape would forge lines of the server log
            and of every listing of the folder, a bidi override reorder them), resolves to the root itself or outside it, or
            runs through a file or a checkpoint.
    """
    try:
        encoded = given.encode()
    except UnicodeEncodeError:  # lone surrogates: no file system takes them
        encoded = b""
    if not encoded or b"\x00" in encoded or len(encoded) > MAX_PATH:
        raise InvalidRequest(f"{field} {given[:80]!r} is not a usable path", field=field)
    if any(is_hidden(c) for c in given):
        raise InvalidRequest(
            f"{field} {given[:80]!r} holds a control character (a newline, a tab, an escape, "
            "a bidi override or another invisible format character); "
            "give a path of printable characters",
            field=field,
            got=given[:80],
        )
    if Path(given).is_absolute():
        raise InvalidRequest(
            f"{field} {given[:80]!r} is absolute; give a path relative to the data root",
            field=field,
            expected="a path relative to the data root",
            got=given[:80],
        )
    if any(len(part.encode()) > MAX_NAME for part in Path(given).parts):
        raise InvalidRequest(f"{field}: a name in {given[:80]!r} is too long", field=field)
    base = root.resolve()
    target = Path(os.path.realpath(base / given))  # an absolute `given` replaces base here
    if target == base or not _inside(target, base):
        raise InvalidRequest(
            f"{field} {given!r} is outside the data root; give a path relative to it",
            field=field,
            expected="a path inside the data root",
            got=given,
        )
    for parent in target.parents:
        if parent == base or base not in parent.parents:
            break
        if parent.exists() and not parent.is_dir():
            raise InvalidRequest(f"{field} {given!r} runs through a file", field=field, got=given)
        if is_checkpoint(parent):
            raise InvalidRequest(
                f"{field} {given!r} lies inside a checkpoint", field=field, got=given
            )
    return target


def relative(root: Path, path: Path) -> str:
    """``path`` as the client should see it: relative to the data root."""
    return str(path.resolve().relative_to(root.resolve()))


def shown_location(root: Path, location: str | None) -> str | None:
    """A table's ``location`` as an answer gives it: its files' place relative to the data
    root (``tables/t/storage``), never the root's place on the server; a location that is
    no path (a Redis connection's name, ``None``) as it is.

        >>> shown_location(Path("/srv/td"), "/srv/td/tables/t/storage"), shown_location(Path("/srv/td"), "default")
        ('tables/t/storage', 'default')
    """
    if location is None or not os.path.isabs(location):
        return location
    try:
        return relative(root, Path(location))
    except ValueError:  # never a table's: its files live under the root
        return None


def checkpoint_target(root: Path, name: str, given: str | None) -> Path:
    """Where a checkpoint of table ``name`` goes: ``given`` (inside ``checkpoints/``) or
    ``checkpoints/<name>``.

    Raises:
        InvalidRequest: see :func:`confine_area`; or the path uses a name kept for
            interrupted checkpoints, or is another table's default checkpoint.
        PathExists: something that is not a checkpoint of this table is there.
    """
    target = (
        root.resolve() / protocol.CHECKPOINTS / name
        if given is None
        else confine_area(root, protocol.CHECKPOINTS, given)
    )
    parts = target.relative_to((root / protocol.CHECKPOINTS).resolve()).parts
    if any(is_reserved_checkpoint_name(part) for part in parts):
        raise InvalidRequest(
            f"path {given!r}: names like '<x>.tmp-<hex>' / '<x>.old-<hex>' are kept for "
            "interrupted checkpoints",
            table=name,
            field="path",
            got=given,
        )
    if len(parts) == 1 and parts[0] != name:
        # checkpoints/<x> is table x's default checkpoint (restored on start as table x)
        raise InvalidRequest(
            f"path {given!r}: checkpoints/{parts[0]} is the default checkpoint of table "
            f"{parts[0]!r}; "
            f"give checkpoints/{name} or a deeper path (checkpoints/<folder>/<name>)",
            table=name,
            field="path",
            got=given,
        )
    if checkpoint_holds_other(target, name):
        raise PathExists(
            f"path {relative(root, target)!r} exists and is not a checkpoint of "
            f"table {name!r}; it is left as it is (choose another path)",
            table=name,
            field="path",
            got=given,
        )
    return target


def export_target(root: Path, name: str, given: str) -> Path:
    """Where an export of table ``name`` is written: ``given``, a new file inside ``exports/``.

    Raises:
        InvalidRequest: see :func:`confine_area`.
        PathExists: a file is there already (an export never replaces one).
    """
    target = confine_area(root, EXPORTS, given)
    if os.path.lexists(target):
        raise PathExists(
            f"path {given!r} exists; an export never replaces a file (choose another path)",
            table=name,
            field="path",
            got=given,
        )
    return target
