"""What a crash in the middle of a checkpoint leaves in a checkpoints folder, and its cleanup.

:func:`~tdreplay.storage.checkpoint.checkpoint` writes ``<name>.tmp-<hex>``
beside ``<name>``, moves the current ``<name>`` aside to ``<name>.old-<hex>``,
renames the new copy into place and deletes the aside one. A process killed
on the way leaves, depending on when:

* a ``<name>.tmp-<hex>``, whole or half written: never the checkpoint of
  record, it is deleted;
* a ``<name>.old-<hex>`` beside a complete ``<name>`` (killed before or while
  deleting it): deleted;
* a ``<name>.old-<hex>`` and no ``<name>`` (killed between the two renames):
  that aside copy is the last good checkpoint, and is renamed back to
  ``<name>``; the newest complete one wins if there are several, the rest are
  deleted.

The same goes for every folder under it that is no checkpoint (a client's checkpoint
may lie deeper, ``checkpoints/<folder>/<name>``).

A checkpoint is complete when its ``metadata.json`` exists: it is written
last, before the folder is flushed and renamed into place. :func:`clean_checkpoints`
must run while nothing checkpoints into the folder (on start, under the root
lock of :mod:`tdreplay.storage.rootlock`).

    >>> import tempfile
    >>> from pathlib import Path
    >>> folder = Path(tempfile.mkdtemp())
    >>> (folder / "t.old-0a1b2c3d").mkdir(); (folder / "t.old-0a1b2c3d" / "metadata.json").touch()
    >>> (folder / "t.tmp-99aa77bb").mkdir()
    >>> for action in clean_checkpoints(folder): print(action)
    deleted t.tmp-99aa77bb (an unfinished checkpoint)
    renamed t.old-0a1b2c3d back to t (the last complete checkpoint of t)
    >>> sorted(p.name for p in folder.iterdir())
    ['t']
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from pathlib import Path

from .checkpoint.folder import ASIDE, METADATA, TMP

log = logging.getLogger("tdreplay.storage")

_DEBRIS = re.compile(
    rf"^(?P<name>.+?)(?P<kind>{re.escape(TMP)}|{re.escape(ASIDE)})(?P<tag>[0-9a-f]+)$"
)


#: what a folder that stood where a checkpoint is restored from its aside copy is renamed to
INCOMPLETE = ".incomplete-"


def is_reserved(name: str) -> bool:
    """Whether ``name`` is one the server gives checkpoint debris or set-aside folders (never a client's)."""
    return is_debris(name) or INCOMPLETE in name


def is_debris(name: str) -> bool:
    """Whether a checkpoints folder entry named ``name`` is debris (``<x>.tmp-<hex>``, ``<x>.old-<hex>``)."""
    return _DEBRIS.match(name) is not None


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds a complete checkpoint (its ``metadata.json`` exists)."""
    return (path / METADATA).is_file()


def clean_checkpoints(folder: str | Path) -> list[str]:
    """Delete (or put back) what interrupted checkpoints left in ``folder``; see the module docstring.

    Every action is logged at warning level.

    Args:
        folder: a checkpoints folder (``<root>/checkpoints``); missing is fine.

    Returns:
        What was done, one line per entry deleted or renamed.

    Raises:
        OSError: an entry could not be deleted or renamed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    done: list[str] = []
    _clean(folder, folder, done)
    for line in done:
        log.warning("checkpoints folder %s: %s", folder, line)
    return done


def _clean(folder: Path, top: Path, done: list[str]) -> None:
    """:func:`clean_checkpoints` in ``folder`` (inside ``top``), then in each folder under it
    that is no checkpoint: a client's checkpoint may lie deeper
    (``checkpoints/<folder>/<name>``) and leave its debris there."""

    def delete(path: Path, why: str) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        done.append(f"deleted {path.relative_to(top)} ({why})")

    asides: dict[str, list[Path]] = {}
    for entry in sorted(folder.iterdir()):
        m = _DEBRIS.match(entry.name)
        if m is None:
            continue
        if m["kind"] == TMP:
            delete(entry, "an unfinished checkpoint")
        else:
            asides.setdefault(m["name"], []).append(entry)
    for name, olds in sorted(asides.items()):
        target = folder / name
        if is_complete(target):
            for old in olds:
                delete(old, f"replaced by the complete checkpoint {name}")
            continue
        complete = [p for p in olds if p.is_dir() and not p.is_symlink() and is_complete(p)]
        complete.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        if complete:
            if os.path.lexists(target):
                # Not a complete checkpoint - but maybe not ours either: set aside, never deleted.
                aside = folder / f"{name}{INCOMPLETE}{uuid.uuid4().hex[:8]}"
                os.rename(target, aside)
                done.append(
                    f"moved {target.relative_to(top)} aside to {aside.name} (not a complete checkpoint)"
                )
            os.rename(complete[0], target)
            done.append(
                f"renamed {complete[0].relative_to(top)} back to {name} (the last complete "
                f"checkpoint of {name})"
            )
        for old in olds:
            if not complete or old != complete[0]:
                delete(old, "an incomplete or older copy set aside")
    for entry in sorted(folder.iterdir()):
        if (
            entry.is_dir()
            and not entry.is_symlink()
            and not is_complete(entry)
            and not is_reserved(entry.name)
        ):
            _clean(entry, top, done)
