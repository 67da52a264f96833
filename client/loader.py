"""A prefetching batch iterator for learners, also a torch ``IterableDataset``.

    >>> for batch in client.loader("cartpole", 256, prefetch=4, device="cuda"):  # doctest: +SKIP
    ...     loss = learner(batch)                  # already on the GPU
    ...     client.update_priority("cartpole", batch["index"], td_error, key=batch["sample_info", "key"])

How it keeps the learner from waiting:

* ``prefetch`` fetcher threads keep up to ``prefetch`` sample requests in
  flight or ready (a credit per batch: taking a batch frees one).
* Each answer is received (``readinto``) into one of a small pool of reused
  buffers and decoded in place — the tensors are views on the buffer, no
  fresh allocation per batch. Over shm a buffer keeps its column views
  (:meth:`~.staging.StagingBuffer.kept`): a batch is one copy out of the
  slot and a new TensorDict of the same tensors each time the buffer comes
  round, since a torch call per column, each handing the GIL over, made
  four fetchers half as fast.
* CUDA: the pool is pinned host memory. The fetcher copies the batch to the
  device with ``non_blocking=True`` on its own side stream and records an
  event; the buffer is reused only after that event (the fetcher waits on it,
  never the learner). When the learner takes the batch, its current stream
  waits on the event and every tensor is ``record_stream``-ed on it, so the
  caching allocator will not hand the memory to another stream early.
* CPU (``keep=False``, the default): a batch is a view on a pool buffer and
  stays valid until the *next* batch is taken; clone what must outlive it,
  or pass ``keep=True`` for batches that own their memory (one allocation
  each). CUDA batches always own their device memory.

A CUDA ``device`` this process cannot use is refused when the loader is
made. The fetchers are daemon threads, stopped and joined (up to 5 s in all)
when the interpreter exits, before torch is torn down: a learner may end
without closing its loader.

Sharded clients fetch each batch from several servers and concatenate the
parts (one copy). ``stream=True`` uses the server's ``/stream`` route instead
of one request per batch: one long answer carrying many record batches,
which suits small batches (fewer round trips), at one allocation per batch.

In DataLoader workers (``loader.dataloader(num_workers=k)``, which sets
``batch_size=None`` and an identity collate) each worker's copy of the client
reconnects from its pickled settings; batches are CPU tensors that own their
memory (the DataLoader pins and moves them itself).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol

import torch
from tensordict import TensorDictBase
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..codec.params import seconds
from . import commands as C
from . import errors, exiting, shm
from .batches import decode_batch
from .plans import ClientSettings
from .staging import Credits as _Credits
from .staging import StagingBuffer
from .staging import check_device as _check_device
from .streams import one_batch_streams
from .tensorclass import to_tensorclass
from .transport import Transport


class SampleClient(Protocol):
    """What a :class:`Loader` needs of its client: :class:`~tdreplay.client.ReplayClient`.

    Named here so that this module imports neither twin (each builds its
    loader here); a blocking client, since the fetchers are threads.
    """

    settings: ClientSettings
    _transports: list[Transport]

    @property
    def urls(self) -> tuple[str, ...]: ...

    def _sample_into(
        self, table: str, batch_size: int, timeout: float | None, alloc: C.Alloc
    ) -> TensorDictBase: ...


def _identity(batch: Any) -> Any:
    return batch


class Loader(IterableDataset):
    """Sampled batches of ``table``, ``prefetch`` requests ahead of the learner.

    Args:
        client: a :class:`~tdreplay.client.ReplayClient`.
        table: the table to sample.
        batch_size: items per batch.
        prefetch: batches requested ahead (in flight or ready), >= 1.
        device: where batches go (``"cuda"``: pinned staging and side-stream copies).
        as_cls: a tensorclass to return batches as.
        num_batches: stop after this many batches (``None``: never stop).
        timeout: seconds each sample may wait on the rate limiter (default: the client's).
        keep: CPU batches own their memory instead of borrowing a pool buffer.
        stream: read batches from the server's ``/stream`` route.

    Iterating raises what the client's ``sample`` raises (``RateLimitTimeout``
    when no data comes within ``timeout``, ...); the loader then stops.

    Raises:
        ValueError: ``prefetch`` or ``batch_size`` below 1; ``stream=True`` on a
            sharded client.
        InvalidRequest: ``timeout`` negative, infinite or NaN (the contract's rule).
        RuntimeError: ``device`` is a CUDA device this process cannot use (no
            CUDA, or an index past the devices it sees).
    """

    def __init__(
        self,
        client: SampleClient,
        table: str,
        batch_size: int,
        *,
        prefetch: int = 4,
        device: str | torch.device | None = None,
        as_cls: type | None = None,
        num_batches: int | None = None,
        timeout: float | None = None,
        keep: bool = False,
        stream: bool = False,
    ) -> None:
        if prefetch < 1:
            raise ValueError(f"prefetch must be >= 1, got {prefetch}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if stream and len(client.urls) > 1:
            raise ValueError("stream=True reads one server; not available on a sharded client")
        self.client = client
        self.table = table
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.device = _check_device(device)
        self.as_cls = as_cls
        self.num_batches = num_batches
        self.timeout = seconds(timeout)  # the contract's rule, here: the stream skips the plans
        self.keep = keep
        self.stream = stream

    def __iter__(self) -> LoaderIterator:
        in_worker = get_worker_info() is not None
        return LoaderIterator(
            self, device=None if in_worker else self.device, keep=self.keep or in_worker
        )

    def dataloader(self, num_workers: int = 1, **kwargs: Any) -> DataLoader[Any]:
        """A torch ``DataLoader`` whose ``num_workers`` processes each run this loader.

        Batches pass through unchanged (``batch_size=None``, identity collate:
        torch's default collate would take a TensorDict apart as a mapping).
        Each worker yields ``num_batches`` batches (all: endless). ``pin_memory``
        and the other keywords go to the DataLoader.
        """
        kwargs.setdefault("collate_fn", _identity)
        return DataLoader(self, batch_size=None, num_workers=num_workers, **kwargs)


class _Pipeline:
    """The fetching side of one pass: fetcher threads, the buffer pool, the queues.

    Kept apart from :class:`LoaderIterator` so that the threads hold no
    reference to the iterator: a learner that drops it (``break`` out of a
    ``for`` loop) gets it collected, and its finalizer stops the threads.
    """

    def __init__(self, loader: Loader, *, device: torch.device | None, keep: bool) -> None:
        self.loader = loader
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        self.keep = keep and not self.cuda
        self._ready: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._free: queue.Queue[StagingBuffer] = queue.Queue()
        wake = max(1, loader.prefetch // 2) if loader.stream else 1
        self._credits = _Credits(loader.prefetch, wake=wake)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._issued = 0
        self.closed = False
        if not self.keep and not loader.stream:
            for _ in range(loader.prefetch + 1):
                self._free.put(StagingBuffer(pinned=self.cuda))
        n_threads = 1 if loader.stream else loader.prefetch
        target = self._stream_fetcher if loader.stream else self._fetcher
        self.threads = [
            threading.Thread(target=target, args=(i,), daemon=True, name=f"tdreplay-loader-{i}")
            for i in range(n_threads)
        ]
        exiting.track(self)
        for t in self.threads:
            t.start()

    # ---------------------------------------------------------------- fetchers
    def _claim(self) -> bool:
        """Take a credit and count one more batch; False when the pass is over."""
        self._credits.acquire()
        if self._stop.is_set():
            return False
        with self._lock:
            n = self.loader.num_batches
            if n is not None and self._issued >= n:
                return False
            self._issued += 1
        return True

    def _fetcher(self, i: int) -> None:
        loader = self.loader
        shm.background_thread()  # prefetching: no one waits on its calls
        try:
            # in the try: whatever fails here reaches the learner, who would wait forever else
            stream = torch.cuda.Stream(self.device) if self.cuda else None
            while self._claim():
                slot: StagingBuffer | None = None
                alloc = C.fresh
                if not self.keep:
                    slot = self._free.get()
                    slot.reset()
                    alloc = slot  # an Alloc that keeps what is built on its pieces
                td = loader.client._sample_into(
                    loader.table, loader.batch_size, loader.timeout, alloc
                )
                self._ready.put(self._stage(td, slot, stream))
        except BaseException as err:
            self._ready.put((err, None))
            self._stop.set()

    def _stream_fetcher(self, i: int) -> None:
        loader = self.loader
        wait = loader.client.settings.wait if loader.timeout is None else loader.timeout
        received = 0
        try:
            stream = torch.cuda.Stream(self.device) if self.cuda else None
            transport = loader.client._transports[0]
            while not self._stop.is_set():
                # a stream asks for no more than the pass still takes: the server samples
                # ahead of the reader, and what it sampled counts (a fifo table's is gone)
                n = loader.num_batches
                count = 1024 if n is None else n - received
                if count <= 0:
                    return
                cmd = C.Stream(loader.table, loader.batch_size, count, wait)
                with transport.open_stream(cmd.request()) as chunks:
                    got = 0
                    try:
                        for body in one_batch_streams(chunks):
                            got += 1
                            received += 1
                            td = decode_batch(body)  # sliced at the layout's offsets
                            if not self._claim():
                                return
                            self._ready.put(self._stage(td, None, stream))
                    except ValueError as err:
                        raise errors.ProtocolError(f"bad sample stream: {err}") from None
                if got == 0:  # the server ends a stream early when a sample times out
                    raise errors.RateLimitTimeout(
                        f"table {loader.table!r}: no batch within {wait:g}s on the stream",
                        status=429,
                        table=loader.table,
                    )
        except BaseException as err:
            self._ready.put((err, None))
            self._stop.set()

    def _stage(
        self, td: TensorDictBase, slot: StagingBuffer | None, stream: Any
    ) -> tuple[Any, Any]:
        """Move ``td`` toward the learner's device; returns the queue item ``(batch, slot|event)``."""
        if self.cuda:
            with torch.cuda.stream(stream):
                out = td.to(self.device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
            if slot is not None:
                slot.event = event  # reset() waits on it before the buffer is refilled
                self._free.put(slot)
            return out, event
        if self.device is not None and self.device.type != "cpu":
            if slot is not None:
                self._free.put(slot)
            return td.to(self.device), None
        return td, slot

    # ---------------------------------------------------------------- hand-over
    def get(self) -> tuple[Any, Any]:
        """The next ``(batch, slot | event)``, or ``(exception, None)``; frees a credit."""
        item = self._ready.get()
        self._credits.release()
        return item

    def give_back(self, slot: StagingBuffer) -> None:
        self._free.put(slot)

    def close(self) -> None:
        """Stop the fetchers (a request in flight finishes within its timeout); ``get()`` ends."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        self._credits.open()
        # wakes a learner blocked in get() (an iterator closed from another thread, or at exit)
        self._ready.put((StopIteration(), None))


class LoaderIterator(Iterator[Any]):
    """One pass of a :class:`Loader`.

    Attributes:
        batches: batches handed to the learner so far.
        wait_s: total seconds the learner spent waiting in ``next()``.
    """

    def __init__(self, loader: Loader, *, device: torch.device | None, keep: bool) -> None:
        self.loader = loader
        self.batches = 0
        self.wait_s = 0.0
        self._held: StagingBuffer | None = None
        self._pipe = _Pipeline(loader, device=device, keep=keep)
        self._finalizer = weakref.finalize(self, self._pipe.close)

    def __next__(self) -> Any:
        pipe = self._pipe
        if self._held is not None:  # the learner is done with the previous batch
            pipe.give_back(self._held)
            self._held = None
        n = self.loader.num_batches
        if pipe.closed or (n is not None and self.batches >= n):
            self.close()
            raise StopIteration
        t0 = time.perf_counter()
        batch, extra = pipe.get()
        self.wait_s += time.perf_counter() - t0
        if isinstance(batch, BaseException):
            self.close()
            raise batch
        if pipe.cuda:
            current = torch.cuda.current_stream(pipe.device)
            current.wait_event(extra)  # the copy made on the fetcher's stream is done first
            for t in batch.values(include_nested=True, leaves_only=True):
                t.record_stream(current)  # made on the side stream, used on this one
        elif isinstance(extra, StagingBuffer):
            self._held = extra
        self.batches += 1
        cls = self.loader.as_cls
        return to_tensorclass(batch, cls) if cls is not None else batch

    def close(self) -> None:
        """Stop the fetchers; also done when the iterator is garbage collected."""
        self._finalizer()


_DONE = object()


def _next(it: LoaderIterator) -> Any:
    try:
        return next(it)
    except StopIteration:
        return _DONE


class AsyncLoader:
    """An async iterator over a :class:`Loader`'s batches."""

    def __init__(self, loader: Loader) -> None:
        self.loader = loader

    async def __aiter__(self) -> AsyncIterator[Any]:
        it = iter(self.loader)
        try:
            while True:
                batch = await asyncio.to_thread(_next, it)
                if batch is _DONE:
                    return
                yield batch
        finally:
            it.close()
