"""A checkpoint folder: its names, where the readable one is, and its metadata.

A checkpoint of record is ``<path>``; while one is written, the new copy is
``<path>.tmp-<hex>`` and the old one is moved aside to ``<path>.old-<hex>``
(see :mod:`~tdreplay.storage.checkpoint.write`). :func:`find` falls back to
an aside copy when ``<path>`` itself is missing (a crash between the two
renames).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any

from ..errors import CheckpointError, InvalidCheckpoint
from .reader import read_json

#: the format :func:`~tdreplay.storage.checkpoint.checkpoint` writes
FORMAT_VERSION = 3
#: formats :func:`~tdreplay.storage.checkpoint.restore` reads (1: state in ``state.pt``,
#: read with ``weights_only=True``; 1 and 2: every written row, dead ones too; 3: with
#: ``live_only``, the live ones only)
READABLE_FORMATS = (1, 2, 3)
#: the state file of a format 1 checkpoint (written with ``torch.save``)
V1_STATE = "state.pt"
#: the file whose presence makes a checkpoint folder complete (written last)
METADATA = "metadata.json"
#: ``<path><ASIDE><hex>``: the previous checkpoint, moved aside while a new one goes in
ASIDE = ".old-"
#: ``<path><TMP><hex>``: a checkpoint being written
TMP = ".tmp-"


_PATH_LOCKS: dict[str, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def path_lock(path: Path) -> threading.Lock:
    """The lock of the checkpoint at ``path`` in this process: held while one is written
    there (and earlier ones' debris deleted), and while a restore reads one, so that it
    never reads the metadata and rows of one checkpoint and the state of the next."""
    key = os.path.realpath(path)
    with _PATH_LOCKS_GUARD:
        return _PATH_LOCKS.setdefault(key, threading.Lock())


def is_checkpoint(path: Path) -> bool:
    """Whether the folder ``path`` is a checkpoint (its ``metadata.json``, written last, exists)."""
    return (path / METADATA).exists()


def find(path: Path) -> Path:
    """The readable checkpoint for ``path``: itself, or the copy set aside by an interrupted swap."""
    if is_checkpoint(path):
        return path
    # by prefix, not glob: a checkpoint named '[ab]' or '*' found 'a.old-<hex>'; and an aside
    # a checkpoint deletes meanwhile (its new copy in place) is passed over
    prefix, asides = f"{path.name}{ASIDE}", []
    with contextlib.suppress(FileNotFoundError, NotADirectoryError), os.scandir(path.parent) as it:
        for entry in it:
            if entry.name.startswith(prefix):
                with contextlib.suppress(FileNotFoundError):
                    asides.append((entry.stat().st_mtime, Path(entry.path)))
    for _, aside in sorted(asides, reverse=True):
        if is_checkpoint(aside):
            return aside
    raise CheckpointError(f"no checkpoint at {path}")


def read_metadata(path: Path) -> dict[str, Any]:
    """The parsed ``metadata.json`` of the checkpoint at ``path`` (see :func:`find`).

    Raises:
        CheckpointError: there is no checkpoint at ``path``.
        InvalidCheckpoint: the file is not a JSON object (the message names it).
    """
    src = find(path)
    try:
        meta = read_json(src, src / METADATA)
    except InvalidCheckpoint as err:
        raise InvalidCheckpoint(f"unreadable checkpoint metadata at {path}: {err}") from None
    if not isinstance(meta, dict):
        raise InvalidCheckpoint(
            f"unreadable checkpoint metadata at {path}: metadata.json holds a "
            f"{type(meta).__name__}, not a JSON object"
        )
    return meta


def held_table(path: Path) -> str | None:
    """The name of the table the checkpoint at ``path`` holds (``None``: no readable checkpoint)."""
    try:
        spec = read_metadata(path).get("spec")
    except CheckpointError:
        return None
    name = spec.get("name") if isinstance(spec, dict) else None
    return name if isinstance(name, str) else None


def holds_data(path: Path) -> bool:
    """Whether something is at ``path`` that no checkpoint may replace: anything but a
    checkpoint or an empty folder (a link, a file, a folder of someone's files)."""
    if not os.path.lexists(path):
        return False
    if path.is_symlink() or not path.is_dir():
        return True
    return not is_checkpoint(path) and any(path.iterdir())


def holds_other(path: Path, name: str) -> bool:
    """Whether something is at ``path`` that a checkpoint of table ``name`` must not replace:
    anything but a (complete) checkpoint of that table, a link included."""
    if not os.path.lexists(path):
        return False
    if path.is_symlink() or not is_checkpoint(path):
        return True
    return held_table(path) != name


def overlaps(a: Path, b: Path) -> bool:
    """Whether ``a`` and ``b`` are the same path or one lies inside the other."""
    a, b = a.absolute(), b.absolute()
    return a == b or a in b.parents or b in a.parents
