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
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
import pyarrow as pa
import torch
from starlette.concurrency import run_in_threadpool
from tensordict import TensorDictBase

from tdreplay.codec.arrow import nest
from tdreplay.codec.ipc import EOS, SampleLayout, Schema
from tdreplay.storage import SAMPLE_INFO_DTYPES, NestedKey

__all__ = [
    "EOS",
    "INFO_NBYTES",
    "info_nbytes",
    "BufferBudget",
    "Lease",
    "Pool",
    "SampleBuffer",
    "SampleBuffers",
    "sample_nbytes",
    "sample_schema",
]


def sample_schema(schema: Schema, info: Mapping[NestedKey, torch.dtype] | None = None) -> Schema:
    """A sample's columns: the table's fields, then its sample-info columns (one value per
    row): ``info`` (``Table.info_dtypes``: a prioritized table's add ``max_weight``), by
    default those every sample carries."""
    info = SAMPLE_INFO_DTYPES if info is None else info
    return {**schema, **{key: ([], dtype) for key, dtype in info.items()}}


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
            (key, c.offset, n * int(np.prod(c.shape, dtype=np.int64)), c.shape)
            for key, c in layout.columns.items()
            if c.dtype == torch.bool
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
        for key, c in layout.columns.items():
            if c.dtype != torch.bool:
                nbytes = n * int(np.prod(c.shape, dtype=np.int64)) * c.dtype.itemsize
                views[key] = whole[c.offset : c.offset + nbytes].view(c.dtype).view([n, *c.shape])
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


