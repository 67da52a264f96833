"""The hot path's memory on the way out: samples gathered straight into Arrow IPC bytes.

A sampled batch of ``n`` rows always encodes to the same Arrow IPC stream
layout: only the column bytes change, never the metadata.
:class:`~tdreplay.codec.ipc.SampleLayout` encodes one zero batch of ``n``
rows once and records where each column's values sit in those bytes (a
sample's columns are the table's fields and the sample info,
:func:`sample_schema`);
a :class:`SampleBuffer` is a copy of that template whose columns are exposed
as torch tensors viewing the buffer, so ``Table.sample(n, out=buffer.out)``
gathers rows (``index_select``) directly into the response body. The body
then goes to the socket as a ``memoryview``, with no encoding step and no
copy. Bool columns are the exception: Arrow packs them into bits, so they
are gathered into a small scratch tensor and packed.

Buffers are reused, and a buffer is reused only once nothing else refers to
it: the HTTP server may still hold a view of a response body in its write
queue after the response is "sent", so reuse waits until the reference
count of the buffer's array is back to what the pool alone holds. No
release call is needed and none can be forgotten.

    >>> import torch
    >>> from tdreplay.codec import decode
    >>> layout = SampleLayout({("obs",): ([2], torch.float32)}, n=3)  # columns, rows
    >>> buf = SampleBuffer(layout)
    >>> _ = buf.out["obs"].copy_(torch.arange(6.0).reshape(3, 2))
    >>> lease = buf.lease(); lease.finish()
    >>> decode(lease.body)["obs"].tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import numpy as np
import torch
from starlette.concurrency import run_in_threadpool
from tensordict import TensorDictBase

from tdreplay.codec.arrow import nest
from tdreplay.codec.ipc import EOS, SampleLayout, Schema
from tdreplay.storage import SAMPLE_INFO_DTYPES, NestedKey

__all__ = [
    "EOS",
    "INFO_NBYTES",
    "Lease",
    "Pool",
    "SampleBuffer",
    "SampleBuffers",
    "sample_nbytes",
    "sample_schema",
]


def sample_schema(schema: Schema) -> Schema:
    """A sample's columns: the table's fields, then the sample-info columns every sample
    carries (one value per row)."""
    return {**schema, **{key: ([], dtype) for key, dtype in SAMPLE_INFO_DTYPES.items()}}


class SampleBuffer:
    """One reusable response body laid out as a :class:`~tdreplay.codec.ipc.SampleLayout` says.

    ``out`` is the TensorDict to pass to ``Table.sample(n, out=...)``: every
    non-bool leaf views the body's bytes; bool leaves are scratch tensors that
    :meth:`Lease.finish` packs into the body.
    """

    def __init__(self, layout: SampleLayout) -> None:
        self.layout = layout
        self.array = layout.template.copy()
        whole = torch.from_numpy(self.array)
        n = layout.n
        views: dict[NestedKey, torch.Tensor] = {}
        bools = [
            (key, offset, n * int(np.prod(shape, dtype=np.int64)), shape)
            for key, (offset, _, dtype, shape) in layout.columns.items()
            if dtype == torch.bool
        ]
        # Bool columns are gathered into the rows of one scratch matrix (each padded to a
        # whole byte of bits) and packed by one packbits; ``_dest``/``_src`` move the
        # packed bytes to the columns' regions of the body in one assignment.
        width = max((-(-w // 8) * 8 for _, _, w, _ in bools), default=0)
        self._bits = torch.zeros([len(bools), width], dtype=torch.bool)
        dest, src = [], []
        for i, (key, offset, w, shape) in enumerate(bools):
            views[key] = self._bits[i, :w].view([n, *shape])
            nbytes = -(-w // 8)
            dest.append(np.arange(offset, offset + nbytes))
            src.append(np.arange(i * (width // 8), i * (width // 8) + nbytes))
        self._dest = np.concatenate(dest) if dest else None
        self._src = np.concatenate(src) if src else None
        for key, (offset, _, dtype, shape) in layout.columns.items():
            if dtype != torch.bool:
                nbytes = n * int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                views[key] = whole[offset : offset + nbytes].view(dtype).view([n, *shape])
        self.out: TensorDictBase = nest(views, n)
        #: ``out`` as its table checked it once (``Table.target``), set by the first sample
        self.target: Any = None
        self._free_refs = self._refs()

    def pack_bools(self) -> None:
        """Write the bool columns gathered into the scratch matrix into the body, as bits."""
        if self._dest is not None:
            packed = np.packbits(self._bits.numpy(), axis=1, bitorder="little")
            self.array[self._dest] = packed.reshape(-1)[self._src]

    def _refs(self) -> int:
        return sys.getrefcount(self.array)

    def is_free(self) -> bool:
        return self._refs() <= self._free_refs

    def lease(self) -> Lease:
        return Lease(self)


class Lease:
    """A :class:`SampleBuffer` in use; the buffer is free again once the lease and its views are gone."""

    __slots__ = ("batch", "body", "buffer", "out")

    def __init__(self, buffer: SampleBuffer) -> None:
        self.buffer = buffer
        self.out = buffer.out
        view = memoryview(buffer.array.data)
        #: the whole Arrow IPC stream (schema, one record batch, end of stream)
        self.body = view
        #: the record-batch message alone (for a stream of batches)
        self.batch = view[buffer.layout.header_len : len(view) - len(EOS)]

    def finish(self) -> None:
        """Pack the gathered bool columns into the body (call after the gather)."""
        self.buffer.pack_bools()


K = TypeVar("K", bound=Hashable)
B = TypeVar("B")


class Pool(Generic[K, B]):
    """Reusable buffers by key: at most ``per_key`` kept per key, ``max_keys`` keys (LRU).

    Not thread safe: use it from the event loop.

    Args:
        is_free: whether a kept buffer may be handed out again.
    """

    def __init__(
        self, is_free: Callable[[B], bool], *, per_key: int = 8, max_keys: int = 16
    ) -> None:
        self._is_free = is_free
        self.per_key = per_key
        self.max_keys = max_keys
        self._kept: OrderedDict[K, list[B]] = OrderedDict()

    def take(self, key: K) -> B | None:
        """A kept buffer for ``key`` that is free, or ``None``."""
        kept = self._kept.get(key)
        if kept is None:
            return None
        self._kept.move_to_end(key)
        for buf in kept:
            if self._is_free(buf):
                return buf
        return None

    def keep(self, key: K, buf: B) -> None:
        """Keep a new buffer for reuse if there is room."""
        kept = self._kept.setdefault(key, [])
        self._kept.move_to_end(key)
        if len(kept) < self.per_key:
            kept.append(buf)
        while len(self._kept) > self.max_keys:
            self._kept.popitem(last=False)


#: bytes of sample info per sampled item (index, priority, weight, times_sampled, key)
INFO_NBYTES = sum(d.itemsize for d in SAMPLE_INFO_DTYPES.values())


def sample_nbytes(item_nbytes: int, n: int) -> int:
    """The data bytes of a sample of ``n`` items: fields and sample info (metadata aside)."""
    return n * (item_nbytes + INFO_NBYTES)


class SampleBuffers:
    """Sample bodies of one table, by batch size (a layout is built once per size).

    Args:
        schema: the table's fields; the bodies carry them and the sample info.
    """

    def __init__(self, schema: Schema, *, per_size: int = 8, max_sizes: int = 16) -> None:
        self.schema = sample_schema(schema)
        self.max_sizes = max_sizes
        self._layouts: OrderedDict[int, SampleLayout] = OrderedDict()
        self._lock = threading.Lock()
        self.pool: Pool[int, SampleBuffer] = Pool(
            SampleBuffer.is_free, per_key=per_size, max_keys=max_sizes
        )

    def layout(self, n: int) -> SampleLayout:
        """The layout of ``n``-row batches (thread safe; builds it the first time)."""
        with self._lock:
            layout = self._layouts.get(n)
            if layout is not None:
                self._layouts.move_to_end(n)
                return layout
        layout = SampleLayout(self.schema, n)
        with self._lock:
            layout = self._layouts.setdefault(n, layout)
            while len(self._layouts) > self.max_sizes:
                self._layouts.popitem(last=False)
        return layout

    async def lease(self, n: int) -> Lease:
        """A body for a sample of ``n`` rows: a free pooled one, or one built in the threadpool."""
        buf = self.pool.take(n)
        if buf is None:
            buf = await run_in_threadpool(lambda: SampleBuffer(self.layout(n)))
            self.pool.keep(n, buf)
        return buf.lease()
