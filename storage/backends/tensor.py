"""``memory``, ``memmap`` and ``shared``: one CPU tensor per field.

Rows are gathered with ``torch.index_select`` into reused buffers (10x faster
than advanced indexing) and written with slice copies or ``index_copy_``. A
batch of a few rows is gathered with one ``memmove`` a row and field instead:
a torch call costs 2-8 us whatever it copies (the most when a server and its
client take turns on the cores), so eleven of them for a one-row cartpole
sample cost more than the rest of the sample. Into a sample target, whose
buffers' bytes are memoryviews made once (:meth:`TensorBackend.gather_rows`),
a row is one memoryview slice assignment (0.17 us, no call through ``ctypes``
at 0.4 us or more).
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Mapping
from pathlib import Path

import torch
from tensordict import TensorDictBase

from ..diskspace import fsync_path
from ..extents import Extents, Span
from ..spec import NestedKey, TableSpec
from ..tensordicts import byte_view
from .base import Backend, Rows
from .locations import LocationClaim, delete_location, release_folder
from .shared import SHARED_MEMORY, segment_spans

#: batches of at most this many rows are gathered with memmove (see the module docstring)
SMALL_BATCH = 8


class TensorBackend(Backend):
    """``memory``, ``memmap`` and ``shared``: one CPU tensor per field.

    A memmap backend holds a :class:`~.locations.LocationClaim` on its folder
    (``claim``); memory and shared backends have none. A memmap backend's row
    files are sparse, and so are a shared backend's segments
    (:func:`~.shared.shared_fields`): their disk, or shared memory, is reserved in
    extents (:attr:`extents`), or all at once with ``preallocate``.

    Raises:
        InsufficientStorage: (``preallocate``) the disk, or ``/dev/shm``, has no room for
            the capacity.
    """

    def __init__(
        self,
        spec: TableSpec,
        storage: TensorDictBase,
        claim: LocationClaim | None = None,
        *,
        preallocate: bool = False,
    ) -> None:
        super().__init__(spec, storage)
        self.kind = spec.backend.kind
        self.claim = claim
        self.path = claim.path if claim is not None else None
        self.tensors: dict[NestedKey, torch.Tensor] = {k: storage.get(k) for k in self.keys}
        if self.path is not None:
            spans = [
                Span(self.path.joinpath(*k[:-1], f"{k[-1]}.memmap"), 0, nbytes)  # from_schema's
                for k, nbytes in zip(self.keys, self._row_nbytes, strict=True)
            ]
            self.extents = Extents(spans, self.capacity, spec.name, preallocate=preallocate)
        elif self.kind == "shared":  # the segments live as long as self.storage
            spans = segment_spans(list(self.tensors.values()), self._row_nbytes)
            self.extents = Extents(
                spans, self.capacity, spec.name, preallocate=preallocate, room=SHARED_MEMORY
            )
        self._row_files: list[Path] | None = None
        # The hot paths use plain-Tensor views of the same memory: slicing a
        # MemoryMappedTensor goes through its Python __getitem__ (9 us against
        # 2 us per field for a slice copy).
        self._items = [(k, t.as_subclass(torch.Tensor)) for k, t in self.tensors.items()]
        #: (key, address, row bytes) of every field, for the small-batch gather (the
        #: tensors' memory stays where it is for the backend's life)
        self._rows = [
            (k, t.data_ptr(), nbytes)
            for (k, t), nbytes in zip(self._items, self._row_nbytes, strict=True)
        ]
        #: (key, bytes, row bytes) of every field, for :meth:`gather_rows`
        self._bytes = [
            (k, byte_view(t), nbytes)
            for (k, t), nbytes in zip(self._items, self._row_nbytes, strict=True)
        ]
        assert all(t.is_contiguous() for _, t in self._items)

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        self._cover(rows)  # never a hole under a mapped write
        if isinstance(rows, slice):
            for key, t in self._items:
                t[rows].copy_(data[key])
        else:
            for key, t in self._items:
                t.index_copy_(0, rows, data[key])

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        """Rows ``index`` into ``out`` (contiguous CPU tensors of ``len(index)`` rows)."""
        if len(index) > SMALL_BATCH:
            for key, t in self._items:
                torch.index_select(t, 0, index, out=out[key])
            return
        rows = index.tolist()
        self._check_rows(rows)
        memmove = ctypes.memmove
        for key, src, nbytes in self._rows:
            dst = out[key].data_ptr()
            for j, r in enumerate(rows):
                memmove(dst + j * nbytes, src + r * nbytes, nbytes)

    def gather_rows(
        self,
        rows: list[int],
        out: Mapping[NestedKey, torch.Tensor],
        out_bytes: Mapping[NestedKey, memoryview],
    ) -> None:
        """A few ``rows`` into ``out``, copied row by row through ``out_bytes``."""
        self._check_rows(rows)
        for key, src, nbytes in self._bytes:
            dst = out_bytes[key]
            at = 0
            for r in rows:
                start = r * nbytes
                dst[at : at + nbytes] = src[start : start + nbytes]
                at += nbytes

    def _check_rows(self, rows: list[int]) -> None:
        for r in rows:
            if not 0 <= r < self.capacity:
                raise IndexError(f"row {r} is outside the table's [0, {self.capacity})")

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        return {k: t[start:stop].clone() for k, t in self._items}

    def view_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        """Rows ``start:stop`` without a copy (the caller must not hold them across writes)."""
        return {k: t[start:stop] for k, t in self.tensors.items()}

    def flush(self) -> None:
        """memmap: fsync the row files (their dirty pages go to disk); nothing for memory/shared."""
        if self.path is None:
            return
        if self._row_files is None:  # the same files for the backend's life: listed once
            self._row_files = sorted(self.path.rglob("*.memmap"))
        for file in self._row_files:
            fsync_path(file)

    def close(self) -> None:
        self.tensors.clear()
        self._items = []
        self._rows = []
        self._bytes = []
        if self.claim is not None:
            self.claim.release()

    def destroy(self) -> None:
        self.tensors.clear()
        self._items = []
        self._rows = []
        self._bytes = []
        if self.claim is not None:  # deleted before close() lets the location go
            with contextlib.suppress(OSError):
                delete_location(self.claim.path)
        self.close()
        if self.claim is not None:
            release_folder(self.claim.path.parent, self.spec.name)

    @property
    def location(self) -> str | None:
        return str(self.path) if self.path is not None else None
