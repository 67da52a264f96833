"""Checkpoints: a table's data and state in one folder, written atomically.

Layout of a checkpoint folder (format 2)::

    <path>/
      metadata.json        format version, the table's spec, counts, TED flag
      state.safetensors    slot, sampler, writer and rate-limiter state, RNG state
                           (JSON + raw tensors, see :mod:`~tdreplay.storage.statefile`)
      storage/             the written rows [0, hi) as a memmapped TensorDict
                           (or TorchRL's flat TED layout when ted2flat is on)

Nothing read from a checkpoint can run code: a checkpoint folder is as
untrusted as a request body. ``metadata.json`` is parsed as JSON, the state
file holds JSON and raw tensors (:mod:`~tdreplay.storage.statefile`), and the
rows are read by :mod:`~tdreplay.storage.checkpoint_reader`, not
``TensorDict.load_memmap`` (which unpickles a non-tensor entry's
``other.pickle``): only the ``.memmap`` files the spec calls for, with the
spec's dtypes and shapes, every ``meta.json`` as JSON.

Format 1 checkpoints (``state.pt``, written with ``torch.save``) are still
restored: their state is read with ``torch.load(weights_only=True)``, which
only rebuilds tensors and plain containers and refuses anything else, then
checked like a format 2 state; the rows are read as above. Checkpointing the
restored table writes format 2.

A damaged, unsupported or unsafe checkpoint is refused with
:class:`~tdreplay.storage.InvalidCheckpoint` (a :class:`CheckpointError`),
whose message names the file and the problem; nothing of it was loaded.

The folder is written next to ``path`` under a temporary name and renamed
into place; an existing checkpoint is first renamed aside and deleted only
once the new one is in place. A crash at any point leaves either the old or
the new checkpoint readable: :func:`restore` falls back to the aside copy when
``path`` itself is missing.

Checkpoints do not stall the service. A checkpoint is one snapshot of the
table: its rows and state exactly as they were at one instant, that at which
the state is taken. Only that is done under the table's locks: the state
(slots, sampler, writer, limiter, RNG: small tensors of ``capacity`` entries
at most), ``hi``, and a copy-on-write hook registered in
``Table._before_write``. The rows ``[0, hi)`` are then copied in chunks of
about :data:`CHUNK_BYTES`, each under a short read lock on the data (samples
share it; an extend waits for at most one chunk), straight into the
checkpoint's row files. An extend calls the hook, under the data write lock,
with the rows it is about to overwrite; the hook saves the old contents of
those not copied yet (each row at most once) into a side buffer, whose rows
replace the copied ones at the end. The side buffer is bounded by the rows
overwritten while the checkpoint runs, and by ``hi`` rows at worst (an extend
during a checkpoint also pays one extra copy of the rows it overwrites).
Sampling, priority updates and ``max_times_sampled`` evictions change state,
never rows, so they never wait on a checkpoint beyond the state capture. The
hook works through ``Backend.read``, so it serves every backend; with TorchRL's
flat layout the rows are assembled in memory first, as ``TED2Flat`` needs
them whole. Should the hook fail to save rows (a Redis error), the extend
still goes on and the checkpoint fails; so does closing the table meanwhile.
An insert in flight at the snapshot (slots claimed, rows not written) is not
in it, as it was not live; the writer's cursor is already past its slots.

The copy and the final flush run in a short-lived thread at nice
:data:`BACKGROUND_NICE`, and give up the GIL about once per large field and
chunk (rows move as bytes with ``pwrite``; small fields are written once):
each time they take it back, a sampling thread may have to wait. Measured
with ``bench/checkpoint_bench.py`` (``bench/results/checkpoint.json``).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import TensorDict

from . import checkpoint_reader as R
from . import statefile as SF
from .backends import allocate, primary_location, sweep
from .diskspace import fsync_path, insufficient, is_full
from .errors import CheckpointError, InvalidCheckpoint, TDReplayError
from .redis_conn import Connections
from .spec import NestedKey, TableSpec
from .tensordicts import leaves, nest
from .writers import RoundRobinWriter

if TYPE_CHECKING:
    from .table import Table

FORMAT_VERSION = 2
#: formats :func:`restore` reads (1: state in ``state.pt``, read with ``weights_only=True``)
READABLE_FORMATS = (1, 2)
_V1_STATE = "state.pt"
_ASIDE = ".old-"
_TMP = ".tmp-"
#: rows are copied into a checkpoint in chunks of about this many bytes, each
#: under a short read lock on the table's data
CHUNK_BYTES = 4 << 20
#: the nice value a checkpoint's copy and flush run at (a thread of their own)
BACKGROUND_NICE = 10
#: fields of a checkpoint of at most this many bytes are gathered in memory, written once
_SMALL = 1 << 20


_fsync_dir = fsync_path


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


def _write(table: Table, path: Path, *, ted2flat: bool | None, _stall: bool = False) -> Path:
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
        if _stall:
            state, meta = _write_locked(table, tmp, ted2flat)
        else:
            state, meta = _write_snapshot(table, tmp, ted2flat)
        SF.save_state(tmp, state)
        (tmp / "metadata.json").write_text(json.dumps(meta, indent=2))
        if _stall:
            _fsync_tree(tmp)
        else:
            _in_background(lambda: _fsync_tree(tmp))
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
        if is_full(err):  # 507; the previous checkpoint is untouched
            raise insufficient(
                f"checkpoint of table {table.name!r}", path, err, table=table.name
            ) from err
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


def _capture(table: Table, ted2flat: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The table's state and the checkpoint's metadata (both locks held by the caller)."""
    state = table.state_dict()
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "created_at": time.time(),
        "spec": table.spec.model_dump(mode="json"),
        "hi": table.slots.hi,
        "size": table.slots.n_live,
        "ted2flat": bool(ted2flat),
    }
    return state, meta


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


