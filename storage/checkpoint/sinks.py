"""Where a checkpoint puts a table snapshot's rows (:meth:`Snapshot.copy
<tdreplay.storage.table.snapshot.Snapshot.copy>`): the row files of a memmapped
TensorDict folder (:class:`RowFiles`) or, for TorchRL's flat layout, which
``TED2Flat`` needs whole, tensors in memory (:class:`RowsInMemory`)."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..spec import NestedKey
from ..tensordicts import nest, row_bytes

#: fields of a checkpoint of at most this many bytes are gathered in memory, written once
_SMALL = 1 << 20


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
