"""Checkpoints: a table's data and state in one folder, written atomically.

Layout of a checkpoint folder::

    <path>/
      metadata.json    format version, the table's spec, counts, TED flag
      state.pt         slot, sampler, writer and rate-limiter state (torch.save)
      storage/         the written rows [0, hi) as a memmapped TensorDict
                       (or TorchRL's flat TED layout when ted2flat is on)

The folder is written next to ``path`` under a temporary name and renamed
into place; an existing checkpoint is first renamed aside and deleted only
once the new one is in place. A crash at any point leaves either the old or
the new checkpoint readable: :func:`restore` falls back to the aside copy when
``path`` itself is missing.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict

from .backends import allocate, primary_location, sweep
from .errors import CheckpointError, TDReplayError
from .spec import TableSpec
from .tensordicts import leaves, nest
from .writers import RoundRobinWriter

if TYPE_CHECKING:
    from .table import Table

FORMAT_VERSION = 1
_ASIDE = ".old-"
_TMP = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush every file and folder under ``path`` to disk.

    The rename only makes the new checkpoint visible atomically; its files
    must be on disk before the old checkpoint is deleted, or a power loss
    can leave neither.
    """
    for folder, _, files in os.walk(path, topdown=False):
        for name in files:
            _fsync_dir(Path(folder) / name)  # an fsync on a read-only descriptor
        _fsync_dir(Path(folder))


_PATH_LOCKS: dict[Path, threading.Lock] = {}
_PATH_LOCKS_GUARD = threading.Lock()


def checkpoint(table: Table, path: Path, *, ted2flat: bool | None = None) -> Path:
    """Write ``table`` to ``path`` (see the module docstring). Returns ``path``.

    Checkpoints to one path are serialized within the process; once one is in
    place, the debris of earlier interrupted ones (``<path>.tmp-*``,
    ``<path>.old-*``) is deleted, so crashes do not pile up copies on disk.
    """
    path = path.absolute()
    with _PATH_LOCKS_GUARD:
        lock = _PATH_LOCKS.setdefault(path, threading.Lock())
    with lock:
        _write(table, path, ted2flat=ted2flat)
        for stale in path.parent.iterdir():
            if stale.name.startswith((f"{path.name}{_TMP}", f"{path.name}{_ASIDE}")):
                shutil.rmtree(stale, ignore_errors=True)
    return path


def _write(table: Table, path: Path, *, ted2flat: bool | None) -> Path:
    # The swap would move the live table's files aside and delete them. A table
    # restored beside another lives at a sibling of its primary location, which
    # is deleted once no table holds it: neither may hold a checkpoint.
    own = [primary_location(table.spec, table.root)]
    if table.spec.backend.kind in ("memmap", "h5") and table.backend.location:
        own.append(Path(table.backend.location))
    for location in own:
        if location is not None and _overlap(location, path):
            raise CheckpointError(
                f"table {table.name!r}: cannot checkpoint to {path}, it holds the table's own data "
                f"({location})",
                table=table.name,
            )
    if ted2flat is None:
        ted2flat = table.spec.checkpoint.ted2flat
    writer = table.writer
    if ted2flat and not isinstance(writer, RoundRobinWriter):
        raise CheckpointError(
            f"table {table.name!r}: ted2flat needs the round_robin writer", table=table.name
        )
    path = path.absolute()
    tmp = path.parent / f"{path.name}{_TMP}{uuid.uuid4().hex[:8]}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
        # Hold inserts and samples off while data and state are captured together.
        with table._cond, table._data_lock.read():
            hi = table.slots.hi
            state = table.state_dict()
            meta: dict[str, Any] = {
                "format_version": FORMAT_VERSION,
                "created_at": time.time(),
                "spec": table.spec.model_dump(mode="json"),
                "hi": hi,
                "size": table.slots.n_live,
                "ted2flat": bool(ted2flat),
            }
            data = nest(table.backend.read_range(0, hi), hi) if hi else None
            if data is not None:
                if ted2flat:
                    assert isinstance(writer, RoundRobinWriter)
                    # A full ring with its cursor at 0 is in order already: TorchRL's
                    # roll breaks on a shift of 0, so it is saved as not full.
                    full = hi == table.capacity and writer.cursor != 0
                    _save_flat(data, tmp / "storage", cursor=writer.cursor, full=full)
                else:
                    data.memmap(tmp / "storage", num_threads=0)
        torch.save(state, tmp / "state.pt")
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2))
        _fsync_tree(tmp)
        aside = None
        if path.exists():
            aside = path.parent / f"{path.name}{_ASIDE}{uuid.uuid4().hex[:8]}"
            os.rename(path, aside)
        os.rename(tmp, path)
        _fsync_dir(path.parent)
        if aside is not None:
            shutil.rmtree(aside, ignore_errors=True)
        return path
    except TDReplayError:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    except Exception as err:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"table {table.name!r}: checkpoint to {path} failed: {err}", table=table.name
        ) from err