def _write_locked(table: Table, tmp: Path, ted2flat: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint copied whole under the table's locks: the way before snapshots, kept
    only for ``bench/checkpoint_bench.py`` to compare against."""
    with table._cond, table._data_lock.read():
        state, meta = _capture(table, ted2flat)
        hi = meta["hi"]
        if hi:
            data = nest(table.backend.read_range(0, hi), hi)
            if ted2flat:
                _save_rows(table, data, tmp / "storage", state)
            else:
                data.memmap(tmp / "storage", num_threads=0)
    return state, meta


class _Snapshot:
    """Rows ``[0, hi)`` of a table as they were when it was made, copied while it runs.

    :meth:`before_write` is the copy-on-write hook (see the module docstring);
    it and :meth:`copy`'s chunks run under the data write and read locks, so
    they never overlap.
    """

    def __init__(self, table: Table, hi: int) -> None:
        self.table, self.hi = table, hi
        #: rows ``[0, done)`` are copied: the hook leaves them alone
        self.done = 0
        self.saved = torch.zeros(hi, dtype=torch.bool)
        #: the side buffer: (rows, their contents at the snapshot)
        self.pieces: list[tuple[torch.Tensor, dict[NestedKey, torch.Tensor]]] = []
        self.error: Exception | None = None

    def before_write(self, rows: slice | torch.Tensor) -> None:
        if self.error is not None:
            return
        try:
            if isinstance(rows, slice):
                lo, up = max(rows.start or 0, self.done), min(rows.stop, self.hi)
                if lo >= up:
                    return
                index = torch.arange(lo, up, dtype=torch.int64)
            else:
                index = rows[(rows >= self.done) & (rows < self.hi)]
            index = index[~self.saved[index]]
            if len(index):
                self.pieces.append((index, self.table.backend.read(index)))
                self.saved[index] = True
        except Exception as err:  # the extend goes on; the checkpoint fails
            self.error = err

    def copy(self, sink: _Tensors | _Files) -> None:
        """Copy the snapshot's rows into ``sink``, chunk by chunk, then the saved rows over them.

        The GIL is let go of as seldom as can be (each time, a sampling thread
        may take it, and this thread, niced, wait for the CPU to get it back):
        rows move as byte arrays, and a chunk costs about one ``pwrite`` per
        large field.
        """
        table, backend = self.table, self.table.backend
        step = max(1, CHUNK_BYTES // max(1, table.spec.item_nbytes))
        views = getattr(backend, "view_range", None)  # memory, memmap, shared: no extra copy
        whole = {k: _bytes(t) for k, t in views(0, self.hi).items()} if views else None
        for start in range(0, self.hi, step):
            stop = min(self.hi, start + step)
            with table._data_lock.read():
                self._check()
                if whole is not None:
                    for key, rows in whole.items():
                        sink.put(key, start, rows[start:stop])
                    got = None
                else:
                    got = backend.read_range(start, stop)
                self.done = stop
            if got is not None:
                for key, src in got.items():
                    sink.put(key, start, _bytes(src))
        for index, saved in self.pieces:
            for key, src in saved.items():
                sink.overlay(key, index, _bytes(src))
        sink.finish()

    def _check(self) -> None:
        if self.table.closed:
            raise CheckpointError(
                f"table {self.table.name!r} was closed while a checkpoint was written",
                table=self.table.name,
            )
        if self.error is not None:
            raise CheckpointError(
                f"table {self.table.name!r}: the rows an insert overwrote during the checkpoint "
                f"could not be saved: {self.error}",
                table=self.table.name,
            ) from self.error


def _write_snapshot(
    table: Table, tmp: Path, ted2flat: bool
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write the rows of one snapshot to ``tmp/storage`` (see the module docstring)."""
    with table._cond, table._data_lock.read():
        state, meta = _capture(table, ted2flat)
        hi = meta["hi"]
        snap = _Snapshot(table, hi)
        if hi:
            table._before_write.append(snap.before_write)
    if not hi:
        return state, meta
    try:
        schema = table.spec.torch_schema()
        if ted2flat:  # TED2Flat takes the rows whole
            rows = _Tensors({k: torch.empty([hi, *s], dtype=d) for k, (s, d) in schema.items()})
            _in_background(lambda: snap.copy(rows))
            _save_rows(table, nest(rows.tensors, hi), tmp / "storage", state)
        else:
            with _Files(tmp / "storage", schema, hi) as files:
                _in_background(lambda: snap.copy(files))
    finally:
        with table._data_lock.read():  # no extend is calling the hooks
            table._before_write.remove(snap.before_write)
    return state, meta


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The rows of ``t`` as a ``[rows, row bytes]`` uint8 array sharing its memory."""
    return t.contiguous().reshape(len(t), -1).view(torch.uint8).numpy()


class _Tensors:
    """A snapshot's rows gathered in memory."""

    def __init__(self, tensors: dict[NestedKey, torch.Tensor]) -> None:
        self.tensors = tensors
        self._rows = {k: _bytes(t) for k, t in tensors.items()}

    def put(self, key: NestedKey, start: int, rows: np.ndarray) -> None:
        self._rows[key][start : start + len(rows)] = rows

    def overlay(self, key: NestedKey, index: torch.Tensor, rows: np.ndarray) -> None:
        self._rows[key][index.numpy()] = rows

    def finish(self) -> None:
        pass


class _Files:
    """A snapshot's rows written to the row files of a memmapped TensorDict folder.

    The folder is laid out by ``TensorDict.memmap_like`` (the files and
    ``meta.json`` that ``TensorDict.memmap`` writes) and its files' blocks are
    reserved up front, so a full disk is an error here, not a SIGBUS. Rows go
    in with ``pwrite`` (about 3x faster than through a fresh map, whose every
    page faults in on first touch); fields of at most :data:`_SMALL` bytes
    are gathered in memory and written once, by :meth:`finish`.
    """

    def __init__(self, folder: Path, schema: dict[NestedKey, Any], hi: int) -> None:
        template = {
            k: torch.zeros([1] * (1 + len(shape)), dtype=d).expand(hi, *shape)
            for k, (shape, d) in schema.items()
        }
        nest(template, hi).memmap_like(folder, num_threads=0)  # sized files, no data
        self.row_nbytes = {k: math.prod(shape) * d.itemsize for k, (shape, d) in schema.items()}
        self.small = {
            k: np.empty((hi, n), dtype=np.uint8)
            for k, n in self.row_nbytes.items()
            if hi * n <= _SMALL
        }
        self.fds: dict[NestedKey, int] = {}
        try:
            for key in schema:
                path = folder.joinpath(*key[:-1], f"{key[-1]}.memmap")
                self.fds[key] = fd = os.open(path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
                os.posix_fallocate(fd, 0, os.fstat(fd).st_size)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> _Files:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def put(self, key: NestedKey, start: int, rows: np.ndarray) -> None:
        small = self.small.get(key)
        if small is not None:
            small[start : start + len(rows)] = rows
        else:
            self._write(key, start, rows)

    def overlay(self, key: NestedKey, index: torch.Tensor, rows: np.ndarray) -> None:
        # one write per run of consecutive rows (an insert overwrites runs)
        breaks = ((index[1:] - index[:-1]) != 1).nonzero().squeeze(1) + 1
        bounds = [0, *breaks.tolist(), len(index)]
        for a, b in itertools.pairwise(bounds):
            self.put(key, int(index[a]), rows[a:b])

    def finish(self) -> None:
        for key, rows in self.small.items():
            self._write(key, 0, rows)

    def _write(self, key: NestedKey, start: int, rows: np.ndarray) -> None:
        data = rows.data.cast("B")
        offset = start * self.row_nbytes[key]
        while data:
            n = os.pwrite(self.fds[key], data, offset)
            data, offset = data[n:], offset + n


def _save_flat(data: TensorDict, path: Path, *, cursor: int, full: bool) -> None:
    from torchrl.data.replay_buffers.utils import TED2Flat

    hook = TED2Flat()
    hook.shift = cursor
    hook.is_full = full
    hook(data, path)


def is_checkpoint(path: Path) -> bool:
    """Whether the folder ``path`` is a checkpoint (its ``metadata.json``, written last, exists)."""
    return (path / "metadata.json").exists()


def find(path: Path) -> Path:
    """The readable checkpoint for ``path``: itself, or the copy set aside by an interrupted swap."""
    if is_checkpoint(path):
        return path
    asides = sorted(
        path.parent.glob(f"{path.name}{_ASIDE}*"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for aside in asides:
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
        meta = R.read_json(src, src / "metadata.json")
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


def _overlap(a: Path, b: Path) -> bool:
    a, b = a.absolute(), b.absolute()
    return a == b or a in b.parents or b in a.parents


def restore(
    cls: type[Table],
    path: Path,
    root: str | Path | None,
    *,
    seed: int | None = None,
    redis: Connections | None = None,
    expect: TableSpec | None = None,
) -> Table:
    """Rebuild a table from the checkpoint at ``path`` (see :meth:`Table.restore`).

    Rows and state are read and checked first (see the module docstring: nothing
    read can run code). The table is then allocated beside whatever exists at
    its location, never over it, and both are loaded into it; if that fails it
    is destroyed (its own, fresh location only) and the error raised.

    Raises:
        CheckpointError: no checkpoint at ``path``, the table's data would go
            inside it, or a file could not be read (a disk error).
        InvalidCheckpoint: the checkpoint is damaged, of an unsupported format,
            or holds something unsafe to load; the message names the file.
        SchemaError: the spec in ``metadata.json`` is invalid.
    """
    src = find(path.absolute())
    meta = read_metadata(src)
    version = meta.get("format_version")
    if not R.is_int(version) or version not in READABLE_FORMATS:
        raise InvalidCheckpoint(
            f"{src}: checkpoint format {version!r:.40} not supported (this tdreplay reads "
            f"formats {', '.join(map(str, READABLE_FORMATS))}); restore it with the tdreplay "
            "that wrote it and checkpoint it again"
        )
    if not isinstance(meta.get("spec"), dict):
        raise InvalidCheckpoint(f"{src / 'metadata.json'}: 'spec' is missing or not an object")
    spec = TableSpec.parse(meta["spec"], source=str(src / "metadata.json"))
    if expect is not None and spec != expect:
        # The caller checked ``expect`` (name, backend, limits); this is the read that counts.
        raise InvalidCheckpoint(
            f"{src / 'metadata.json'} changed while it was being restored; nothing was restored",
            table=expect.name,
        )
    hi, ted2flat = meta.get("hi"), meta.get("ted2flat", False)
    if not isinstance(hi, int) or isinstance(hi, bool) or not 0 <= hi <= spec.capacity:
        raise InvalidCheckpoint(
            f"{src / 'metadata.json'}: 'hi' is {hi!r:.40}, not an integer in [0, {spec.capacity}]"
        )
    if not isinstance(ted2flat, bool):
        raise InvalidCheckpoint(
            f"{src / 'metadata.json'}: 'ted2flat' is {ted2flat!r:.40}, not a bool"
        )
    root = Path(root) if root is not None else src.parent
    location = primary_location(spec, root)
    if location is not None and _overlap(location, src):
        # Allocating there would wipe (memmap) or write into the checkpoint being read.
        raise CheckpointError(
            f"cannot restore {src} under root {root}: the table's data would go to {location}, "
            "inside the checkpoint; pass another root",
            table=spec.name,
        )
    # Everything is read and checked before a table is allocated.
    try:
        rows = None
        if hi and ted2flat:
            schema = spec.torch_schema()
            empty = {k: torch.empty([hi, *shape], dtype=d) for k, (shape, d) in schema.items()}
            got = leaves(R.load_flat(src, spec, hi, nest(empty, hi)))
            rows = {k: torch.as_tensor(got[k]) for k in schema}
        elif hi:
            rows = R.read_rows(src, spec, hi)
        state = _read_state(src, version)
    except InvalidCheckpoint as err:
        raise InvalidCheckpoint(f"cannot restore {src}: {err}", table=spec.name) from None
    except TDReplayError:
        raise
    except Exception as err:
        raise _invalid(src, err, spec.name) from err
    # Nothing that exists is deleted or overwritten until the table is whole: a
    # table being served may live at the default location (see backends).
    table = cls(spec, allocate(spec, root, exists="beside", redis=redis), root=root, seed=seed)
    try:
        if rows is not None:
            table.backend.write(slice(0, hi), {k: v.contiguous() for k, v in rows.items()})
        _check_table_state(table, state, hi)
        table.load_state_dict(state)
    except Exception as err:
        table.destroy()
        if isinstance(err, TDReplayError):
            raise
        raise _invalid(src, err, spec.name) from err
    sweep(spec, root)
    return table


def _invalid(src: Path, err: Exception, table: str) -> CheckpointError:
    """``err`` raised while reading ``src``, as the error restore reports."""
    if isinstance(err, OSError) and not isinstance(err, FileNotFoundError):
        # the disk failed, not the checkpoint
        return CheckpointError(f"cannot restore {src}: {err}", table=table)
    return InvalidCheckpoint(f"cannot restore {src}: {err}", table=table)


def _read_state(src: Path, version: int) -> dict[str, Any]:
    """The table state of a checkpoint: JSON + raw tensors (format 2), or ``weights_only`` (1)."""
    if version >= 2:
        if os.path.lexists(src / _V1_STATE):
            # Never written beside a format 2 state: planted, or two checkpoints mixed up.
            raise InvalidCheckpoint(
                f"it holds {_V1_STATE}, which a format {version} checkpoint never has "
                "(a planted or mixed-up file); refused"
            )
        os.close(R.open_inside(src, src / SF.STATE_FILE))  # a regular file inside the checkpoint
        return SF.load_state(src)
    path = src / _V1_STATE
    os.close(R.open_inside(src, path))
    try:
        # weights_only: tensors and plain containers only; anything else is refused unrun.
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise InvalidCheckpoint(
            f"{path.name} (format 1) cannot be read safely: "
            f"{str(err).splitlines()[0] if str(err) else type(err).__name__}"
        ) from None
    structure, tensors = SF.encode(state)  # the same checks as a format 2 state
    return SF.decode(structure, tensors)


def _check_table_state(table: Table, state: dict[str, Any], hi: int) -> None:
    """Check the table-level parts of ``state`` (the components check their own)."""
    for part in ("slots", "sampler", "writer", "rate_limiter"):
        if not isinstance(state.get(part), dict):
            raise SF.StateError(f"{part}: expected a dict, got {type(state.get(part)).__name__}")
    if state["slots"].get("hi") != hi:
        raise SF.StateError(
            f"slots.hi is {state['slots'].get('hi')!r:.40}, metadata.json says {hi}"
        )
    if "episode_base" in state:
        SF.integer(state, "episode_base", "<state>")
    if "generator" in state:
        SF.tensor(state, "generator", "<state>", like=table.generator.get_state())
