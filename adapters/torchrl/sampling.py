"""``TDReplayBuffer``'s sampling side: ``sample``, prefetching and iteration, as TorchRL's.

A sample larger than the table's capacity is what TorchRL's samplers give
with replacement: it is drawn in pieces of at most the capacity and joined
(a slice sampler's pieces in whole slices). Queues and stacks hand out each
item once, so they cannot serve it: that is an error naming the size.

A slice table's samples carry the markers TorchRL's ``SliceSampler`` writes
(its default ``truncated_key=("next", "truncated")``): the last step of each
slice is truncated and done, so losses do not bootstrap across slices
(:func:`mark_slice_ends`).
"""

from __future__ import annotations

import numbers
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from tdreplay.client import InvalidRequest, ReplayClient
from tdreplay.codec.params import sample_params

from .remote import CONSUMING, ServiceSampler
from .transforms import Compose

#: what TorchRL's ``SliceSampler`` writes in a sample (and its info)
SLICE_MARKERS = (("next", "truncated"), ("next", "done"), ("next", "terminated"))


class SamplingMixin:
    """``sample``, ``__iter__`` and ``next`` of :class:`~.buffer.TDReplayBuffer`."""

    _client: ReplayClient
    _table: str
    _batch_size: int | None
    #: whether :meth:`sample` has warned of a size other than the constructor's (once, as TorchRL)
    _warned_batch_size_conflict: bool = False
    _prefetch_cap: int
    _timeout: float | None
    _transform: Compose
    _lock: threading.Lock
    _prefetcher: Iterator[Any] | None
    _iterator: Iterator[TensorDictBase] | None
    _sampler: ServiceSampler  # the buffer's (a property there)

    def _meta_info(self) -> dict[str, Any]:
        raise NotImplementedError  # the buffer's

    def __len__(self) -> int:
        raise NotImplementedError  # the buffer's

    def sample(  # type: ignore[override]
        self,
        batch_size: int | None = None,
        return_info: bool = False,
        include_info: bool | None = None,
    ) -> Any:
        """Sample ``batch_size`` items (default: the buffer's ``batch_size``).

        Returns:
            A TensorDict ``[batch_size]`` with the table's fields, ``index``,
            ``sample_info`` (``priority``, ``weight``, ``times_sampled``, ``key``; a
            prioritized table's ``max_weight`` too) and, from a prioritized table,
            ``priority_weight``; with
            ``return_info``, ``(batch, {"index": ..., "priority_weight": ...})`` (a
            transform that changed the batch's shape: the info, ``sample_info``
            with it, only there). ``include_info=False`` (TorchRL's deprecated
            flag, which warns as TorchRL's does) leaves ``index``, ``sample_info``,
            ``priority_weight`` and a slice's markers out of the batch: the info is
            then only what ``return_info`` returns.
            The batch owns its memory (a shared-memory sample is copied out).

        A ``batch_size`` here other than the constructor's prevails, with a ``UserWarning``
        the first time, as TorchRL's ``ReplayBuffer.sample`` does.

        Raises:
            RuntimeError: no ``batch_size`` here nor at construction.
            InvalidRequest: a size below 1, past the contract's most (2**31), or not an
                integer; more items than the capacity of a queue or stack table.
            RateLimitTimeout: the table could not be sampled within ``timeout``;
                EmptyTableError (a subclass) when it held no item then.
        """
        if include_info is not None:  # as TorchRL's TensorDictReplayBuffer.sample
            warnings.warn(
                "include_info is going to be deprecated soon. The default behavior has "
                "changed to `include_info=True` to avoid bugs linked to wrongly preassigned "
                "values in the output tensordict.",
                stacklevel=2,
            )
        n = batch_size if batch_size is not None else self._batch_size
        if n is None:
            raise RuntimeError(
                "TDReplayBuffer.sample needs a batch size: pass sample(batch_size) or "
                "TDReplayBuffer(..., batch_size=N)"
            )
        n = sample_params(n, self._timeout).batch_size  # the contract's rule, before any piece
        if (  # a size refused above neither warns nor spends the one warning
            n != self._batch_size
            and self._batch_size is not None
            and not self._warned_batch_size_conflict
        ):
            self._warned_batch_size_conflict = True
            warnings.warn(
                f"Got conflicting batch_sizes in constructor ({self._batch_size}) and `sample` "
                f"({n}). The batch-size provided to the sample method will prevail.",
                stacklevel=2,
            )
        piece = self._piece(n)
        if piece < n:
            batch = TensorDict.cat([self._draw(min(piece, n - k)) for k in range(0, n, piece)])
        elif self._prefetch_cap and n == self._batch_size:
            batch = next(self._prefetched())
        else:
            batch = self._draw(n)
        info: dict[str, Any] = {"index": batch.get("index")}
        if self._sampler.prioritized:
            info["priority_weight"] = batch.get(("sample_info", "weight"))
        if self._sampler.kind == "slice":
            marked = batch.select(*SLICE_MARKERS[1:], strict=False)
            mark_slice_ends(marked, int(self._sampler.options.get("slice_len") or 1))
            info.update({key: marked.get(key) for key in SLICE_MARKERS})
        if include_info is False:  # as TorchRL: the rows (transformed), no info set on them
            batch = batch.exclude("index", "sample_info")
            batch = self._transform(batch) if len(self._transform) else batch
            return (batch, info) if return_info else batch
        if len(self._transform):  # as TorchRL: the rows transformed, then the info set on them
            meta = batch.select("sample_info").update(info)
            batch = self._transform(batch.exclude("sample_info"))
            if batch.batch_size != meta.batch_size:
                if return_info:  # the info goes apart: the batch keeps the transform's shape
                    return batch, {**info, "sample_info": meta.get("sample_info", None)}
                raise RuntimeError(
                    f"TDReplayBuffer.sample: cannot set index and sample info ({meta.batch_size})"
                    f" on the transformed batch ({batch.batch_size}); a transform changed its "
                    "shape: pass sample(return_info=True) to have them apart"
                )
            batch.update(meta)
        else:
            batch.update(info)
        return (batch, info) if return_info else batch

    def __getitem__(self, index: Any) -> Any:
        """The items in slots ``index``, as TorchRL's ``rb[index]``: an int (one item), a
        slice over the table's slots, a list, array or tensor of slots (e.g. a sample's
        ``index``; the result is shaped like it, negative slots count from the end, a bool
        tensor is a mask), a one-tuple of those (a ``SliceSampler``'s index), or a key
        (``rb["observation"]``: that field of every item). Read from the server,
        transforms applied; nothing is counted as sampled.

        Raises:
            InvalidRequest: a slot that holds no item.
            IndexError: an int outside the table's items.
        """
        if isinstance(index, str) or (
            isinstance(index, tuple) and all(isinstance(k, str) for k in index)
        ):
            return self[:][index]
        if isinstance(index, tuple):  # as TorchRL: a one-tuple is its element
            return self[index[0]] if len(index) == 1 else self[:][index]
        shape: Any = None
        if isinstance(index, slice):
            if len(self._client.urls) > 1:
                raise InvalidRequest(
                    f"table {self._table!r} is sharded: read items by the index a sample gave",
                    table=self._table,
                    field="index",
                )
            slots: Any = list(range(*index.indices(len(self))))
        elif _is_int(index):
            size = len(self)
            if not -size <= int(index) < size:
                raise IndexError(f"index {index} is outside the table's {size} items")
            slots = [int(index) % size]
        else:
            slots = torch.as_tensor(index)
            if slots.dtype == torch.bool:  # a mask over the items, as TorchRL reads one
                slots = slots.nonzero().squeeze(-1)
            if bool((slots < 0).any()):
                slots = torch.where(slots < 0, slots + len(self), slots)
            shape, slots = slots.shape, slots.reshape(-1)
        rows = self._client.read(self._table, slots).exclude("index")
        if _is_int(index):
            rows = rows[0]
        elif shape is not None:
            rows = rows.reshape(shape)
        return self._transform(rows) if len(self._transform) else rows

    def _draw(self, n: int) -> TensorDictBase:
        """``n`` items in a batch that owns its memory (a shared-memory slot copied once)."""
        return self._client.sample(self._table, n, timeout=self._timeout, owned=True)

    def _piece(self, n: int) -> int:
        """The most items one draw may take: ``n``, or less when ``n`` is above the capacity."""
        capacity = int(self._meta_info().get("capacity") or n)
        if n <= capacity:
            return n
        sampler = self._sampler
        if sampler.kind in CONSUMING:
            raise InvalidRequest(
                f"table {self._table!r}: a {sampler.kind} table hands out each item once, so "
                f"a sample of {n} items cannot come from its {capacity}; sample at most that",
                table=self._table,
                field="batch_size",
                got=n,
            )
        slice_len = int(sampler.options.get("slice_len") or 1)
        return capacity - capacity % slice_len

    def _prefetched(self) -> Iterator[Any]:
        with self._lock:
            if self._prefetcher is None:
                assert self._batch_size is not None
                loader = self._client.loader(
                    self._table,
                    self._batch_size,
                    prefetch=self._prefetch_cap,
                    keep=True,
                    timeout=self._timeout,
                )
                self._prefetcher = iter(loader)
            return self._prefetcher

    def __iter__(self) -> Iterator[TensorDictBase]:
        """Batches of ``batch_size``: endless; until the table runs low for fifo/lifo tables;
        one epoch's whole batches (``len(rb) // batch_size``) for a ``without_replacement``
        table, as TorchRL's ``SamplerWithoutReplacement(drop_last=True)`` ends its iteration
        (the server's epochs go on across calls: a pass begun mid-epoch runs into the next)."""
        if self._batch_size is None:
            raise RuntimeError(
                "cannot iterate over a TDReplayBuffer without batch_size: "
                "pass TDReplayBuffer(..., batch_size=N)"
            )
        if self._sampler.epochs:
            for _ in range(len(self) // self._batch_size):
                yield self.sample()
            return
        consuming = self._sampler.consuming
        while not consuming or len(self) >= self._batch_size:
            yield self.sample()

    def next(self) -> TensorDictBase | None:
        """The next batch of the iteration, or ``None`` when it ends (TorchRL's remote protocol)."""
        if self._iterator is None:
            self._iterator = iter(self)
        try:
            return next(self._iterator)
        except StopIteration:
            self._iterator = None
            return None


def _is_int(index: Any) -> bool:
    """Whether ``index`` names one item: an int (numpy's too) or a 0-d integer tensor."""
    if isinstance(index, torch.Tensor):
        return index.ndim == 0 and not index.is_floating_point() and index.dtype != torch.bool
    return isinstance(index, numbers.Integral) and not isinstance(index, bool)


def mark_slice_ends(batch: TensorDictBase, slice_len: int) -> None:
    """Write TorchRL's ``SliceSampler`` markers into ``batch`` (slices of ``slice_len`` laid
    end to end): ``("next", "truncated")`` true at each slice's last step,
    ``("next", "done")`` or-ed with it, ``("next", "terminated")`` as stored (false if not).

        >>> td = TensorDict({"next": {"done": torch.zeros(4, 1, dtype=torch.bool)}}, [4])
        >>> mark_slice_ends(td, 2)
        >>> td["next", "truncated"].squeeze(-1).tolist(), td["next", "done"].squeeze(-1).tolist()
        ([False, True, False, True], [False, True, False, True])
    """
    n = batch.batch_size[0] if batch.batch_dims else 0
    done = batch.get(("next", "done"), None)
    shape = done.shape if done is not None and done.numel() == n else (n, 1)
    truncated = torch.zeros(n, dtype=torch.bool)
    truncated.view(-1, slice_len)[:, -1] = True
    truncated = truncated.reshape(shape)
    batch.set(("next", "truncated"), truncated)
    batch.set(("next", "done"), truncated.clone() if done is None else done | truncated)
    if batch.get(("next", "terminated"), None) is None:
        batch.set(("next", "terminated"), torch.zeros_like(truncated))