class BufferBudget:
    """Bytes the reused buffers of one server may hold, all pools together (``--pooled-bytes``).

    A pool keeps a buffer only if :meth:`charge` admits its array; one it does
    not keep serves its request and is freed. The bytes return to the budget
    when the array is freed (the pool forgot it and its last view is gone), so
    no release call can be forgotten. Thread safe.

    Args:
        limit: bytes at most; ``None``: no limit.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        #: bytes of the arrays charged and not yet freed
        self.held = 0
        self._lock = threading.Lock()

    def charge(self, array: np.ndarray) -> bool:
        """Count ``array`` until it is freed, if it fits; whether it did."""
        n = array.nbytes
        with self._lock:
            if self.limit is not None and self.held + n > self.limit:
                return False
            self.held += n
        weakref.finalize(array, self._release, n)
        return True

    def _release(self, n: int) -> None:
        with self._lock:
            self.held -= n


class Pooled(Protocol):
    """What a pool keeps: a buffer over one array."""

    array: np.ndarray


K = TypeVar("K", bound=Hashable)
B = TypeVar("B", bound=Pooled)


class Pool(Generic[K, B]):
    """Reusable buffers by key: at most ``per_key`` kept per key, ``max_keys`` keys (LRU), and
    what ``budget`` admits (the least recently used keys are forgotten to make room).

    Not thread safe: use it from the event loop.

    Args:
        is_free: whether a kept buffer may be handed out again.
        on_forget: told of each key forgotten.
    """

    def __init__(
        self,
        is_free: Callable[[B], bool],
        *,
        per_key: int = 8,
        max_keys: int = 16,
        budget: BufferBudget | None = None,
        on_forget: Callable[[K], object] = lambda key: None,
    ) -> None:
        self._is_free = is_free
        self.per_key = per_key
        self.max_keys = max_keys
        self.budget = budget or BufferBudget()
        self._on_forget = on_forget
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

    def touch(self, key: K) -> list[B]:
        """The buffers kept for ``key``, now its most recently used key (a new key one past
        ``max_keys`` forgets the least recently used)."""
        kept = self._kept.get(key)
        if kept is not None:  # the usual case (a layout reused): no list made, nothing to forget
            self._kept.move_to_end(key)
            return kept
        kept = self._kept[key] = []  # a new key comes last: the most recent
        while len(self._kept) > self.max_keys:
            self.forget(next(iter(self._kept)))
        return kept

    def keep(self, key: K, buf: B) -> None:
        """Keep a new buffer for reuse if there is room."""
        kept = self.touch(key)
        if len(kept) < self.per_key and self.make_room(buf.array, key):
            kept.append(buf)

    def make_room(self, array: np.ndarray, key: K) -> bool:
        """Charge ``array`` to the budget, forgetting the least recently used keys but ``key``
        until it fits; whether it did."""
        while not self.budget.charge(array):
            lru = next((k for k in self._kept if k != key), None)
            if lru is None:
                return False
            self.forget(lru)
        return True

    def forget(self, key: K) -> None:
        """Drop the buffers kept for ``key`` (each freed once its last use ends)."""
        self._kept.pop(key, None)
        self._on_forget(key)


def info_nbytes(info: Mapping[NestedKey, torch.dtype]) -> int:
    """Bytes of sample info per sampled item, of the sample-info columns ``info``."""
    return sum(d.itemsize for d in info.values())


#: bytes of sample info per sampled item of every sample (index, priority, weight,
#: times_sampled, key)
INFO_NBYTES = info_nbytes(SAMPLE_INFO_DTYPES)


def sample_nbytes(item_nbytes: int, n: int, info: int = INFO_NBYTES) -> int:
    """The data bytes of a sample of ``n`` items: fields and ``info`` bytes of sample info
    an item (:func:`info_nbytes`), metadata aside."""
    return n * (item_nbytes + info)


def new_layout(schema: Schema, n: int) -> SampleLayout:
    """A :class:`~tdreplay.codec.ipc.SampleLayout`, with the memory its encode used given back.

    The encode's scratch, as big as the layout, comes from Arrow's allocator, which
    keeps freed pages for reuse by the thread that freed them: a worker thread that
    then idles held them (measured: 100 MiB of RSS after four unpooled 32 MiB samples,
    each with its own layout, until that thread allocated again).
    """
    layout = SampleLayout(schema, n)
    pa.default_memory_pool().release_unused()
    return layout


class SampleBuffers:
    """Sample bodies of one table, by batch size (a layout is built once per size).

    Not thread safe: use it from the event loop.

    Args:
        schema: the table's fields; the bodies carry them and the sample info.
        info: the sample-info columns (``Table.info_dtypes``; by default those every
            sample carries): with the fields, :attr:`schema` (:func:`sample_schema`).
        per_size: bodies kept per batch size.
        max_sizes: batch sizes whose layout and bodies are kept (least recently used
            forgotten first).
        budget: the bytes all pools may hold (layouts count too).
    """

    def __init__(
        self,
        schema: Schema,
        info: Mapping[NestedKey, torch.dtype] | None = None,
        per_size: int = 8,
        max_sizes: int = 16,
        budget: BufferBudget | None = None,
    ) -> None:
        #: a sample's columns
        self.schema = sample_schema(schema, info)
        self._info_nbytes = info_nbytes(SAMPLE_INFO_DTYPES if info is None else info)
        #: the layouts kept, by batch size: the pool's keys (forgotten with them)
        self._layouts: dict[int, SampleLayout] = {}
        self.pool: Pool[int, SampleBuffer] = Pool(
            SampleBuffer.is_free,
            per_key=per_size,
            max_keys=max_sizes,
            budget=budget,
            on_forget=lambda n: self._layouts.pop(n, None),
        )

    def nbytes(self, item_nbytes: int, n: int) -> int:
        """The data bytes of a sample of ``n`` items of ``item_nbytes`` bytes of fields each,
        with their sample info (:func:`sample_nbytes`)."""
        return sample_nbytes(item_nbytes, n, self._info_nbytes)

    async def layout(self, n: int) -> SampleLayout:
        """The layout of ``n``-row batches (built in the threadpool the first time)."""
        kept = self._layouts.get(n)
        if kept is None:
            built: SampleLayout = await run_in_threadpool(new_layout, self.schema, n)
            kept = self._layouts.get(n)  # built meanwhile by another call?
            if kept is None:
                if not self.pool.make_room(built.template, n):
                    return built  # used once
                kept = self._layouts[n] = built
        # on every use, not only when kept: a stream's runs use the layout without a pooled
        # body (no ``take``), and this keeps their size the most recent
        self.pool.touch(n)
        return kept

    async def lease(self, n: int) -> Lease:
        """A body for a sample of ``n`` rows: a free pooled one, or one built in the threadpool."""
        buf = self.pool.take(n)
        if buf is None:
            layout = await self.layout(n)
            buf = await run_in_threadpool(SampleBuffer, layout)
            if n in self._layouts:  # a body whose layout is not kept is not kept either
                self.pool.keep(n, buf)
        return buf.lease()