def _save_flat(data: TensorDict, path: Path, *, cursor: int, full: bool) -> None:
    from torchrl.data.replay_buffers.utils import TED2Flat

    hook = TED2Flat()
    hook.shift = cursor
    hook.is_full = full
    hook(data, path)


def _load_flat(path: Path, like: TensorDict) -> TensorDict:
    from torchrl.data.replay_buffers.utils import Flat2TED

    flat = TensorDict.load_memmap(path)
    # Root done flags are not stored flat; they come back False, as a collector emits them.
    out = Flat2TED()(flat, like.clone().zero_())
    if not flat.get_non_tensor("is_full"):
        # Flat2TED skips the last row's next entries when the storage is not full
        # (TorchRL's last row is unwritten there); ours is written, and TED2Flat
        # stored its next entries last, as the final step closes a trajectory.
        nxt = out.get("next")
        for key in nxt.keys(True, True):
            value = flat.get(key, None)
            if value is not None and value.shape[0] > out.shape[0]:
                nxt.get(key)[-1] = value[-1]
    return out


def find(path: Path) -> Path:
    """The readable checkpoint for ``path``: itself, or the copy set aside by an interrupted swap."""
    if (path / "metadata.json").exists():
        return path
    asides = sorted(
        path.parent.glob(f"{path.name}{_ASIDE}*"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for aside in asides:
        if (aside / "metadata.json").exists():
            return aside
    raise CheckpointError(f"no checkpoint at {path}")


def read_metadata(path: Path) -> dict[str, Any]:
    try:
        return json.loads((find(path) / "metadata.json").read_text())
    except CheckpointError:
        raise
    except Exception as err:
        raise CheckpointError(f"unreadable checkpoint metadata at {path}: {err}") from err


def _check_sizes(folder: Path) -> None:
    """Raise unless every memmapped leaf under ``folder`` has the size its ``meta.json`` gives.

    ``TensorDict.load_memmap`` maps a truncated file as it is, growing it with
    zeros to the size it expects: the rows would come back as zeros, and the
    checkpoint itself would change.
    """
    for meta in sorted(folder.rglob("meta.json")):
        for key, leaf in json.loads(meta.read_text()).items():
            if not isinstance(leaf, dict) or "dtype" not in leaf or leaf.get("is_nested"):
                continue  # a sub-TensorDict or a non-tensor entry
            dtype = getattr(torch, str(leaf["dtype"]).removeprefix("torch."))
            expected = math.prod(leaf["shape"]) * dtype.itemsize
            file = meta.parent / f"{key}.memmap"
            got = file.stat().st_size if file.is_file() else None
            if got != expected:
                what = "is missing" if got is None else f"holds {got} bytes"
                raise CheckpointError(
                    f"{file} {what}, expected {expected} bytes (shape {leaf['shape']}, "
                    f"{leaf['dtype']}): the checkpoint is truncated or damaged"
                )


def _overlap(a: Path, b: Path) -> bool:
    a, b = a.absolute(), b.absolute()
    return a == b or a in b.parents or b in a.parents


def restore(
    cls: type[Table], path: Path, root: str | Path | None, *, seed: int | None = None
) -> Table:
    """Rebuild a table from the checkpoint at ``path`` (see :meth:`Table.restore`).

    The table is allocated with ``replace=False``: beside whatever exists at its
    location, never over it. Data and state are loaded into it; if that fails it
    is destroyed (its own, fresh location only) and the error raised.
    """
    src = find(path.absolute())
    meta = read_metadata(src)
    if meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{src}: checkpoint format {meta.get('format_version')} not supported"
        )
    spec = TableSpec.parse(meta["spec"], source=str(src / "metadata.json"))
    root = Path(root) if root is not None else src.parent
    location = primary_location(spec, root)
    if location is not None and _overlap(location, src):
        # Allocating there would wipe (memmap) or write into the checkpoint being read.
        raise CheckpointError(
            f"cannot restore {src} under root {root}: the table's data would go to {location}, "
            "inside the checkpoint; pass another root",
            table=spec.name,
        )
    try:
        hi = int(meta["hi"])
        if hi:
            _check_sizes(src / "storage")
    except TDReplayError:
        raise
    except Exception as err:
        raise CheckpointError(f"cannot restore {src}: {err}") from err
    # Nothing that exists is deleted or overwritten until the table is whole: a
    # table being served may live at the default location (see backends).
    table = cls(spec, allocate(spec, root, replace=False), root=root, seed=seed)
    try:
        if hi:
            like = nest(table.backend.empty(hi), hi)
            if meta.get("ted2flat"):
                data = _load_flat(src / "storage", like)
            else:
                data = TensorDict.load_memmap(src / "storage")
            got = leaves(data)
            table.backend.write(
                slice(0, hi), {k: torch.as_tensor(got[k]).contiguous() for k in table.backend.keys}
            )
        state = torch.load(src / "state.pt", weights_only=False)
        table.load_state_dict(state)
    except Exception as err:
        table.destroy()
        if isinstance(err, TDReplayError):
            raise
        raise CheckpointError(f"cannot restore {src}: {err}") from err
    sweep(spec, root)
    return table
