"""A snapshot of a table's rows, copied while the table keeps serving.

A checkpoint is one snapshot of the table: its rows and state exactly as they
were at one instant, that at which the state is taken. Only that is done under
the table's locks (see :mod:`~tdreplay.storage.checkpoint.write`): the state
(slots, sampler, writer, limiter, RNG: small tensors of ``capacity`` entries at
most), ``hi``, and registering :meth:`Snapshot.before_write`, a copy-on-write hook,
in ``Table._before_write``. The rows ``[0, hi)`` are then copied by
:meth:`Snapshot.copy` in chunks of about :data:`CHUNK_BYTES`, each under a
short read lock on the data (samples share it; an extend waits for at most one
chunk), straight into a sink: the checkpoint's row files (:class:`RowFiles`)
or, for TorchRL's flat layout, which ``TED2Flat`` needs whole, tensors in
memory (:class:`RowsInMemory`).

An extend calls the hook, under the data write lock, with the rows it is about
to overwrite; the hook saves the old contents of those not copied yet (each
row at most once) into a side buffer, whose rows replace the copied ones at
the end. The side buffer is bounded by the rows overwritten while the
checkpoint runs, and by ``hi`` rows at worst (an extend during a checkpoint
also pays one extra copy of the rows it overwrites). Sampling, priority
updates and ``max_times_sampled`` evictions change state, never rows, so they
never wait on a checkpoint beyond the state capture. The hook works through
``Backend.read``, so it serves every backend. Should the hook fail to save
rows (a Redis error), the extend still goes on and the checkpoint fails; so
does closing the table meanwhile. An insert in flight at the snapshot (slots
claimed, rows not written) is not in it, as it was not live; the writer's
cursor is already past its slots.
"""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..backends import Rows, TensorBackend
from ..errors import CheckpointError
from ..spec import NestedKey
from ..tensordicts import nest

if TYPE_CHECKING:
    from ..table import Table

#: rows are copied into a checkpoint in chunks of about this many bytes, each
#: under a short read lock on the table's data
CHUNK_BYTES = 4 << 20
#: fields of a checkpoint of at most this many bytes are gathered in memory, written once
_SMALL = 1 << 20


class Snapshot:
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

    def before_write(self, rows: Rows) -> None:
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

    def copy(self, sink: RowsInMemory | RowFiles) -> None:
        """Copy the snapshot's rows into ``sink``, chunk by chunk, then the saved rows over them.

        The GIL is let go of as seldom as can be (each time, a sampling thread
        may take it, and this thread, niced, wait for the CPU to get it back):
        rows move as byte arrays, and a chunk costs about one ``pwrite`` per
        large field.
        """
        table, backend = self.table, self.table.backend
        step = max(1, CHUNK_BYTES // max(1, table.spec.item_nbytes))
        whole = None
        if isinstance(backend, TensorBackend):  # memory, memmap, shared: no extra copy
            whole = {k: row_bytes(t) for k, t in backend.view_range(0, self.hi).items()}
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
                    sink.put(key, start, row_bytes(src))
        for index, saved in self.pieces:
            for key, src in saved.items():
                sink.overlay(key, index, row_bytes(src))
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


def row_bytes(t: torch.Tensor) -> np.ndarray:
    """The rows of ``t`` as a ``[rows, row bytes]`` uint8 array sharing its memory."""
    return t.contiguous().reshape(len(t), -1).view(torch.uint8).numpy()


class RowsInMemory:
    """A snapshot's rows gathered in memory."""

    def __init__(self, tensors: dict[NestedKey, torch.Tensor]) -> None:
        self.tensors = tensors
        self._rows = {k: row_bytes(t) for k, t in tensors.items()}

    def put(self, key: NestedKey, start: int, rows: np.ndarray) -> None:
        self._rows[key][start : start + len(rows)] = rows

    def overlay(self, key: NestedKey, index: torch.Tensor, rows: np.ndarray) -> None:
        self._rows[key][index.numpy()] = rows

    def finish(self) -> None:
        pass


class RowFiles:
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

    def __enter__(self) -> RowFiles:
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
