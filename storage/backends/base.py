"""The base of every backend: a fixed-capacity row store for the fields of one table."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

import torch
from tensordict import TensorDictBase

from ..extents import Extents
from ..redis_conn import RedisConnection
from ..spec import NestedKey, TableSpec

#: whether a backend's rows are there to serve (see :attr:`Backend.state`)
BackendState = Literal["ok", "unreachable", "lost"]

Rows = slice | torch.Tensor
"""Rows to write: a ``slice`` for a contiguous run (the fast path) or an int64 index tensor."""

#: Batches this large or larger are carved out of one allocation (see :meth:`Backend.empty`).
ONE_BLOCK_BYTES = 128 * 1024
_ALIGN = 64


def preallocated(spec: TableSpec, asked: bool) -> bool:
    """Whether a backend that grows with its rows (memmap, h5: disk; redis: Redis memory)
    reserves its whole capacity at once: asked by the caller (the server's
    ``--preallocate``) or by the spec's ``backend.preallocate``."""
    return asked or bool(getattr(spec.backend, "preallocate", False))


def carrier(dtype: torch.dtype) -> torch.dtype:
    """The dtype a backend without bfloat16 (HDF5, Redis) stores a field as (same bits)."""
    return torch.int16 if dtype == torch.bfloat16 else dtype


class Backend:
    """Base class: a fixed-capacity row store for the fields of one table.

    Subclasses implement :meth:`write` and :meth:`gather`; both take rows along
    the first (capacity) dimension. Callers (the :class:`~tdreplay.storage.Table`)
    serialize writes against reads of the same rows.
    """

    kind: str = ""
    #: a file backend's reserved rows (``None``: the backend holds its rows in memory)
    extents: Extents | None = None
    #: the server the rows live in (a Redis table's connection: every call waits on it, each
    #: command up to its ``timeout``); ``None``: in this process's memory or files
    connection: RedisConnection | None = None

    def __init__(self, spec: TableSpec, storage: TensorDictBase) -> None:
        self.spec = spec
        self.capacity = spec.capacity
        self.keys: list[NestedKey] = spec.keys()
        self.dtypes: dict[NestedKey, torch.dtype] = {
            k: d for k, (_, d) in spec.torch_schema().items()
        }
        self.shapes: dict[NestedKey, list[int]] = {
            k: s for k, (s, _) in spec.torch_schema().items()
        }
        #: the TensorDict that ``from_schema`` returned
        self.storage = storage
        self._row_nbytes = [math.prod(self.shapes[k]) * self.dtypes[k].itemsize for k in self.keys]

    # -- state -------------------------------------------------------------
    @property
    def state(self) -> BackendState:
        """``"ok"``: the rows are there to serve. Rows in a server (:attr:`connection`) may
        be ``"unreachable"`` (it does not answer) or ``"lost"`` (it lost them)."""
        return "ok"

    def probe(self) -> BackendState:
        """Look whether the rows are still there, without raising; returns :attr:`state`.
        Rows in a server: it is asked (a blocking call of up to the connection's timeout;
        one probe at a time). Rows here: nothing to ask."""
        return self.state

    def ping(self) -> None:
        """Make sure the server the rows live in answers now, before what cannot be half
        done (a delete: its keys go only once it answers). Rows here: nothing to ask.

        Raises:
            BackendError: it does not answer in time, or fails.
        """

    # -- I/O ---------------------------------------------------------------
    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        raise NotImplementedError

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        """Copy rows ``index`` of every field into the tensors of ``out``."""
        raise NotImplementedError

    def gather_rows(
        self,
        rows: list[int],
        out: Mapping[NestedKey, torch.Tensor],
        out_bytes: Mapping[NestedKey, memoryview],
    ) -> None:
        """:meth:`gather` of a few rows (``rows``, a list) into ``out``, whose bytes
        ``out_bytes`` also gives (``SampleTarget.row_bytes``): a backend that copies row by
        row uses those; the others gather as usual."""
        self.gather(torch.tensor(rows, dtype=torch.int64), out)

    def read(self, index: torch.Tensor) -> dict[NestedKey, torch.Tensor]:
        """Rows ``index`` of every field, in fresh tensors."""
        out = self.empty(len(index))
        self.gather(index, out)
        return out

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        """Rows ``start:stop`` of every field."""
        return self.read(torch.arange(start, stop, dtype=torch.int64))

    def empty(self, n: int) -> dict[NestedKey, torch.Tensor]:
        """Fresh uninitialized tensors for ``n`` rows of every field.

        A batch of ``ONE_BLOCK_BYTES`` or more is one allocation carved into
        the fields (64-byte aligned views of it). glibc then hands the same
        block back call after call, where separate multi-megabyte buffers are
        often returned to the OS when freed and come back as fresh pages that
        fault in at first touch (seen: ~500 page faults and twice the time per
        atari batch of 256, at random from run to run).
        """
        sizes = [n * b for b in self._row_nbytes]
        if sum(sizes) < ONE_BLOCK_BYTES:
            return {k: torch.empty([n, *self.shapes[k]], dtype=self.dtypes[k]) for k in self.keys}
        spans = [-(-size // _ALIGN) * _ALIGN for size in sizes]
        block = torch.empty(sum(spans), dtype=torch.uint8)
        out = {}
        start = 0
        for k, size, span in zip(self.keys, sizes, spans, strict=True):
            out[k] = block[start : start + size].view(self.dtypes[k]).view(n, *self.shapes[k])
            start += span
        return out

    # -- disk --------------------------------------------------------------
    def reserve(self, end: int) -> None:
        """Make sure rows ``[0, end)`` can be written without running out of disk (file
        backends reserve blocks in extents, see :mod:`~tdreplay.storage.extents`; others need nothing).

        Raises:
            InsufficientStorage: no room on the disk; nothing was written.
        """
        if self.extents is not None:
            self.extents.reserve(end)

    def _cover(self, rows: Rows) -> None:
        """Before a write: the rows it touches are reserved (a no-op once all are)."""
        ext = self.extents
        if ext is not None and ext.reserved < self.capacity:
            ext.reserve(rows.stop if isinstance(rows, slice) else int(rows.max()) + 1)

    @property
    def reserved_bytes(self) -> int:
        """Bytes of rows held now: reserved on disk (file backends, with the per-slot state
        files reserved with them) or allocated (the others)."""
        if self.extents is not None:
            return self.extents.nbytes
        return self.capacity_bytes

    @property
    def capacity_bytes(self) -> int:
        """What :attr:`reserved_bytes` is once the table is full."""
        if self.extents is not None:
            return self.capacity * self.extents.row_bytes
        return self.capacity * sum(self._row_nbytes)

    # -- lifecycle ---------------------------------------------------------
    def flush(self) -> None:
        """Make written rows durable where the backend has a notion of it."""

    def close(self) -> None:
        """Release handles; the data stays where it is (on disk; Redis keys, which nothing
        reattaches, are deleted)."""

    def destroy(self) -> None:
        """Close and delete the data itself."""
        self.close()

    @property
    def location(self) -> str | None:
        """Where the data lives (a path or a Redis URL), for ``Table.info``."""
        return None
