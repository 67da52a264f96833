"""A prefetching batch iterator for learners, also a torch ``IterableDataset``.

    >>> for batch in client.loader("atari", 256, prefetch=4, device="cuda"):  # doctest: +SKIP
    ...     td_error = learner(batch)              # already on the GPU; |TD error| per item
    ...     client.update_priority("atari", batch["index"], td_error, key=batch["sample_info", "key"])

How it keeps the learner from waiting:

* ``prefetch`` fetcher threads keep up to ``prefetch`` sample requests in
  flight or ready (a credit per batch: taking a batch frees one).

On a fifo or lifo table a sample takes its items out of the queue, so a
batch fetched ahead and never taken (the learner leaves the pass early) is
lost. There ``prefetch`` defaults to 0: no request ahead of the learner, each
``next()`` sends one, and a pass left early has taken exactly the batches the
learner got. An explicit ``prefetch=k`` takes up to ``k`` batches more than
the learner got (``k * batch_size`` items); ``stream=True`` up to the
stream's count: the server samples ahead of the reader, ``num_batches`` (what
is left of it) or, without it, 1024 batches at a time.
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
  waits on the event and the batch's device memory is ``record_stream``-ed on
  it, so the caching allocator will not hand it to another stream early. A
  batch decoded into the pinned buffer goes over as ONE copy of the bytes it
  spans there, its leaves views of that one allocation
  (:meth:`~.staging.StagingBuffer.to_device`): a CUDA call per batch, not
  three per leaf, on each side (``bool`` columns, unpacked apart, still go
  one by one).
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

import time
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from pydantic import Field
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ..codec.params import BatchSize, Count, Params, Seconds, parse
from ..codec.protocol import CONSUMING
from . import errors
from .fetchers import Pipeline, SampleClient
from .staging import StagingBuffer
from .staging import check_device as _check_device
from .tensorclass import check_tensorclass, to_tensorclass


def _identity(batch: Any) -> Any:
    return batch


#: ``prefetch`` where the loader may sample ahead (``None`` on a table that is no queue)
DEFAULT_PREFETCH = 4
#: batches a loader may request ahead at most: each is a thread and a batch held in memory
MAX_PREFETCH = 64


class LoaderParams(Params):
    """A loader's numbers, checked once when it is made: ``batch_size``, ``timeout`` and
    ``num_batches`` by the contract's rules (a sample's size and wait, a stream's count)."""

    batch_size: BatchSize
    timeout: Seconds = None
    num_batches: Count | None = None
    # threads: 2.5 or "4" is a mistake
    prefetch: int | None = Field(ge=0, le=MAX_PREFETCH, strict=True)


