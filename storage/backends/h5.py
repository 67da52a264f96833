"""``h5``: one HDF5 file, a dataset per field, under a ``PersistentTensorDict``.

Reads are sorted and de-duplicated as HDF5 requires, then reordered. HDF5 has
no bfloat16: such a field is stored as int16 with the same bits (see
:func:`~.base.carrier`) and viewed back on read.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ..spec import NestedKey, TableSpec
from .base import Backend, Rows, carrier
from .extents import Extents, Span
from .locations import LocationClaim, release_folder


class H5Backend(Backend):
    """``h5``: one HDF5 file, a dataset per field.

    Its whole capacity is on disk from the start: tensordict's ``from_schema``
    writes every dataset whole (zeros) when it creates the file, and the
    datasets' blocks are reserved (:attr:`extents`) before the table serves.

    Raises:
        InsufficientStorage: the disk has no room for the capacity.
    """

    kind = "h5"

    def __init__(self, spec: TableSpec, storage: TensorDictBase, claim: LocationClaim) -> None:
        super().__init__(spec, storage)
        self.claim = claim
        self.path = claim.path
        self.file = storage.file  # type: ignore[attr-defined]
        self.datasets = {k: self.file["/".join(k)] for k in self.keys}
        try:
            self.file.flush()  # HDF5 writes what fits and reports nothing: the file is whole now
            spans = [
                Span(self.path, int(self.datasets[k].id.get_offset() or 0), nbytes)
                for k, nbytes in zip(self.keys, self._row_nbytes, strict=True)
            ]
            self.extents = Extents(spans, self.capacity, spec.name, preallocate=True)
        except BaseException:
            with contextlib.suppress(Exception):
                self.file.close()
            raise

    @classmethod
    def allocate(cls, spec: TableSpec, claim: LocationClaim) -> H5Backend:
        """A fresh HDF5 file for ``spec`` at the claimed location (bfloat16 stored as int16)."""
        schema = {k: (s, carrier(d)) for k, (s, d) in spec.torch_schema().items()}
        td = TensorDict.from_schema(
            schema, batch_size=[spec.capacity], storage="h5", filename=str(claim.path)
        )
        return cls(spec, td, claim)

    def write(self, rows: Rows, data: Mapping[NestedKey, torch.Tensor]) -> None:
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
