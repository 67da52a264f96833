"""``h5``: one HDF5 file, a dataset per field, under a ``PersistentTensorDict``; disk in extents.

Reads are sorted and de-duplicated as HDF5 requires, then reordered. HDF5 has
no bfloat16: such a field is stored as int16 with the same bits (see
:func:`~.base.carrier`) and viewed back on read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import h5py
import numpy as np
import torch
from tensordict import PersistentTensorDict, TensorDictBase

from ..extents import Extents, Span
from ..spec import NestedKey, TableSpec
from .base import Backend, Rows, carrier
from .locations import LocationClaim, release_folder


class H5Backend(Backend):
    """``h5``: one HDF5 file, a dataset per field.

    The file is made with h5py: contiguous datasets whose place in the file is
    fixed at create (early allocation) but never filled, so the file is sparse
    and disk follows the data, reserved in extents under the rows (:attr:`extents`)
    as for memmap; ``preallocate`` reserves the whole capacity at create.
    (tensordict's ``from_schema(storage="h5")`` writes every dataset whole from a
    zero tensor the size of the table: the capacity on disk, and in memory, at
    create.) The file is then wrapped as a ``PersistentTensorDict``.

    Raises:
        InsufficientStorage: (``preallocate``) the disk has no room for the capacity.
    """

    kind = "h5"

    def __init__(
        self,
        spec: TableSpec,
        storage: TensorDictBase,
        claim: LocationClaim,
        *,
        preallocate: bool = False,
    ) -> None:
        super().__init__(spec, storage)
        self.claim = claim
        self.path = claim.path
        self.file = storage.file  # type: ignore[attr-defined]
        self.datasets = {k: self.file["/".join(k)] for k in self.keys}
        try:
            self.file.flush()
            spans = [
                Span(self.path, int(self.datasets[k].id.get_offset()), nbytes)
                for k, nbytes in zip(self.keys, self._row_nbytes, strict=True)
            ]
            self.extents = Extents(spans, self.capacity, spec.name, preallocate=preallocate)
        except BaseException:
            with contextlib.suppress(Exception):
                self.file.close()
            raise

    @classmethod
    def allocate(
        cls, spec: TableSpec, claim: LocationClaim, *, preallocate: bool = False
    ) -> H5Backend:
        """A fresh HDF5 file for ``spec`` at the claimed location (bfloat16 stored as int16):
        every dataset placed, none written."""
        f = h5py.File(claim.path, "w")
        try:
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)  # its place in the file, now
            dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)  # nothing written there
            for key, (shape, dtype) in spec.torch_schema().items():
                group = f.require_group("/".join(key[:-1])) if len(key) > 1 else f
                numpy_dtype = torch.empty(0, dtype=carrier(dtype)).numpy().dtype
                group.create_dataset(
                    key[-1], shape=(spec.capacity, *shape), dtype=numpy_dtype, dcpl=dcpl
                )
            td = PersistentTensorDict(group=f, batch_size=[spec.capacity])
        except BaseException:
            f.close()
            raise
        return cls(spec, td, claim, preallocate=preallocate)

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
        self._cover(rows)
        if isinstance(rows, slice):
            for key, ds in self.datasets.items():
                ds[rows] = _to_numpy(data[key])
            return
        order = torch.argsort(rows)
        srows = rows[order].numpy()
        for key, ds in self.datasets.items():
            ds[srows] = _to_numpy(data[key][order])

    def gather(self, index: torch.Tensor, out: Mapping[NestedKey, torch.Tensor]) -> None:
        uniq, inverse = torch.unique(index, sorted=True, return_inverse=True)
        rows = uniq.numpy()
        for key, ds in self.datasets.items():
            got = torch.from_numpy(ds[rows])
            if self.dtypes[key] == torch.bfloat16:
                got = got.view(torch.bfloat16)
            torch.index_select(got, 0, inverse, out=out[key])

    def read_range(self, start: int, stop: int) -> dict[NestedKey, torch.Tensor]:
        out = {}
        for key, ds in self.datasets.items():
            got = torch.from_numpy(ds[start:stop])
            out[key] = got.view(torch.bfloat16) if self.dtypes[key] == torch.bfloat16 else got
        return out

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        with contextlib.suppress(Exception):  # already closed
            self.file.close()
        self.claim.release()

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.file.close()
        self.path.unlink(missing_ok=True)  # before close() lets the location go
        self.close()
        release_folder(self.path.parent, self.spec.name)

    @property
    def location(self) -> str | None:
        return str(self.path)


def _to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().numpy()
