"""The fetching side of a loader's pass: fetcher threads, the buffer pool, the queues.

See :mod:`~tdreplay.client.loader` for how the pieces keep the learner from
waiting; this module is the threads' side of it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Protocol

import torch
from tensordict import TensorDictBase

from . import commands as C
from . import errors, exiting, shm
from .batches import decode_batch
from .driving import BlockingDriver
from .settings import ClientSettings
from .staging import Credits as _Credits
from .staging import StagingBuffer
from .streams import one_batch_streams


class SampleClient(Protocol):
    """What a :class:`Loader` needs of its client: :class:`~tdreplay.client.ReplayClient`.

    Named here so that the loader imports neither twin (each builds its
    loader there); a blocking client, since the fetchers are threads.
    """

    settings: ClientSettings
    _driver: BlockingDriver

    @property
    def urls(self) -> tuple[str, ...]: ...

    def info(self, table: str) -> dict[str, Any]: ...

    def _sample_into(
        self, table: str, batch_size: int, timeout: float | None, alloc: C.Alloc
    ) -> TensorDictBase: ...


class LoaderLike(Protocol):
    """What a :class:`Pipeline` reads of its :class:`~tdreplay.client.loader.Loader`."""

    client: SampleClient
    table: str
    batch_size: int
    timeout: float | None
    stream: bool


class Pipeline:
    """The fetching side of one pass: fetcher threads, the buffer pool, the queues.

    Kept apart from :class:`LoaderIterator` so that the threads hold no
    reference to the iterator: a learner that drops it (``break`` out of a
    ``for`` loop) gets it collected, and its finalizer stops the threads.
    """

    def __init__(
        self,
        loader: LoaderLike,
        *,
        device: torch.device | None,
        keep: bool,
        count: int | None,
        prefetch: int,
    ) -> None:
        self.loader = loader
        self.count = count
        self.prefetch = prefetch  # 0: a request only when the learner asks (see get())
        self.device = device
        self.cuda = device is not None and device.type == "cuda"
        self.keep = keep and not self.cuda
        self._ready: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self._free: queue.Queue[StagingBuffer] = queue.Queue()
        wake = max(1, prefetch // 2) if loader.stream else 1
        self._credits = _Credits(prefetch, wake=wake)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._issued = 0
        self._slot: StagingBuffer | None = None  # the stream fetcher's, for its batch in hand
        self.closed = False
        if self.cuda or not (self.keep or loader.stream):  # a stream's batches own their memory
            for _ in range(prefetch + 1):
                self._free.put(StagingBuffer(pinned=self.cuda))
        n_threads = 1 if loader.stream else max(1, prefetch)
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
            n = self.count
            if n is not None and self._issued >= n:
                return False
            self._issued += 1
        return True

    def _fetcher(self, i: int) -> None:
        loader = self.loader
        if self.prefetch:
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
            transport = loader.client._driver.transports[0]
            while not self._stop.is_set():
                # a stream asks for no more than the pass still takes: the server samples
                # ahead of the reader, and what it sampled counts (a fifo table's is gone)
                n = self.count
                count = 1024 if n is None else n - received
                if count <= 0:
                    return
                cmd = C.Stream(loader.table, loader.batch_size, count, wait)
                with transport.open_stream(cmd.request()) as chunks:
                    got = 0
                    try:
                        for body in one_batch_streams(
                            chunks, self._pinned if self.cuda else C.fresh
                        ):
                            got += 1
                            received += 1
                            td = decode_batch(body)  # sliced at the layout's offsets
                            if not self._claim():
                                return
                            self._ready.put(self._stage(td, self._slot, stream))
                            self._slot = None
                    except ValueError as err:
                        raise errors.ProtocolError(f"bad sample stream: {err}") from None
                if got == 0:
                    # a stream's first sample is drawn before its answer starts: one that
                    # cannot be drawn is the server's error (EmptyTableError on an empty
                    # table, RateLimitTimeout), decided where a sample's is, never here
                    raise errors.ProtocolError(
                        f"table {loader.table!r}: a sample stream answered without a batch"
                    )
        except BaseException as err:
            self._ready.put((err, None))
            self._stop.set()

    def _pinned(self, n: int) -> memoryview:
        """``n`` bytes of a pinned buffer from the pool for the stream's next batch (its
        copy to the device is then ``non_blocking`` indeed: from pageable memory it would
        hold the GIL, and the learner, for the whole copy)."""
        slot = self._slot = self._free.get()
        slot.reset()
        return slot.alloc(n)

    def _stage(
        self, td: TensorDictBase, slot: StagingBuffer | None, stream: Any
    ) -> tuple[Any, Any]:
        """Move ``td`` toward the learner's device; returns the queue item: ``(batch, slot)``,
        or on CUDA ``(batch, (event, owners))``: the copy's event, and the device tensors
        that own the batch's memory (:meth:`~.staging.StagingBuffer.to_device`), or None
        when the leaves were copied one by one."""
        if self.cuda and self.device is not None:
            with torch.cuda.stream(stream):
                moved = slot.to_device(td, self.device) if slot is not None else None
                out, owners = (
                    moved if moved is not None else (td.to(self.device, non_blocking=True), None)
                )
                event = torch.cuda.Event()
                event.record(stream)
            if slot is not None:
                slot.event = event  # reset() waits on it before the buffer is refilled
                self._free.put(slot)
            return out, (event, owners)
        if self.device is not None and self.device.type != "cpu":
            if slot is not None:
                self._free.put(slot)
            return td.to(self.device), None
        return td, slot

    # ---------------------------------------------------------------- hand-over
    def get(self) -> tuple[Any, Any]:
        """The next ``(batch, slot | event)``, or ``(exception, None)``; frees a credit:
        after the hand-over (the fetchers keep ``prefetch`` ahead), or, with
        ``prefetch=0``, before it (the one request this batch needs)."""
        if self.prefetch == 0:
            self._credits.release()
        item = self._ready.get()
        if self.prefetch:
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