class Loader(IterableDataset):
    """Sampled batches of ``table``, ``prefetch`` requests ahead of the learner.

    Args:
        client: a :class:`~tdreplay.client.ReplayClient`.
        table: the table to sample.
        batch_size: items per batch.
        prefetch: batches requested ahead (in flight or ready); 0: none, a request
            per ``next()``; ``None``: 4, or 0 on a fifo or lifo table (one ``info``
            call a pass tells which; see the module's text on what an early exit takes).
        device: where batches go (``"cuda"``: pinned staging and side-stream copies).
        as_cls: a tensorclass to return batches as.
        num_batches: stop after this many batches (``None``: never stop).
        timeout: seconds each sample may wait on the rate limiter (default: the client's).
        keep: CPU batches own their memory instead of borrowing a pool buffer.
        stream: read batches from the server's ``/stream`` route.

    Iterating raises what the client's ``sample`` raises (``RateLimitTimeout``
    when no data comes within ``timeout``, ``EmptyTableError`` when the table holds
    no item then, ...), with ``stream=True`` too; the loader then stops.

    With ``num_batches``, ``len(loader)`` is that number; in the workers of a
    DataLoader each runs its share, so the DataLoader yields ``len(loader)`` batches
    in all (torch trusts an ``IterableDataset``'s ``len`` so).

    Raises:
        InvalidRequest: an argument breaks its rule, named in the message and in
            ``field``: ``batch_size`` (1 to 2**31, the contract's), ``timeout``
            (negative, infinite or NaN), ``num_batches`` (below 1, not a whole
            number), ``prefetch`` (negative, above :data:`MAX_PREFETCH`, not an int).
        ValueError: ``stream=True`` on a sharded client, or with ``prefetch=0``.
        TypeError: ``as_cls`` is not a ``@tensorclass``.
        RuntimeError: ``device`` is a CUDA device this process cannot use (no
            CUDA, or an index past the devices it sees).
    """

    def __init__(
        self,
        client: SampleClient,
        table: str,
        batch_size: int,
        *,
        prefetch: int | None = None,
        device: str | torch.device | None = None,
        as_cls: type | None = None,
        num_batches: int | None = None,
        timeout: float | None = None,
        keep: bool = False,
        stream: bool = False,
    ) -> None:
        args = parse(
            LoaderParams,
            {
                "batch_size": batch_size,
                "timeout": timeout,
                "num_batches": num_batches,
                "prefetch": prefetch,
            },
        )  # the contract's rules, here: the stream skips the plans that check them
        if stream and len(client.urls) > 1:
            raise ValueError("stream=True reads one server; not available on a sharded client")
        if stream and args.prefetch == 0:
            raise ValueError("stream=True samples ahead of the reader: not with prefetch=0")
        self.client = client
        self.table = table
        self.batch_size = args.batch_size
        self.prefetch = args.prefetch
        self.device = _check_device(device)
        self.as_cls = None if as_cls is None else check_tensorclass(as_cls)
        self.num_batches = args.num_batches
        self.timeout = args.timeout
        self.keep = keep
        self.stream = stream

    def __len__(self) -> int:
        """``num_batches``: what a pass yields.

        Raises:
            TypeError: the loader is endless (``num_batches=None``).
        """
        if self.num_batches is None:
            raise TypeError("an endless loader has no len(): pass num_batches for one")
        return self.num_batches

    def __bool__(self) -> bool:
        return True  # not len(): an endless loader is no empty one

    def pass_prefetch(self) -> int:
        """This pass's ``prefetch``: as given, or 0 on a fifo or lifo table, else 4.

        Raises:
            ReplayError: what the table's ``info`` raises (``TableNotFound``, ...).
        """
        if self.prefetch is not None:
            return self.prefetch
        if self.stream:
            return DEFAULT_PREFETCH  # a stream samples ahead whatever the table
        kind = self.client.info(self.table)["sampler"]["kind"]
        return 0 if kind in CONSUMING else DEFAULT_PREFETCH

    def __iter__(self) -> LoaderIterator:
        worker = get_worker_info()
        count = self.num_batches
        if worker is not None and count is not None:  # this worker's share of the batches
            count = count // worker.num_workers + (worker.id < count % worker.num_workers)
        in_worker = worker is not None
        return LoaderIterator(
            self,
            device=None if in_worker else self.device,
            keep=self.keep or in_worker,
            count=count,
        )

    def dataloader(self, num_workers: int = 1, **kwargs: Any) -> DataLoader[Any]:
        """A torch ``DataLoader`` whose ``num_workers`` processes each run this loader.

        Batches pass through unchanged (``batch_size=None``, identity collate:
        torch's default collate would take a TensorDict apart as a mapping).
        The workers share ``num_batches`` between them (each endless without it),
        so ``len()`` of the DataLoader is ``num_batches``. ``pin_memory`` and the
        other keywords go to the DataLoader.
        """
        kwargs.setdefault("collate_fn", _identity)
        return DataLoader(self, batch_size=None, num_workers=num_workers, **kwargs)


class LoaderIterator(Iterator[Any]):
    """One pass of a :class:`Loader`.

    Attributes:
        batches: batches handed to the learner so far.
        wait_s: total seconds the learner spent waiting in ``next()``.
    """

    def __init__(
        self, loader: Loader, *, device: torch.device | None, keep: bool, count: int | None
    ) -> None:
        self.loader = loader
        self.count = count
        self.batches = 0
        self.wait_s = 0.0
        self._held: StagingBuffer | None = None
        self._failed: errors.ReplayError | None = None
        try:
            prefetch = loader.pass_prefetch()
        except errors.ReplayError as err:  # the first next() raises it, as a sample's
            prefetch, self._failed = 0, err  # (no request ahead: none is sent)
        self._pipe = Pipeline(loader, device=device, keep=keep, count=count, prefetch=prefetch)
        self._finalizer = weakref.finalize(self, self._pipe.close)

    def __next__(self) -> Any:
        pipe = self._pipe
        if self._held is not None:  # the learner is done with the previous batch
            pipe.give_back(self._held)
            self._held = None
        n = self.count
        if pipe.closed or (n is not None and self.batches >= n):
            self.close()
            raise StopIteration
        if self._failed is not None:
            failed, self._failed = self._failed, None
            self.close()
            raise failed
        t0 = time.perf_counter()
        batch, extra = pipe.get()
        self.wait_s += time.perf_counter() - t0
        if isinstance(batch, BaseException):
            self.close()
            raise batch
        if pipe.cuda:
            event, owners = extra
            current = torch.cuda.current_stream(pipe.device)
            current.wait_event(event)  # the copy made on the fetcher's stream is done first
            # made on the side stream, used on this one: the one copy (and leaves decoded
            # apart), or each leaf
            for t in owners if owners is not None else batch.values(True, True):
                t.record_stream(current)
        elif isinstance(extra, StagingBuffer):
            self._held = extra
        self.batches += 1
        cls = self.loader.as_cls
        return to_tensorclass(batch, cls) if cls is not None else batch

    def close(self) -> None:
        """Stop the fetchers; also done when the iterator is garbage collected."""
        self._finalizer()
