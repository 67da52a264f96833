"""Writing a checkpoint: one snapshot of a table, put in place atomically.

The folder is written next to ``path`` under a temporary name
(``<path>.tmp-<hex>``), flushed to disk, and renamed into place; an existing
checkpoint is first renamed aside (``<path>.old-<hex>``) and deleted only once
the new one is in place. A crash at any point leaves either the old or the
new checkpoint readable (:func:`~tdreplay.storage.checkpoint.folder.find`
falls back to the aside copy when ``path`` itself is missing).

Checkpoints do not stall the service: a checkpoint is one
:meth:`Table.snapshot <tdreplay.storage.Table.snapshot>` (under the table's locks
only its state is taken; the rows are copied afterwards, copy-on-write; see
:mod:`tdreplay.storage.table.snapshot`) written into the folder's row files
(:mod:`.sinks`); nothing here touches the table's locks. The copy and the final flush
run in a short-lived thread at nice :data:`BACKGROUND_NICE`, and give up the
GIL about once per large field and chunk (rows move as bytes with ``pwrite``;
small fields are written once): each time they take it back, a sampling thread
may have to wait. With TorchRL's flat layout the rows are assembled in memory
first, as ``TED2Flat`` needs them whole, and read back: rows it would not give back
bit for bit (trajectories interleaved in the table) are written in the plain layout
instead (``"ted2flat": false`` in the metadata). Measured with
``bench/checkpoint_bench.py`` (``bench/results/checkpoint.json``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import uuid
from collections.abc import Callable
from pathlib import Path, PosixPath
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from .. import statefile as SF
from ..backends import primary_location
from ..diskspace import fsync_path, on_full_disk
from ..errors import CheckpointError, InvalidCheckpoint, PathExists, TDReplayError
from ..last_checkpoint import Written
from ..slot_policy import RoundRobinPolicy
from ..spec import NestedKey
from ..tensordicts import leaves, nest, row_bytes
from .folder import (
    ASIDE,
    FORMAT_VERSION,
    METADATA,
    TMP,
    holds_data,
    holds_other,
    is_checkpoint,
    overlaps,
    path_lock,
    read_metadata,
)
from .reader import flat_layout_fits, load_flat
from .sinks import RowFiles, RowsInMemory

if TYPE_CHECKING:
    from ..consumers import Checkpointable as Table
    from ..table.snapshot import Snapshot

#: the nice value a checkpoint's copy and flush run at (a thread of their own)
BACKGROUND_NICE = 10

log = logging.getLogger("tdreplay.storage")


def _fsync_tree(path: Path) -> None:
    """Flush every file and folder under ``path`` to disk.

    The rename only makes the new checkpoint visible atomically; its files
    must be on disk before the old checkpoint is deleted, or a power loss
    can leave neither.
    """
    for folder, _, files in os.walk(path, topdown=False):
        for name in files:
            fsync_path(Path(folder) / name)  # an fsync on a read-only descriptor
        fsync_path(Path(folder))


class CheckpointPath(PosixPath):
    """The path of a checkpoint, a :class:`~pathlib.Path` that also says whether it was
    written (``skipped``: the table was unchanged since it wrote the checkpoint there)."""

    skipped: bool = False

    @classmethod
    def of(cls, path: Path, *, skipped: bool) -> CheckpointPath:
        out = cls(path)
        out.skipped = skipped
        return out


def up_to_date(table: Table, path: Path, ted2flat: bool) -> bool:
    """Whether the checkpoint ``table`` last wrote (``table.last_checkpoint``) is at ``path``,
    in that layout, nothing changed since: the table's change count is the one at its
    snapshot, and the folder a restore of ``path`` reads is the one written (its metadata's
    id, every file, each file's size)."""
    last = table.last_checkpoint
    if last is None or last.path != path or last.ted2flat != ted2flat:
        return False
    if table.changes != last.changes or table.closed:
        return False
    if not is_checkpoint(path):  # an aside copy is not the checkpoint
        return False
    try:
        same = read_metadata(path).get("checkpoint_id") == last.id
    except CheckpointError:
        return False
    return same and files_of(path) == last.files


def files_of(path: Path) -> dict[str, int]:
    """The files under ``path``, by relative path, with their sizes."""
    return {str(f.relative_to(path)): f.stat().st_size for f in path.rglob("*") if f.is_file()}


def checkpoint(
    table: Table, path: Path, *, ted2flat: bool | None = None, own_only: bool = False
) -> CheckpointPath:
    """Write ``table`` to ``path`` (see the module docstring). Returns ``path``.

    A table unchanged since it wrote the checkpoint at ``path`` (:func:`up_to_date`: its rows
    and state, the RNG and the rate limiter's counters included, and that checkpoint still
    the one there, whole) is not written again: ``path`` is returned with ``skipped`` set.

    Checkpoints to one path are serialized within the process; once one is in
    place, the debris of earlier interrupted ones (``<path>.tmp-*``,
    ``<path>.old-*``) is deleted, so crashes do not pile up copies on disk.

    Only a checkpoint, or an empty folder, is ever replaced: anything else at ``path`` (a
    file, a link, a folder of other files) is refused (:class:`PathExists`) and kept.
    With ``own_only``, only a checkpoint of this table is replaced: anything else at
    ``path`` is refused (:class:`PathExists`), checked under the path's lock, which
    every checkpoint to it holds until its swap, so one written there meanwhile by
    another table is seen.
    """
    path = path.absolute()
    with path_lock(path):
        if own_only and holds_other(path, table.name):
            raise PathExists(
                f"table {table.name!r}: {path.name!r} holds something else than a checkpoint "
                "of this table; it is left as it is (choose another path)",
                table=table.name,
                field="path",
                got=path.name,
            )
        if ted2flat is None:
            ted2flat = table.spec.checkpoint.ted2flat
        if up_to_date(table, path, ted2flat):
            log.info(
                "table %r: unchanged since its checkpoint at %s; not written again",
                table.name,
                path,
            )
            return CheckpointPath.of(path, skipped=True)
        write(table, path, ted2flat=ted2flat)
        for stale in path.parent.iterdir():
            if stale.name.startswith((f"{path.name}{TMP}", f"{path.name}{ASIDE}")):
                shutil.rmtree(stale, ignore_errors=True)
    return CheckpointPath.of(path, skipped=False)


def write(table: Table, path: Path, *, ted2flat: bool | None, _stall: bool = False) -> Path:
    """Write the checkpoint of ``table`` at ``path``, replacing any there (see the module docstring).

    Unlike :func:`checkpoint`, takes no path lock and leaves earlier debris.
    ``_stall`` copies the rows under the table's locks (the way before
    snapshots), kept only for ``bench/checkpoint_bench.py`` to compare against.
    """
    # The swap would move the live table's files aside and delete them. A table
    # restored beside another lives at a sibling of its primary location, which
    # is deleted once no table holds it: neither may hold a checkpoint.
    own = [primary_location(table.spec, table.root)]
    if table.spec.backend.kind in ("memmap", "h5") and table.backend.location:
        own.append(Path(table.backend.location))
    for location in own:
        if location is not None and overlaps(location, path):
            raise CheckpointError(
                f"table {table.name!r}: cannot checkpoint to {path}, it holds the table's own data "
                f"({location})",
                table=table.name,
            )
    if holds_data(path):  # the swap would move it aside and delete it
        raise PathExists(
            f"table {table.name!r}: {str(path)!r} holds something that is not a checkpoint; "
            "it is left as it is (choose another path, or delete it)",
            table=table.name,
            field="path",
            got=path.name,
        )
    if ted2flat is None:
        ted2flat = table.spec.checkpoint.ted2flat
    writer = table.writer
    if ted2flat and not isinstance(writer, RoundRobinPolicy):
        raise CheckpointError(
            f"table {table.name!r}: ted2flat needs the round_robin writer", table=table.name
        )
    path = path.absolute()
    tmp = path.parent / f"{path.name}{TMP}{uuid.uuid4().hex[:8]}"
    try:  # a full disk is a 507; the previous checkpoint is untouched
        with on_full_disk(
            f"checkpoint of table {table.name!r}",
            path,
            table=table.name,
            cleanup=lambda: shutil.rmtree(tmp, ignore_errors=True),
        ):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            state, meta, changes = _write_snapshot(table, tmp, ted2flat, hold=_stall)
            SF.save_state(tmp, state)
            (tmp / METADATA).write_text(json.dumps(meta, indent=2))
            if _stall:
                _fsync_tree(tmp)
            else:
                _in_background(lambda: _fsync_tree(tmp))
            aside = None
            if path.exists():
                aside = path.parent / f"{path.name}{ASIDE}{uuid.uuid4().hex[:8]}"
                os.rename(path, aside)
            os.rename(tmp, path)
            fsync_path(path.parent)
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
            table.last_checkpoint = Written(
                path, meta["checkpoint_id"], changes, ted2flat, files_of(path)
            )
            return path
    except TDReplayError:
        raise
    except Exception as err:
        raise CheckpointError(
            f"table {table.name!r}: checkpoint to {path} failed: {err}", table=table.name
        ) from err


def _in_background(fn: Callable[[], None]) -> None:
    """Run ``fn`` in a thread of its own at nice :data:`BACKGROUND_NICE` and wait for it.

    A checkpoint is background work: the samples and inserts it runs beside
    should get the CPU first (on Linux a nice value is per thread; the thread
    ends with ``fn``, so no worker thread of the caller's is left reniced).
    """
    failed: list[BaseException] = []

    def run() -> None:
        try:
            with contextlib.suppress(OSError, AttributeError):  # not Linux, or not allowed
                tid = threading.get_native_id()
                nice = max(os.getpriority(os.PRIO_PROCESS, tid), BACKGROUND_NICE)
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            fn()
        except BaseException as err:  # raised in the caller's thread
            failed.append(err)

    worker = threading.Thread(target=run, name="tdreplay-checkpoint", daemon=True)
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


def _meta(table: Table, snap: Snapshot, ted2flat: bool) -> dict[str, Any]:
    """The checkpoint's metadata, of the snapshot it writes."""
    return {
        "format_version": FORMAT_VERSION,
        "checkpoint_id": uuid.uuid4().hex,
        "created_at": snap.taken_at,
        "spec": table.spec.model_dump(mode="json"),
        "hi": snap.hi,
        "size": snap.size,
        "ted2flat": bool(ted2flat),
        "live_only": snap.live_only,
    }


def _save_rows(table: Table, data: TensorDict, folder: Path, state: dict[str, Any]) -> None:
    """Rows ``[0, hi)`` (``data``) in TorchRL's flat TED layout."""
    hi, cursor = data.batch_size[0], state["writer"]["cursor"]
    # A full ring with its cursor at 0 is in order already: TorchRL's
    # roll breaks on a shift of 0, so it is saved as not full.
    full = hi == table.capacity and cursor != 0
    # Not full, the rows end at hi (the reader closes the last trajectory
    # there); the cursor is past it when an insert was in flight at the
    # snapshot (claimed, not written: not in the checkpoint).
    _save_flat(data, folder, cursor=cursor if full else hi % table.capacity, full=full)


def _write_snapshot(
    table: Table, tmp: Path, ted2flat: bool, hold: bool
) -> tuple[dict[str, Any], dict[str, Any], int]:
    """Write the rows of one snapshot of ``table`` to ``tmp/storage`` (copied while the
    table serves; with ``hold``, under its locks, as before snapshots: for comparisons);
    its state, metadata and change count."""
    # TED2Flat's layout is TorchRL's, a ring of rows [0, hi): in the plain one, only the
    # slots live at the snapshot (no sampler, writer or restore reads a dead slot's row)
    with table.snapshot(hold=hold, live_only=not ted2flat) as snap:
        state, meta, hi = snap.state, _meta(table, snap, ted2flat), snap.hi
        if not snap.rows:
            return state, meta, snap.changes
        schema = table.spec.torch_schema()
        copy = snap.copy if hold else lambda sink: _in_background(lambda: snap.copy(sink))
        if ted2flat:  # TED2Flat takes the rows whole
            rows = RowsInMemory({k: torch.empty([hi, *s], dtype=d) for k, (s, d) in schema.items()})
            copy(rows)
            if _save_flat_lossless(table, rows.tensors, tmp, state, hi):
                return state, meta, snap.changes
            log.warning(
                "table %r: its rows are not one TED stream TED2Flat keeps bit for bit "
                "(interleaved trajectories, or not a TED schema); checkpointed in the plain layout",
                table.name,
            )
            meta["ted2flat"] = False
            with RowFiles(tmp / "storage", schema, hi) as files:
                for key, tensor in rows.tensors.items():
                    files.put(key, 0, row_bytes(tensor))
                files.finish()
        else:
            with RowFiles(tmp / "storage", schema, snap.rows) as files:
                copy(files)
    return state, meta, snap.changes


def _save_flat_lossless(
    table: Table, tensors: dict[NestedKey, torch.Tensor], tmp: Path, state: dict[str, Any], hi: int
) -> bool:
    """Write rows ``[0, hi)`` in TorchRL's flat layout to ``tmp/storage``; whether
    ``Flat2TED`` gives them back bit for bit (else that folder is deleted).

    ``TED2Flat`` stores a step's next observation only as the observation of the
    row after it (or, at a trajectory's end, apart), and no root done flags: rows
    of trajectories interleaved in the table (several collectors, a batched
    environment), or root done flags set, would come back changed. A schema
    without TED's keys cannot be flattened at all.
    """
    if not flat_layout_fits(table.spec):
        return False
    data = nest(tensors, hi)
    _save_rows(table, data, tmp / "storage", state)
    try:
        back = leaves(load_flat(tmp, table.spec, hi, data))
    except InvalidCheckpoint:
        back = {}
    if all(
        key in back and np.array_equal(row_bytes(t), row_bytes(torch.as_tensor(back[key])))
        for key, t in tensors.items()
    ):
        return True
    shutil.rmtree(tmp / "storage")
    return False


def _save_flat(data: TensorDict, path: Path, *, cursor: int, full: bool) -> None:
    from torchrl.data.replay_buffers.utils import TED2Flat

    hook = TED2Flat()
    hook.shift = cursor
    hook.is_full = full
    hook(data, path)
